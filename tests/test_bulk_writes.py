"""The bulk path at any size: add_many and import_jsonl in chunks, with progress, resumable,
and the limits of a read (k above what is held, a user with nothing)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiered_memory import MemoryConfig, StoreError, VectorIndexError
from tiered_memory.config import RetrievalConfig
from tiered_memory.portable import ImportFormatError
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.validation import MAX_COUNT
from tiered_memory.vector.chroma import ChromaVectorIndex

SMALL = MemoryConfig(write_chunk=4)


TOPICS = ["apples", "night trains", "Lisbon", "violins", "my taxes", "hiking boots", "penicillin", "chess openings",
          "sailing", "pottery"]


def notes(n: int, prefix: str = "note") -> list[dict[str, object]]:
    """``n`` messages; the first 10 are far apart for any embedder (none is a near-duplicate)."""
    return [{"id": f"{prefix}-{i}", "role": "user", "content": f"{prefix} {i}: a thought on {TOPICS[i % 10]}"}
            for i in range(n)]


def test_add_many_writes_in_chunks_and_reports_each(make_memory):
    memory = make_memory(config=SMALL)
    seen: list[int] = []
    ids = memory.add_many(notes(10), session_id="s", user_id="u", progress=seen.append)
    assert seen == [4, 4, 2]
    assert ids == [f"note-{i}" for i in range(10)]
    assert (memory.stats().messages, memory.stats().vectors) == (10, 10)


def test_an_interrupted_add_many_resumes_with_the_same_ids(make_memory):
    memory = make_memory(config=SMALL)

    def stop_after_first(n: int) -> None:
        raise KeyboardInterrupt  # the caller's process is stopped half-way

    with pytest.raises(KeyboardInterrupt):
        memory.add_many(notes(10), session_id="s", user_id="u", progress=stop_after_first)
    assert memory.stats().messages == 4  # one whole chunk committed, nothing half-written
    assert memory.add_many(notes(10), session_id="s", user_id="u") == [f"note-{i}" for i in range(10)]
    assert (memory.stats().messages, memory.stats().vectors) == (10, 10)
    assert [m.id for m in memory.get_messages("s", user_id="u")] == [f"note-{i}" for i in range(10)]


def test_a_vector_failure_mid_way_still_stores_every_chunk(make_memory, tmp_path):
    index = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "v")), fail_on=["upsert"], after=1)
    memory = make_memory(config=SMALL, vector_store=index)
    with pytest.raises(VectorIndexError, match="stored but not indexed"):
        memory.add_many(notes(10), session_id="s", user_id="u")
    assert memory.stats().messages == 10
    index.healthy()
    memory.rebuild_index()
    assert memory.stats().vectors == 10


def line(i: int, **over: object) -> str:
    row = {"format": "tiered-memory/1", "type": "message", "id": f"m{i}", "user_id": "u", "session_id": "s",
           "role": "user", "content": f"imported note {i}", "metadata": {}, "timestamp": 1.0 + i}
    row.update(over)
    return json.dumps(row)


def test_a_bad_line_at_90_percent_imports_nothing_unless_asked(make_memory, tmp_path):
    dump = tmp_path / "d.jsonl"
    lines = [line(i) for i in range(100)]
    lines[89] = line(89, role=42)
    dump.write_text("\n".join(lines) + "\n")
    memory = make_memory(config=SMALL)
    with pytest.raises(ImportFormatError, match="line 90") as caught:
        memory.import_jsonl(dump)
    assert [n for n, _ in caught.value.errors] == [90]
    assert memory.stats().messages == 0
    report = memory.import_jsonl(dump, skip_invalid=True)
    assert (report.imported, [n for n, _ in report.invalid]) == (99, [90])
    again = memory.import_jsonl(dump, skip_invalid=True)  # a re-run (or a resumed one) skips what is stored
    assert (again.imported, again.skipped_existing) == (0, 99)
    assert memory.stats().messages == 99


def test_k_above_what_is_held_and_a_user_with_nothing(make_memory):
    memory = make_memory()
    memory.add_many(notes(3), session_id="s", user_id="u")
    assert len(memory.search("a thought on sailing", user_id="u", k=MAX_COUNT)) == 3
    assert memory.search("a thought on sailing", user_id="nobody", k=MAX_COUNT) == []
    context = memory.build_context("a thought on sailing", user_id="nobody", session_id="s")
    assert all(not s.items for s in context.sections) and context.recent_messages == []


def test_the_exact_scan_ranks_as_the_engine_does(make_memory, tmp_path):
    """The same memories behind an index that scans the user exactly and one that asks
    Chroma with the user's ids: the same hits, in the same order."""
    engine = make_memory("engine", vector_store=ChromaVectorIndex(str(tmp_path / "e"), exact_rows=0))
    exact = make_memory("exact")
    for memory in (engine, exact):
        for s in range(4):
            memory.add_many(notes(25, prefix=f"s{s}"), session_id=f"s{s}", user_id="u")
        memory.add_many(notes(25, prefix="other"), session_id="s0", user_id="v")
    assert exact.index.scans_exactly("u", wait=True)  # type: ignore[attr-defined]
    assert not engine.index.scans_exactly("u", wait=True)  # type: ignore[attr-defined]
    for query in ("a thought on Lisbon", "violins", "s2 pottery"):
        for session in (None, "s1"):
            got = [h.id for h in exact.search(query, user_id="u", k=10, session_id=session)]
            assert got == [h.id for h in engine.search(query, user_id="u", k=10, session_id=session)]
            assert got and not any(i.startswith("other") for i in got)


class KeywordFails(SQLiteRecordStore):
    failing = True

    def keyword_search(self, *args: Any, **kwargs: Any) -> list[tuple[str, float]]:
        if self.failing:
            raise StoreError("record store read failed: disk I/O error")
        return super().keyword_search(*args, **kwargs)


def test_a_keyword_query_run_beside_the_exact_scan_ranks_the_same_and_reports_its_failure(make_memory, tmp_path):
    """With the user's vectors held, the keyword query may run in a worker thread
    (``keyword_beside_from``): the same hits as run in turn; its error reaches the caller,
    typed, and the memory still answers once the store does."""
    store = KeywordFails(tmp_path / "records.db")
    beside = make_memory("beside", record_store=store,
                         config=MemoryConfig(retrieval=RetrievalConfig(keyword_beside_from=0)))
    in_turn = make_memory("in-turn")
    for memory in (beside, in_turn):
        memory.add_many(notes(30), session_id="s", user_id="u")
        assert memory.index.scans_exactly("u", wait=True)  # type: ignore[attr-defined]
    with pytest.raises(StoreError, match="disk I/O"):
        beside.search("a thought on violins", user_id="u", k=3)
    store.failing = False
    for query in ("a thought on violins", "note 17", "Lisbon pottery"):
        got = [h.id for h in beside.search(query, user_id="u", k=5)]
        assert got and got == [h.id for h in in_turn.search(query, user_id="u", k=5)]
