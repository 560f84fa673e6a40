"""Paying what the vector index owes, against the writes around it (SQLite beside Chroma).

An id deleted while the index failed and stored again: ``add_many`` and ``import_jsonl`` both
store it pending and say so (one behaviour). A payment's index delete runs outside the record
store's write transaction: a slow vector server holds up no other reader or writer of the
database. A repair indexes a pending row only once its id's old vectors are gone
(``tiered_memory.recall.forgetting``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.layers.item_rules import ItemWrite
from tiered_memory.recall.indexing import repair
from tiered_memory.store.pending_deletes import entries
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.chroma import ChromaVectorIndex


def _chroma(tmp_path: Path) -> ChromaVectorIndex:
    return ChromaVectorIndex(str(tmp_path / "index"))


def _note(memory: TieredMemory, note_id: str, text: str, user_id: str = "u") -> None:
    memory.add_many([{"id": note_id, "role": "user", "content": text}], session_id="s", user_id=user_id)


def _owed(memory: TieredMemory) -> set[str]:
    return {e.item_id for e in memory.store.owed_rows.owed(100)}


def test_add_many_and_import_both_store_an_owed_id_pending_and_say_so(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Paying an id's old vectors fails (the index still down) as the id is stored again: ``add_many``
    stored it pending with a logged warning only, ``import_jsonl`` stopped without storing it. Both
    store it now, pending, and raise VectorIndexError saying so; the next write indexes it."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    _note(memory, "note-1", "My bank PIN is 4921")
    _note(memory, "note-2", "My locker code is 7755", user_id="v")
    dump = tmp_path / "v.jsonl"
    memory.export_jsonl(dump, user_id="v")
    index.fail_on = {"delete"}  # the server goes down
    for note, user in (("note-1", "u"), ("note-2", "v")):
        with pytest.raises(VectorIndexError):
            memory.forget(note, user_id=user)
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):
        _note(memory, "note-1", "I moved to Porto")
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):
        memory.import_jsonl(dump)
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["I moved to Porto"]
    assert [m.content for m in memory.get_messages("s", user_id="v")] == ["My locker code is 7755"]
    assert {"note-1", "note-2"} <= index.inner.ids()  # the old vectors, still owed
    index.healthy()
    memory.add("user", "Another note", session_id="s", user_id="u")  # pays, then indexes what is pending
    assert _owed(memory) == set() and memory.store.pending_index(10) == []
    assert "note-1" in index.inner.ids("u") and "note-2" in index.inner.ids("v")
    assert memory.import_jsonl(dump).skipped_existing == 1  # stored once


class _HeldDeletes:
    """The index's ``delete`` held (a slow vector server) until :meth:`release`: ``entered`` is set
    once a delete is inside it. Wraps the real Chroma index's method (monkeypatch), nothing else."""

    def __init__(self, index: ChromaVectorIndex, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self._released, self._real = threading.Event(), threading.Event(), index.delete
        monkeypatch.setattr(index, "delete", self)

    def __call__(self, ids: Sequence[str]) -> None:
        self.entered.set()
        assert self._released.wait(20), "the held delete was never released"
        self._real(ids)

    def release(self) -> None:
        self._released.set()


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # the test reads it
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_payment_in_flight_holds_up_no_reader_or_writer_of_the_database(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A payment's index delete is slow (a vector server under load): the SQLite store's write
    transaction and its connection were held across it, so a reader of the messages and a writer
    of the record store waited for the vector server. They go ahead now; the payment completes."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=1)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    _note(memory, "note-1", "My bank PIN is 4921")
    _note(memory, "note-2", "I keep bees")
    with pytest.raises(VectorIndexError):
        memory.forget("note-1", user_id="u")  # owed: the next write pays it
    held = _HeldDeletes(index.inner, monkeypatch)
    payer, paid = _in_thread(lambda: memory.add("user", "Another note", session_id="t", user_id="u"))
    try:
        assert held.entered.wait(10)  # the payment's index delete is in flight
        other, seen = _in_thread(lambda: (memory.get_messages("s", user_id="u"),
                                          memory.store.set_meta("someone-else", "wrote")))
        other.join(5)
        waited = other.is_alive()
    finally:
        held.release()
    payer.join(10)
    other.join(10)
    assert not waited, "a reader and a writer of the database waited for the vector server"
    assert [m.id for m in seen[0][0]] == ["note-2"]  # type: ignore[index]
    assert memory.store.get_meta("someone-else") == "wrote"
    assert not isinstance(paid[0], BaseException), paid
    assert "note-1" not in index.inner.ids("u") and _owed(memory) == set()


def test_an_id_stored_again_waits_for_a_payment_of_it_in_flight(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A payment of ``note-1``'s old deletion in flight (its entry read, its index delete not yet
    made) when ``note-1`` is stored again: the write waits for the payment, so the new vector is
    written after the old one is deleted (the payment holds its entries outside the transaction)."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=1)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    _note(memory, "note-1", "My bank PIN is 4921")
    with pytest.raises(VectorIndexError):
        memory.forget("note-1", user_id="u")
    with memory.store.owed_rows.paying(memory.store.owed_rows.owed(10)) as due:  # another thread's payment
        assert [e.item_id for e in due] == ["note-1"]
        writer, out = _in_thread(lambda: _note(memory, "note-1", "I moved to Porto"))
        writer.join(0.2)  # a write that does not wait has stored and indexed by now
        index.inner.delete(["note-1"])  # the payment's index delete; its entry paid as the block ends
    writer.join(10)
    assert out == [None], out
    assert "note-1" in index.inner.ids("u") and _owed(memory) == set()


def _stored_again_while_owed(make_memory: Callable[..., TieredMemory],
                             tmp_path: Path) -> tuple[TieredMemory, FailingVectorIndex]:
    """``note-1`` deleted while the index failed its deletes (its vectors owed), then stored again:
    left pending, the index still failing deletes."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    _note(memory, "note-1", "My bank PIN is 4921")
    with pytest.raises(VectorIndexError):
        memory.forget("note-1", user_id="u")
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):
        _note(memory, "note-1", "I moved to Porto")
    return memory, index


def test_a_row_left_pending_under_an_owed_id_keeps_the_vectors_the_open_writes(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """``note-1`` stored again while its old vectors could not be deleted (left pending), and the
    memory opened again with deletes still failing: the open's repair indexed the row without
    paying first, and the next payment deleted its new vector with the old one."""
    memory, index = _stored_again_while_owed(make_memory, tmp_path)
    memory.close()
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its payment fails, its repair runs
    index.healthy()
    memory.add("user", "Another note", session_id="t", user_id="u")  # pays, then indexes what is pending
    assert _owed(memory) == set() and memory.store.pending_index(10) == []
    assert "note-1" in index.inner.ids("u")


def test_a_repair_of_another_worker_waits_for_a_payment_of_the_id_in_flight(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A payment of ``note-1``'s old deletion in flight while a repair (another worker's open on a
    shared store) finds ``note-1`` stored again, pending: the repair indexed it at once, and the
    payment's index delete then took the new vector. It pays first now, so it waits."""
    memory, index = _stored_again_while_owed(make_memory, tmp_path)
    index.healthy()
    upserted, real = threading.Event(), index.inner.upsert

    def upsert(items: Any) -> None:
        upserted.set()
        real(items)

    monkeypatch.setattr(index.inner, "upsert", upsert)
    with memory.store.owed_rows.paying(memory.store.owed_rows.owed(10)) as due:  # the payer, in flight
        assert [e.item_id for e in due] == ["note-1"]
        worker, out = _in_thread(lambda: repair(store=memory.store, index=memory.index, embedder=memory.embedder,
                                                threshold=memory.config.dedup_threshold, full=False))
        upserted.wait(0.2)  # a repair that does not pay first has written the new vector by now
        index.inner.delete(["note-1"])  # the payment's index delete
    worker.join(10)
    assert [r.get("indexed") for r in out] == [1], out  # type: ignore[attr-defined]
    assert "note-1" in index.inner.ids("u") and _owed(memory) == set()


def test_an_episode_left_pending_under_owed_ids_keeps_the_vectors_the_open_writes(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """The same for an episode imported again under its id while its old key points could not be
    deleted: the open's pass over pending episodes wrote their vectors without paying first."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    memory.add("user", "I keep bees on the roof of the library", session_id="s", user_id="u")
    episode = memory.end_session("s", user_id="u")
    points = {i for i in index.inner.ids("u") if i.startswith(f"ep:{episode.id}:")}
    assert points
    dump = tmp_path / "dump.jsonl"
    memory.export_jsonl(dump, user_id="u")
    index.fail_on = {"delete"}
    with pytest.raises(VectorIndexError):
        memory.delete_episode(episode.id, user_id="u")
    with pytest.raises(VectorIndexError):
        memory.import_jsonl(dump)  # the episode stored again, pending
    memory.close()
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    index.healthy()
    memory.add("user", "Another note", session_id="t", user_id="u")  # pays
    assert _owed(memory) == set()
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path), embedder=StaticEmbedder()) as memory:  # indexes the episode
        assert [e.id for e in memory.episodes("u")] == [episode.id]
        assert points <= memory.index.ids("u")


def test_a_store_item_owed_to_the_open_keeps_the_vectors_the_open_writes(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A store item whose vectors a failed write left to the next open, under an id whose earlier
    vectors the index still owes (an expired item swept while deletes failed, then imported again):
    the open, its payment failing, wrote the item's vectors without paying first, and the next
    payment deleted them with the old ones."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["upsert"], times=1)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    tea = ItemWrite(namespace=("u", "notes"), key="tea", user_id="u", value={"text": "Drinks green tea"},
                    text="Drinks green tea")
    with pytest.raises(VectorIndexError, match="the next open"):
        memory.item_store().write_many([tea])
    item = memory.item_store().get(("u", "notes"), "tea")
    assert item is not None
    memory.store.owed_rows.owe(entries("u", vectors=[f"item:{item.id}"]))  # its earlier vectors, unpaid
    memory.close()
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its payment fails, items are paid
    index.healthy()
    memory.add("user", "Another note", session_id="t", user_id="u")  # pays what is owed
    assert _owed(memory) == set()
    assert f"item:{item.id}" in index.inner.ids("u")
