"""A forgotten user's text leaves the running process too: the caches keyed by text (recall's
term and answer-type functions, the token counter, the embedder's recent queries, the keyword
index's term counts) hold none of it after ``forget_user``, ``forget``, ``clear_session``,
``delete_fact``, ``delete_episode``, a working memory's ``forget`` and ``clear`` or a
``consolidate`` that deletes raw turns (the LangGraph store's deletes: the sibling
``test_forget_process_memory_items.py``), and the exact scan keeps no vector of a forgotten
message. The caches are found by walking the objects reachable from every ``lru_cache`` of the
package's modules, the memory's token counter, its embedder and its record store, so a cache
added later without registering in ``tiered_memory.textcache`` is found as well."""

from __future__ import annotations

import gc
import sys
import time
import types
from typing import Callable, Iterable

import numpy as np
import pytest

from tiered_memory import ConsolidationConfig, MemoryConfig, TieredMemory
from tiered_memory.testing import ScriptedLLM
from tiered_memory.vector.exact import ExactScan

# words no other test writes, each in one user's message, fact or query
ANA = ("Quizzlewhorp", "Zanzibarbizarre", "Flobbertongue", "Snorklewacket")
BO = "Gribbleflunkmoss"
EP_WORD, FACT_WORD, WM_WORD, RAW_WORD = "Wumblequorfest", "Plinkertoadle", "Skronglewimbit", "Frabjuxwallow"
EPISODE = {"summary": "Talked.", "entities": [], "decisions": [], "open_questions": [], "key_facts": []}
SKIPPED = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.CodeType,
           types.FrameType)


def strings_held(roots: Iterable[object]) -> set[str]:
    """Every str reachable from ``roots`` through Python objects (modules, classes and plain
    functions are not followed: their globals are the whole package)."""
    seen: set[int] = set()
    found: set[str] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, SKIPPED):
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            found.add(obj)
            continue
        if isinstance(obj, dict):
            stack.extend(obj)  # a dict whose keys are all str does not show them to the gc
        stack.extend(gc.get_referents(obj))
    return found


def package_caches() -> list[object]:
    return [obj for name, module in list(sys.modules.items()) if name.startswith("tiered_memory")
            for obj in vars(module).values() if hasattr(obj, "cache_clear") and hasattr(obj, "cache_info")]


def held(memory: TieredMemory, words: Iterable[str]) -> set[str]:
    texts = strings_held([*package_caches(), memory.count_tokens, memory.embedder, memory.store])
    return {w for w in words if any(w.lower() in t.lower() for t in texts)}


def fill_caches(memory: TieredMemory) -> None:
    memory.add_many([
        {"role": "user", "content": f"My cat {ANA[0]} was born in 2019 in Paris"},
        {"role": "assistant", "content": f"What a lovely name! Does {ANA[0]} like {ANA[1]}?"},
        {"role": "user", "content": f"Yes, and {ANA[2]} too, three times a day."}], user_id="ana", session_id="s1")
    memory.add("user", f"Bo here: my dog {BO} lives in Rome", user_id="bo", session_id="s1")
    for user, query in (("ana", f"how many times does {ANA[0]} eat {ANA[3]}?"), ("ana", "where was my cat born?"),
                        ("bo", f"where does {BO} live?")):
        memory.search(query, user_id=user, k=5)
        memory.build_context(query, user_id=user, session_id="s1", max_tokens=500)


def test_forget_user_leaves_none_of_the_users_text_in_any_cache(memory: TieredMemory) -> None:
    fill_caches(memory)
    assert held(memory, ANA) == set(ANA) and held(memory, [BO]) == {BO}  # the caches did hold them
    memory.forget_user("ana")
    assert held(memory, ANA) == set()
    assert memory.search(f"where does {BO} live?", user_id="bo", k=1)[0].text.startswith("Bo here")


def test_forget_and_clear_session_leave_none_of_the_texts_in_any_cache(memory: TieredMemory) -> None:
    fill_caches(memory)
    memory.clear_session("s1", user_id="ana")
    assert held(memory, ANA) == set()
    memory.search(f"where does {BO} live?", user_id="bo", k=1)
    ids = memory.add("user", f"one more about {ANA[0]}", user_id="bo", session_id="s2")
    memory.search(f"what about {ANA[0]}?", user_id="bo", k=3)
    assert held(memory, [ANA[0]]) == {ANA[0]}
    memory.forget(ids, user_id="bo")
    assert held(memory, [ANA[0]]) == set()


