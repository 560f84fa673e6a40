"""Working memory: decay, capacity eviction, relevance ranking, scratchpad."""

from __future__ import annotations

import json
import time
from typing import Callable

import pytest

from tiered_memory import ContentTooLargeError, InvalidInputError, MemoryConfig, TieredMemory
from tiered_memory.config import WorkingConfig
from tiered_memory.layers.working import WorkingItem, check_pad_entry, check_pad_growth, decayed, evict, rank

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

H = 3600.0


@pytest.mark.parametrize("importance, age_h, rate, expected", [
    (1.0, 0, 0.1, 1.0),
    (1.0, 1, 0.1, 0.9),
    (0.5, 2, 0.5, 0.125),
    (0.8, 10, 0.0, 0.8),    # no decay
    (0.8, -5, 0.1, 0.8),    # a future timestamp does not grow
    (0.8, 1, 1.0, 0.0),     # full decay in an hour
    (0.8, 1, 1.5, 0.0),     # a rate over 1 is full decay, never a negative importance
])
def test_decayed(importance: float, age_h: float, rate: float, expected: float) -> None:
    assert decayed(importance, 1000.0 - age_h * H, 1000.0, rate) == pytest.approx(expected)


def _item(i: str, importance: float, age_h: float, now: float = 100 * H) -> WorkingItem:
    return WorkingItem(id=i, user_id="u", session_id="s", text=i, importance=importance, created_at=now - age_h * H)


@pytest.mark.parametrize("items, capacity, kept, evicted", [
    ([_item("a", 0.9, 0), _item("b", 0.1, 0), _item("c", 0.5, 0)], 2, ["a", "c"], ["b"]),
    # an important but old item decays below a fresh middling one
    ([_item("old", 0.9, 48), _item("new", 0.4, 0)], 1, ["new"], ["old"]),
    ([_item("a", 0.5, 0), _item("b", 0.5, 1)], 1, ["a"], ["b"]),  # equal importance: the older decayed more
    ([_item("a", 0.5, 0)], 0, [], ["a"]),
    ([_item("a", 0.9, 0), _item("b", 0.1, 0)], -1, [], ["a", "b"]),  # a negative capacity holds nothing
    ([], 3, [], []),
])
def test_evict(items: list[WorkingItem], capacity: int, kept: list[str], evicted: list[str]) -> None:
    k, e = evict(items, capacity, 100 * H, 0.05)
    assert [i.id for i in k] == kept and [i.id for i in e] == evicted


def test_ties_in_decayed_importance_go_to_the_newer_item() -> None:
    """Without decay, equal importance is a true tie: the newer item is kept and ranked first."""
    items = [_item("older", 0.5, 2), _item("newer", 0.5, 1)]
    kept, evicted = evict(items, 1, 100 * H, 0.0)
    assert ([i.id for i in kept], [i.id for i in evicted]) == (["newer"], ["older"])
    assert [i.id for i in rank(items, 100 * H, 0.0)] == ["newer", "older"]


def test_a_negative_relevance_counts_as_none() -> None:
    """A cosine below 0 adds nothing to the blend; it takes nothing away either."""
    items = [_item("opposite", 0.5, 0), _item("unrelated", 0.5, 0)]
    ranked = rank(items, 100 * H, 0.0, relevance=[-1.0, 0.0])
    assert [i.score for i in ranked] == pytest.approx([0.4 * 0.5, 0.4 * 0.5])
    assert [i.id for i in ranked] == ["opposite", "unrelated"]  # a tie, by id


def test_rank_blends_relevance() -> None:
    items = [_item("important", 0.9, 0), _item("relevant", 0.2, 0)]
    assert [i.id for i in rank(items, 100 * H, 0.05)] == ["important", "relevant"]
    ranked = rank(items, 100 * H, 0.05, relevance=[0.1, 0.9])
    assert [i.id for i in ranked] == ["relevant", "important"]
    assert all(i.score is not None for i in ranked)
    assert items[0].score is None  # inputs untouched


