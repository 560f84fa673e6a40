"""A turn stored as a duplicate (no vector of its own) is found by its original's vector in a
scoped search too: a session, filters, and the sessions of search_sessions. The hit is the
duplicate itself; an original outside the scope is never returned."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import MemoryConfig, MemoryHit, RetrievalConfig, TieredMemory
from tiered_memory.embedding import Embedder
from tiered_memory.recall.search import stand_ins

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

TEXT = "My favourite drink is jasmine tea."
QUERY = "what beverage do I enjoy?"  # no word in common with TEXT: found by its vector only


def _similarity(hit: MemoryHit) -> float:
    return float(hit.explanation["signals"]["similarity"]["value"])


def _fill(memory: TieredMemory) -> tuple[str, str]:
    first = memory.add("user", TEXT, session_id="s1", user_id="u", timestamp=1_700_000_000)
    memory.add_many([{"role": "user", "content": f"Weather note {n}: sunny and warm at the beach."} for n in range(20)],
                    session_id="w", user_id="u")
    again = memory.add("user", TEXT, session_id="s2", user_id="u", metadata={"src": "b"}, timestamp=1_700_000_100)
    memory.add("user", TEXT, session_id="s2", user_id="v", metadata={"src": "b"})  # another user's: never a hit of u
    assert memory.index.ids("u") & {first, again} == {first}  # the second is a duplicate: no vector
    return first, again


def _check_session(memory: TieredMemory, first: str, again: str) -> None:
    hits = memory.search(QUERY, user_id="u", session_id="s2")
    assert [(h.id, h.session_id, h.metadata, h.timestamp) for h in hits] == [(again, "s2", {"src": "b"}, 1_700_000_100)]
    original = memory.search(QUERY, user_id="u", session_id="s1")[0]
    assert original.id == first and _similarity(hits[0]) == pytest.approx(_similarity(original), abs=1e-6)


def _check_filters(memory: TieredMemory, again: str) -> None:
    hits = memory.search(QUERY, user_id="u", filters={"src": "b"})
    assert [(h.id, h.session_id, h.metadata) for h in hits] == [(again, "s2", {"src": "b"})]
    assert [h.id for h in memory.search(QUERY, user_id="u", session_id="s2", filters={"src": "b"})] == [again]
    assert memory.search(QUERY, user_id="u", session_id="s1", filters={"src": "b"}) == []


def _check_sessions(memory: TieredMemory, first: str, again: str) -> None:
    found = memory.search_sessions(QUERY, user_id="u", k=3)
    best = {s.session_id: [h.id for h in s.hits][:1] for s in found}
    assert best.get("s1") == [first] and best.get("s2") == [again]
    found = memory.search_sessions(QUERY, user_id="u", k=3, filters={"src": "b"})
    assert [(s.session_id, [h.id for h in s.hits]) for s in found] == [("s2", [again])]


@pytest.mark.parametrize("matching, apart_out, expected", [
    (None, False, {}),  # no scope: each original stands for its duplicates
    (None, True, {"d1": "o1"}),  # one session (or sessions): a duplicate whose original lies in another
    ({"d1", "d2", "o2"}, False, {"d1": "o1"}),  # a filter: a matching duplicate whose original does not match
    ({"d1", "d2", "o2"}, True, {"d1": "o1"}),
    ({"d2"}, False, {"d2": "o2"}),
    (set(), True, {}),  # a duplicate the filter rejects is never one
])
def test_a_duplicate_stands_for_its_original_out_of_scope(matching: set[str] | None, apart_out: bool,
                                                         expected: dict[str, str]) -> None:
    duplicates = {"d1": ("o1", True), "d2": ("o2", False)}  # d1's original in another session, d2's in its own
    assert stand_ins(duplicates, matching=matching, apart_out=apart_out) == expected


def test_a_duplicate_is_found_by_a_search_of_its_session(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("dup-session")
    _check_session(memory, *_fill(memory))


def test_a_duplicate_is_found_by_a_filtered_search(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("dup-filter")
    _, again = _fill(memory)
    _check_filters(memory, again)


def test_a_session_search_finds_the_session_of_a_duplicate(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("dup-sessions")
    _check_sessions(memory, *_fill(memory))


def test_a_session_search_reads_only_the_duplicates_of_the_turns_it_found(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """search_sessions read every duplicate of the user on every call (thousands of "thanks"
    and "ok" for a long-lived user): it now asks the store for the duplicates of the turns its
    vector query found alone, and still finds the duplicate's session."""
    memory = make_memory("dup-bounded", config=MemoryConfig(retrieval=RetrievalConfig(candidates=5)))
    first, again = _fill(memory)
    for n in range(12):  # "thanks" in twelve sessions: eleven duplicates, not among the best turns
        memory.add("user", "Thanks a lot!", session_id=f"t{n}", user_id="u")
    every = memory.store.duplicates("u")  # type: ignore[attr-defined]
    assert len(every) == 12
    real, read = memory.store.duplicates, []  # type: ignore[attr-defined]

    def reading(*args: Any, **kwargs: Any) -> dict[str, tuple[str, bool]]:
        got: dict[str, tuple[str, bool]] = real(*args, **kwargs)
        read.append((kwargs.get("originals"), got))
        return got

    monkeypatch.setattr(memory.store, "duplicates", reading)
    found = memory.search_sessions(QUERY, user_id="u", k=1, turns=1)
    assert [(s.session_id, [h.id for h in s.hits]) for s in found] in ([("s1", [first])], [("s2", [again])])
    [(originals, got)] = read
    assert originals is not None and first in originals and len(originals) <= 5
    assert got == {d: o for d, o in every.items() if o[0] in originals} == {again: (first, True)}