def test_delete_fact_leaves_none_of_its_text_in_any_cache(memory: TieredMemory) -> None:
    fact = memory.add_fact(f"User collects {FACT_WORD} stamps", user_id="ana")
    memory.build_context("what does the user collect?", user_id="ana", session_id="s1")
    assert held(memory, [FACT_WORD]) == {FACT_WORD}  # counted for the context
    memory.delete_fact(fact.id, user_id="ana")
    assert held(memory, [FACT_WORD]) == set()


def test_delete_episode_leaves_none_of_its_text_in_any_cache(make_memory: Callable[..., TieredMemory]) -> None:
    # the episode's summary holds a word its turns do not: only the episode can put it in a cache
    llm = ScriptedLLM(by_task={"facts": [{"facts": []}], "episode": [{**EPISODE, "summary": f"Planned {EP_WORD}."}]})
    memory = make_memory(llm=llm)
    memory.add("user", "Let us plan the garden party", user_id="ana", session_id="s1")
    episode = memory.end_session("s1", user_id="ana")
    memory.build_context("what does the user plan?", user_id="ana", session_id="s2")
    assert held(memory, [EP_WORD]) == {EP_WORD}
    memory.delete_episode(episode.id, user_id="ana")
    assert held(memory, [EP_WORD]) == set()


@pytest.mark.parametrize("remove", ["forget", "clear"])
def test_removing_working_memory_leaves_none_of_its_text_in_any_cache(memory: TieredMemory, remove: str) -> None:
    wm = memory.working_memory("s1", user_id="ana")
    item = wm.remember(f"the user is repainting the {WM_WORD} shed", importance=0.9)
    memory.build_context("what is the user doing?", user_id="ana", session_id="s1")
    assert held(memory, [WM_WORD]) == {WM_WORD}
    assert wm.forget(item.id) if remove == "forget" else wm.clear() == 1
    assert held(memory, [WM_WORD]) == set()


def test_consolidate_deleting_raw_turns_leaves_none_of_their_text_in_any_cache(
        make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={"facts": [{"facts": []}], "episode": [EPISODE]})  # the summary lacks the word
    memory = make_memory(llm=llm, config=MemoryConfig(consolidation=ConsolidationConfig(delete_raw=True)))
    long_ago = time.time() - 90 * 86400
    memory.add_many([{"role": "user", "content": f"My parrot {RAW_WORD} speaks French", "timestamp": long_ago}],
                    user_id="ana", session_id="s1")
    memory.search("what does my parrot speak?", user_id="ana", k=3)
    assert held(memory, [RAW_WORD]) == {RAW_WORD}
    assert memory.consolidate("ana").archived_messages == 1  # deleted, not archived (delete_raw)
    assert memory.get_messages("s1", user_id="ana") == []
    assert held(memory, [RAW_WORD]) == set()


def test_the_exact_scan_keeps_no_vector_of_a_forgotten_message() -> None:
    vectors = np.eye(3, dtype=np.float32)
    scan = ExactScan(lambda user, limit: (["a", "b", "c"], vectors.copy(), ["turn"] * 3, ["s"] * 3))
    assert scan.ready("u", wait=True)
    assert rows_held(scan, vectors[1]) == 1
    scan.delete(["b"])
    assert rows_held(scan, vectors[1]) == 0  # zeroed, not only marked dead
    assert [i for i, _ in scan.query("u", vectors, k=3)[0]] == ["a", "c"]


def rows_held(root: object, vector: np.ndarray) -> int:
    """Rows equal to ``vector`` in the arrays reachable from ``root``."""
    seen: set[int] = set()
    stack, count = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, SKIPPED):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            if obj.ndim == 2 and obj.shape[1] == len(vector):
                count += int((obj == vector).all(axis=1).sum())
            continue
        stack.extend(gc.get_referents(obj))
    return count


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    return make_memory()