def test_remember_capacity_and_audit(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(config=MemoryConfig(working=WorkingConfig(capacity=3, decay_per_hour=0.05)))
    wm = memory.working_memory("s1", user_id="u1")
    for n, imp in enumerate([0.9, 0.1, 0.5, 0.7]):
        wm.remember(f"note {n}", importance=imp)
    assert sorted(i.text for i in wm.items()) == ["note 0", "note 2", "note 3"]
    assert [i.text for i in wm.items()] == ["note 0", "note 3", "note 2"]  # by importance
    audit = memory._layers.rows.query(  # the audit table, read directly
        "SELECT action, details FROM audit_log WHERE user_id='u1' AND layer='working'")
    assert [(a, json.loads(d)["text"]) for a, d in audit] == [("evict", "note 1")]


def test_items_ranked_by_query(memory: TieredMemory) -> None:
    wm = memory.working_memory("s1", user_id="u1")
    wm.remember("User is debugging the Stripe payment webhook", importance=0.4, type="goal")
    wm.remember("User prefers short answers", importance=0.6, type="preference")
    wm.remember("The staging server is down", importance=0.5, type="observation")
    top = wm.items("why does the payment webhook fail?", k=1)
    assert [(i.text, i.type) for i in top] == [("User is debugging the Stripe payment webhook", "goal")]
    assert wm.items(k=1)[0].text == "User prefers short answers"


def test_sessions_and_users_are_separate(memory: TieredMemory) -> None:
    memory.working_memory("s1", user_id="u1").remember("alpha")
    memory.working_memory("s2", user_id="u1").remember("beta")
    memory.working_memory("s1", user_id="u2").remember("gamma")
    assert [i.text for i in memory.working_memory("s1", user_id="u1").items()] == ["alpha"]


def test_scratchpad_persists(make_memory: Callable[..., TieredMemory], tmp_path: object) -> None:
    memory = make_memory("pad")
    pad = memory.working_memory("s1", user_id="u1").scratchpad
    pad["plan"] = ["search", "summarise"]
    pad["step"] = 1
    pad["step"] += 1
    del pad["plan"]
    assert dict(pad) == {"step": 2}
    with pytest.raises(InvalidInputError):
        pad["bad"] = object()
    memory.close()
    again = make_memory("pad")
    assert again.working_memory("s1", user_id="u1").scratchpad.to_dict() == {"step": 2}
    assert again.working_memory("s2", user_id="u1").scratchpad.to_dict() == {}


def test_a_scratchpad_write_past_its_total_is_refused_and_loses_nothing(memory: TieredMemory) -> None:
    """Each entry was held to 64,000 bytes, the pad to nothing: a session grew it without bound,
    each read and write of one key loading and rewriting all of it. A write that would take it
    past 1,000,000 bytes as JSON (WorkingConfig.scratchpad_max_bytes) is a ContentTooLargeError
    now, and what the pad held stays as it was; a smaller value and a deletion still go in."""
    pad = memory.working_memory("s1", user_id="u1").scratchpad
    chunk = "x" * 60_000
    for n in range(16):  # 960,000 bytes and the keys
        pad[f"k{n}"] = chunk
    with pytest.raises(ContentTooLargeError, match="scratchpad_max_bytes") as refused:
        pad["k16"] = chunk
    assert "1,000,000" in str(refused.value) and "del " in str(refused.value)
    held = memory.working_memory("s1", user_id="u1").scratchpad.to_dict()
    assert held == {f"k{n}": chunk for n in range(16)}
    pad["k0"] = "small"  # a write that shrinks it
    pad["k16"] = chunk
    del pad["k1"]
    assert sorted(pad) == sorted(["k0", *(f"k{n}" for n in range(2, 17))])


@pytest.mark.parametrize("before, after, refused", [
    (0, 100, False), (90, 100, False),  # within the limit
    (90, 101, True), (0, 10_000, True),  # past it
    (150, 120, False), (150, 150, False),  # over it already (a lowered limit): shrinking, or no change, passes
    (150, 151, True),  # growing it further does not
])
def test_check_pad_growth(before: int, after: int, refused: bool) -> None:
    if refused:
        with pytest.raises(ContentTooLargeError, match="100 \\(WorkingConfig.scratchpad_max_bytes\\)"):
            check_pad_growth(before, after, 100)
    else:
        check_pad_growth(before, after, 100)


@pytest.mark.parametrize("key, value", [("step", "x" * 70_000), ("k" * 70_000, 1), ("step", ["é" * 40] * 1_000)])
def test_a_scratchpad_entry_past_its_own_limit_is_content_too_large_like_the_whole_pad(key: str, value: object) -> None:
    """An entry over 64,000 bytes as JSON was a plain InvalidInputError ("... is 70,009 bytes as
    JSON; the limit is 64,000"), where the whole pad past its limit, and a working item's text
    past its own, are a ContentTooLargeError: an agent that catches that to keep a large result
    elsewhere missed it. Now it is one too (still an InvalidInputError), saying what to do."""
    with pytest.raises(ContentTooLargeError, match="the limit is 64,000 bytes.*item_store") as refused:
        check_pad_entry(key, value)
    assert "scratchpad entry" in str(refused.value)


def test_a_scratchpad_over_a_lowered_limit_is_read_and_can_shrink(make_memory: Callable[..., TieredMemory]) -> None:
    """A pad stored under a larger scratchpad_max_bytes reads whole under a smaller one; a write
    that grows it is refused, one that shrinks it (or a deletion) goes in."""
    memory = make_memory("pad")
    memory.working_memory("s", user_id="u").scratchpad.update({"a": "x" * 200, "b": 1})
    memory.close()
    memory = make_memory("pad", config=MemoryConfig(working=WorkingConfig(scratchpad_max_bytes=100)))
    pad = memory.working_memory("s", user_id="u").scratchpad
    assert pad.to_dict() == {"a": "x" * 200, "b": 1}
    with pytest.raises(ContentTooLargeError):
        pad["c"] = 2
    pad["a"] = "x" * 150
    del pad["b"]
    assert pad.to_dict() == {"a": "x" * 150}


def test_forget_and_clear(memory: TieredMemory) -> None:
    wm = memory.working_memory("s1", user_id="u1")
    a = wm.remember("a")
    wm.remember("b")
    wm.scratchpad["k"] = 1
    assert wm.forget(a.id) and not wm.forget(a.id)
    assert wm.clear() == 1
    assert wm.items() == [] and len(wm.scratchpad) == 0


@pytest.mark.parametrize("item_id", [2**70, "half \ud800 pair", None, ""])
def test_forget_refuses_an_id_no_item_can_have(memory: TieredMemory, item_id: object) -> None:
    wm = memory.working_memory("s1", user_id="u1")
    wm.remember("a")
    with pytest.raises(InvalidInputError, match="item_id"):
        wm.forget(item_id)  # type: ignore[arg-type]
    assert len(wm.items()) == 1


@pytest.mark.parametrize("text, importance", [("", 0.5), ("ok", 1.5), ("ok", -0.1), (None, 0.5),
                                              ("a\x00b", 0.5), ("\udc80", 0.5)])
def test_remember_rejects_bad_input(memory: TieredMemory, text: object, importance: float) -> None:
    with pytest.raises(InvalidInputError):
        memory.working_memory("s1", user_id="u1").remember(text, importance=importance)  # type: ignore[arg-type]
    assert memory.working_memory("s1", user_id="u1").items() == []


@pytest.mark.parametrize("now", ["yesterday", b"x", True, float("nan"), float("inf"), -1e300, 10**400])
def test_remember_and_items_reject_a_bad_now(memory: TieredMemory, now: object) -> None:
    wm = memory.working_memory("s1", user_id="u1")
    with pytest.raises(InvalidInputError):
        wm.remember("book the table", now=now)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        wm.items(now=now)  # type: ignore[arg-type]
    assert wm.items() == []
    assert wm.remember("book the table", now="2026-01-02T03:04:05Z").created_at == 1767323045.0


def test_bad_ids_rejected(memory: TieredMemory) -> None:
    with pytest.raises(InvalidInputError):
        memory.working_memory("", user_id="u1")


def test_clear_session_clears_its_working_memory(memory) -> None:  # type: ignore[no-untyped-def]
    memory.add("user", "hello there", user_id="u", session_id="s")
    wm = memory.working_memory("s", user_id="u")
    wm.remember("goal: book a table", importance=0.8)
    wm.scratchpad["step"] = 1
    other = memory.working_memory("t", user_id="u")
    other.remember("keep me", importance=0.8)
    assert memory.clear_session("s", user_id="u") == 1
    assert memory.working_memory("s", user_id="u").items() == []
    assert dict(memory.working_memory("s", user_id="u").scratchpad) == {}
    assert [i.text for i in memory.working_memory("t", user_id="u").items()] == ["keep me"]


def test_an_item_evicted_while_consolidation_prunes_is_audited_once(make_memory: Callable[..., TieredMemory]) -> None:
    # the prune step decides on a list read before its writes; an add that evicts one of those
    # items meanwhile (here: from the progress callback, between two prunes) leaves it to the eviction
    memory = make_memory(config=MemoryConfig(working=WorkingConfig(capacity=2)))
    wm = memory.working_memory("s", user_id="u")
    stale = [wm.remember(t, importance=0.01, now=1000.0 + n) for n, t in enumerate(["old a", "old b"])]

    def add_two(step: str, done: int, total: int) -> None:
        if step == "prune" and done == 1:
            wm.remember("fresh c", importance=0.9)
            wm.remember("fresh d", importance=0.9)  # the session is full: "old b" is evicted

    report = memory.consolidate("u", progress=add_two)
    assert report.details["prune"] == [stale[0].id] and report.pruned == 1
    audit = [(e.item_id, e.action) for e in memory.audit_log("u", layer="working")]
    assert audit == [(stale[0].id, "prune"), (stale[1].id, "evict")]
    assert sorted(i.text for i in wm.items()) == ["fresh c", "fresh d"]


_DEEP: list = []  # type: ignore[type-arg]
_cur = _DEEP
for _ in range(200):
    _cur.append([])
    _cur = _cur[0]


@pytest.mark.parametrize("value, said", [
    ({1, 2}, "set"), (b"bytes", "bytes"), (float("nan"), "Out of range float"), ([float("inf")], "Out of range float"),
    (__import__("datetime").datetime(2026, 1, 1), "datetime"), (_DEEP, "nests more than"), ("x" * 70_000, "bytes as JSON"),
    ({"a": {1: "b"}}, "keys must be strings"), ("a\x00b", "NUL"), ("\udc80", "lone surrogates"),
])
def test_a_scratchpad_value_that_is_no_json_is_refused_by_its_name_and_loses_nothing(
        memory: TieredMemory, value: object, said: str) -> None:
    pad = memory.working_memory("s1", user_id="u1").scratchpad
    pad["step"] = {"n": 1}
    with pytest.raises(InvalidInputError, match=said) as refused:
        pad["step"] = value
    assert "scratchpad entry 'step'" in str(refused.value)  # not "metadata": the caller passed none
    assert pad.to_dict() == {"step": {"n": 1}}
    assert memory.working_memory("s1", user_id="u1").items() == []


def test_a_fresh_item_of_no_importance_outlives_consolidation_until_its_session_could_be_idle(
        make_memory: Callable[..., TieredMemory]) -> None:
    """An item remembered with importance 0 (or under ``prune_below``) was pruned by the next
    ``consolidate``, a moment after ``remember`` returned: no ``items()`` could have seen it.
    It is pruned once it is as old as ``session_idle_hours``, when its session counts as idle."""
    memory = make_memory()
    wm = memory.working_memory("s", user_id="u")
    now = time.time()
    fresh = [wm.remember("just noted, of no weight", importance=0.0),
             wm.remember("just noted, of little weight", importance=0.01)]
    faded = wm.remember("noted two days ago", importance=0.01, now=now - 48 * H)
    report = memory.consolidate("u")
    assert report.details["prune"] == [faded.id]
    assert sorted(i.id for i in wm.items()) == sorted(i.id for i in fresh)