def test_an_unscoped_search_still_returns_the_original_alone(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("dup-unscoped")
    first, again = _fill(memory)
    assert [h.id for h in memory.search(QUERY, user_id="u", k=1)] == [first]
    assert again not in [h.id for h in memory.search(QUERY, user_id="u", k=30)]


def test_qdrant_finds_a_duplicate_in_scope(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("dup-qdrant", vector_store="qdrant")
    first, again = _fill(memory)
    _check_session(memory, first, again)
    _check_filters(memory, again)
    _check_sessions(memory, first, again)


@pytest.mark.servers
def test_pgvector_finds_a_duplicate_in_scope(make_pgvector_url: Callable[[], str], tmp_path: Path,
                                             embedder: Embedder) -> None:
    with TieredMemory(tmp_path / "m", record_store=make_pgvector_url(), vector_store="pgvector",
                      embedder=embedder) as memory:
        first, again = _fill(memory)
        _check_session(memory, first, again)
        _check_filters(memory, again)
        _check_sessions(memory, first, again)


REPEATS = ["Thanks a lot!", "Sounds good to me.", "See you tomorrow then."]
TOPICS = ["we booked the ferry to the island", "the dentist moved my appointment", "my sister adopted a kitten",
          "I started learning the cello", "the roof needs new tiles", "we planted tomatoes on the balcony"]
FILTERS: list[dict[str, Any]] = [
    {"tag": "a"}, {"tag": "b"}, {"role": "assistant"}, {"role": "user", "tag": "a"}, {"since": 1_700_004_000},
    {"until": 1_700_003_003}, {"since": 1_700_002_000, "until": 1_700_005_004}, {"odd": True}, {"odd": 0},
    {"odd": False, "tag": "b"}, {"missing": None}, {"tag": None}, {"tag": "zzz"},
]


def _fill_repeats(memory: TieredMemory) -> None:
    """Three phrases said again and again in eight sessions (the first of each the original, the
    rest its duplicates, most in other sessions than it), between distinct turns; roles, times
    and metadata vary turn by turn, so a filter takes some duplicates and not their original."""
    for s in range(8):
        rows = [{"role": "assistant" if j % 3 == 0 else "user", "timestamp": 1_700_000_000 + s * 1000 + j,
                 "content": REPEATS[(s + j) % 3] if j % 2 == 0 else f"In session {s}, {TOPICS[(s + j) % 6]}.",
                 "metadata": {"tag": "a" if (s + j) % 3 else "b", "odd": s % 2 == 1}} for j in range(6)]
        memory.add_many(rows, session_id=f"s{s}", user_id="u")
    memory.add_many([{"role": "user", "content": REPEATS[0], "metadata": {"tag": "a"}}], session_id="s0", user_id="v")


def test_a_filtered_search_finds_what_reading_every_duplicate_finds(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """A filtered search asks the store for the duplicates in scope under its filter, not for every
    duplicate of the user; its hits (search, with a session or not, and search_sessions) are those
    of the same search given every duplicate in scope, for filters on metadata, role and time, and
    among them are duplicates found through an original the filter rejects (a bound that lost any
    would fail here)."""
    memory = make_memory("dup-filter-bound")
    _fill_repeats(memory)
    every = memory.store.duplicates("u")  # type: ignore[attr-defined]
    assert len(every) == 21 and sum(apart for _, apart in every.values()) >= 14
    real = memory.store.duplicates  # type: ignore[attr-defined]

    def results() -> tuple[list[Any], list[set[str]]]:
        out: list[Any] = []
        ids: list[set[str]] = []  # each search's hit ids
        for f in FILTERS:
            for query in ("thanks so much", "see you soon", "what about the kitten?"):
                for session in (None, "s3"):
                    hits = memory.search(query, user_id="u", k=8, session_id=session, filters=f)
                    out.append([(h.id, pytest.approx(h.score, rel=1e-6)) for h in hits])
                    ids.append({h.id for h in hits})
                found = memory.search_sessions(query, user_id="u", k=4, turns=2, filters=f)
                out.append([(s.session_id, [h.id for h in s.hits]) for s in found])
                ids.append({h.id for s in found for h in s.hits})
        return out, ids

    bounded, ids = results()
    monkeypatch.setattr(memory.store, "duplicates", lambda user_id, session_id=None, *, originals=None, filters=None:
                        real(user_id, session_id, originals=originals))
    assert results()[0] == bounded
    # duplicates found through an original that was no hit of the same search
    stood_in = {d for found in ids for d in found & set(every) if every[d][0] not in found}
    assert len(stood_in) >= 3, stood_in


def test_a_filtered_search_reads_only_the_duplicates_its_filter_takes(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """A filtered search read every duplicate of the user on every call (1.3x the search at 20,000
    turns: bench/duplicate_scope.py); it now reads those its filter takes, and still finds them."""
    memory = make_memory("dup-filter-read")
    _fill_repeats(memory)
    every = memory.store.duplicates("u")  # type: ignore[attr-defined]
    real, read = memory.store.duplicates, []  # type: ignore[attr-defined]

    def reading(*args: Any, **kwargs: Any) -> dict[str, tuple[str, bool]]:
        got: dict[str, tuple[str, bool]] = real(*args, **kwargs)
        read.append(got)
        return got

    monkeypatch.setattr(memory.store, "duplicates", reading)
    hits = memory.search("thanks so much", user_id="u", k=8, filters={"tag": "b", "role": "assistant"})
    taken = {h.id for h in hits} & set(every)
    assert taken and all(h.metadata["tag"] == "b" and h.role == "assistant" for h in hits)
    [got] = read
    assert taken <= set(got) and len(got) < len(every)
    assert all(m.metadata["tag"] == "b" and m.role == "assistant"
               for m in memory.store.get_by_ids("u", list(got)).values())
