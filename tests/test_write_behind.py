"""The embedded Chroma's turn vectors are written behind (vector/write_behind.py): add_many
returns before the engine has them, every read still sees them, a failed background write
loses nothing, and a close or flush writes what is queued."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from tiered_memory import TieredMemory, VectorIndexError
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.write_behind import WriteBehind

NOTES = [{"role": "user", "content": text} for text in (
    "My sister Ana moved to Porto in March.", "I am allergic to penicillin.",
    "The band rehearses every Thursday night.", "Our cat is called Miso.")]


class Gate:
    """A Chroma collection whose upserts wait until ``open()``: the engine write is in flight."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self._open = threading.Event()

    def open(self) -> None:
        self._open.set()

    def upsert(self, **kwargs: Any) -> Any:
        self.entered.set()
        assert self._open.wait(30), "the gate was never opened"
        return self.inner.upsert(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_add_many_returns_before_the_engine_write_and_an_engine_read_waits_for_it(memory):
    gate = Gate(memory.index.collection)
    memory.index.collection = gate
    ids = memory.add_many(NOTES, session_id="s", user_id="u")  # returns with the write still blocked
    assert gate.entered.wait(10)
    counted: list[int] = []
    reader = threading.Thread(target=lambda: counted.append(memory.index.count("u")))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not counted  # count reads the engine, so it waits for the queue
    gate.open()
    reader.join(10)
    assert counted == [len(ids)]


def test_a_query_the_engine_answers_sees_what_is_queued(make_memory):
    memory = make_memory()
    gate = Gate(memory.index.collection)
    memory.index.collection = gate
    ids = memory.add_many(NOTES, session_id="s", user_id="u")
    assert gate.entered.wait(10)
    found: list[list[str]] = []
    searching = threading.Thread(
        target=lambda: found.append([h.id for h in memory.search("allergic to which medicine", user_id="u", k=2)]))
    searching.start()  # the user's vectors are not held yet: Chroma answers, once the queue is written
    searching.join(0.3)
    gate.open()
    searching.join(30)
    assert found and found[0][0] == ids[1]


def test_a_failed_background_write_is_reported_and_the_rows_are_indexed_on_the_next_open(make_memory):
    memory = make_memory("mem")
    memory.index.collection = FailingVectorIndex(memory.index.collection, fail_on={"upsert"}, times=None)
    ids = memory.add_many(NOTES, session_id="s", user_id="u")  # the failure happens in the writer
    with pytest.raises(VectorIndexError, match="could not be written in the background"):
        memory.flush()
    assert memory.store.counts()["indexed"] == 0  # back to pending: nothing claims a vector it lacks
    assert len(memory.get_messages("s", user_id="u")) == len(NOTES)
    memory.index.collection = memory.index.collection.inner
    memory.close()
    again = make_memory("mem")
    assert again.index.count("u") == len(ids)
    assert again.search("allergic to which medicine", user_id="u", k=1)[0].id == ids[1]


def test_the_next_add_many_reports_an_earlier_background_failure(make_memory):
    memory = make_memory()
    failing = FailingVectorIndex(memory.index.collection, fail_on={"upsert"}, times=1)
    memory.index.collection = failing
    memory.add_many(NOTES[:2], session_id="s", user_id="u")
    memory.index._behind.wait()  # the failing write has happened; its report waits for the next call
    assert failing.failures == 1
    with pytest.raises(VectorIndexError, match="background"):
        memory.add_many(NOTES[2:], session_id="s", user_id="u")
    assert len(memory.get_messages("s", user_id="u")) == len(NOTES)  # all four stored
    memory.rebuild_index()
    assert memory.index.count("u") == len(NOTES)


def test_close_writes_what_is_queued(make_memory, tmp_path, caplog):
    memory = make_memory("mem")
    gate = Gate(memory.index.collection)
    memory.index.collection = gate
    memory.add_many(NOTES, session_id="s", user_id="u")
    closing = threading.Thread(target=memory.close)
    closing.start()
    assert gate.entered.wait(10)
    gate.open()
    closing.join(30)
    assert not closing.is_alive()
    with caplog.at_level(logging.INFO, logger="tiered_memory"):
        reopened = TieredMemory(tmp_path / "mem", embedder=memory.embedder)
    try:
        assert reopened.index.collection.count() == len(NOTES)
        assert "repaired" not in caplog.text  # Chroma had them all: the open did not have to re-embed
    finally:
        reopened.close()


def test_forget_right_after_add_deletes_the_vector_the_writer_was_about_to_write(memory):
    gate = Gate(memory.index.collection)
    memory.index.collection = gate
    ids = memory.add_many(NOTES, session_id="s", user_id="u")
    assert gate.entered.wait(10)
    forgetting = threading.Thread(target=memory.forget, args=(ids[0],), kwargs={"user_id": "u"})
    forgetting.start()
    gate.open()
    forgetting.join(30)
    assert ids[0] not in memory.index.ids("u") and len(memory.index.ids("u")) == len(NOTES) - 1


def item(i: str, x: float) -> VectorItem:
    return VectorItem(id=i, vector=[x, 1.0], user_id="u")


def test_the_writer_coalesces_what_queued_meanwhile_and_keeps_each_ids_latest_vector():
    calls: list[list[VectorItem]] = []
    started, release = threading.Event(), threading.Event()

    def write(items: list[VectorItem]) -> None:
        calls.append(items)
        started.set()
        release.wait(10)

    behind = WriteBehind(write)
    behind.submit([item("a", 1)])
    assert started.wait(10)  # the first write is in flight; the next three queue behind it
    behind.submit([item("b", 1)])
    behind.submit([item("c", 1), item("b", 2)])
    release.set()
    assert behind.wait(10)
    behind.close()
    assert [[(i.id, i.vector[0]) for i in c] for c in calls] == [[("a", 1)], [("b", 2), ("c", 1)]]
    with pytest.raises(RuntimeError, match="closed"):
        behind.submit([item("d", 1)])
