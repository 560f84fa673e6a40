"""The LLM-free episode rules on chat that is not English prose (pure): sentences end at the
marks of each script, a sentence's first word is a name only where the text reads as English,
names are found in any alphabet, and a clipped quote or a cut context item never splits a
character a reader sees as one (an emoji sequence, a flag, a letter and its accent)."""

from __future__ import annotations

import pytest

from tiered_memory.context.render import CUT_MARKER, cut_to_tokens
from tiered_memory.layers.extractive import clip, extract_episode, find_entities, sentences
from tiered_memory.tokens import heuristic_count
from tiered_memory.types import StoredMessage


def session(*texts: str) -> list[StoredMessage]:
    return [StoredMessage(id=f"m{n}", user_id="u", session_id="s", role="user", timestamp=float(n), content=t)
            for n, t in enumerate(texts)]


@pytest.mark.parametrize("text, expected", [
    ("我喜欢爵士乐。我住在北京！你呢？", ["我喜欢爵士乐。", "我住在北京！", "你呢？"]),
    ("京都に行きました。とても楽しかった！", ["京都に行きました。", "とても楽しかった！"]),
    ("Привет. Как дела? Всё хорошо!", ["Привет.", "Как дела?", "Всё хорошо!"]),
    ("Γεια σου. Πώς είσαι;", ["Γεια σου.", "Πώς είσαι;"]),
    ("سأسافر غداً. هل تأتي معي؟ نعم", ["سأسافر غداً.", "هل تأتي معي؟", "نعم"]),
    ("मैं घर जा रहा हूँ। कल मिलते हैं।", ["मैं घर जा रहा हूँ।", "कल मिलते हैं।"]),
    ("Hola. ¿Cómo estás? ¡Muy bien!", ["Hola.", "¿Cómo estás?", "¡Muy bien!"]),
    # as before: English sentences, and a mark inside one (e.g., an abbreviation) is no end
    ("I moved. Then I left! Did you?", ["I moved.", "Then I left!", "Did you?"]),
    ("See e.g. this one. Ok", ["See e.g. this one.", "Ok"]),
    ("Das ist z.B. gut. Ja", ["Das ist z.B. gut.", "Ja"]),
])
def test_sentences_end_at_each_scripts_marks(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


def test_a_chinese_session_is_summarised_by_its_sentences_not_as_one_paste() -> None:
    said = ["我下个月要去北京出差。然后去上海见客户。客户想讨论新的合同。我们决定下周二开会。"
            "北京的天气很冷。上海的客户很重要。合同的价格还没确定。" * 3]
    ep = extract_episode(session(*said), max_summary_sentences=2)
    assert len(ep.summary) < 60 and not ep.summary.endswith("\u2026"), ep.summary  # whole sentences, not a clip
    assert all(s in said[0] for s in sentences(ep.summary))


@pytest.mark.parametrize("text, names", [
    # a sentence's first word is no name in a text that does not read as English
    ("Wir waren gestern in Berlin bei Anna. Heute fahren wir nach Hamburg.", ["Berlin", "Anna", "Hamburg"]),
    ("Hoy fui a la playa con Carmen. Mañana vamos a Sevilla.", ["Carmen", "Sevilla"]),
    # names in other alphabets and with letters beyond ASCII
    ("Вчера я встретил Ивана в Москве.", ["Ивана", "Москве"]),
    ("We had lunch with Jürgen Müller in Zürich.", ["Jürgen Müller", "Zürich"]),
    # as before in English: a name that starts a sentence is a name
    ("Caroline went to the park with Melanie. Boston was cold.", ["Caroline", "Melanie", "Boston"]),
])
def test_entities_in_other_languages_and_alphabets(text: str, names: list[str]) -> None:
    assert find_entities(text) == names


FAMILY = "\U0001F468\u200d\U0001F469\u200d\U0001F467"  # one emoji of five code points
FLAG = "\U0001F1EF\U0001F1F5"
ACCENTED = "e\u0301"
CONJUNCT = "\u0915\u094d\u0937"  # Devanagari ksha: a consonant, the virama and a consonant, one letter to a reader


@pytest.mark.parametrize("unit", [FAMILY, FLAG, ACCENTED, CONJUNCT, "\U0001F44D\U0001F3FD", "\u2764\ufe0f"])
def test_clip_never_splits_what_a_reader_sees_as_one_character(unit: str) -> None:
    for limit in range(2, 40):
        head = clip(unit * 50, limit)
        assert head.endswith("\u2026") and len(head) <= limit
        body = head[:-1]
        assert body == unit * (len(body) // len(unit)), (limit, ascii(head))


@pytest.mark.parametrize("unit", [FAMILY, FLAG, ACCENTED, CONJUNCT])
def test_a_context_item_cut_to_its_budget_keeps_whole_characters(unit: str) -> None:
    for budget in range(17, 60):
        cut = cut_to_tokens(unit * 60, budget, heuristic_count)
        assert cut is not None and cut.endswith(CUT_MARKER.strip())
        body = cut[:-len(CUT_MARKER)]
        assert body == unit * (len(body) // len(unit)), (budget, ascii(cut))
