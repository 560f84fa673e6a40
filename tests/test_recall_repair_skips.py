"""A repair that one bad row fails: the row is skipped (logged, kept pending or owed, nothing
lost) and the pass goes on with the rest, so later rows do not wait behind it
(``tiered_memory.recall.indexing.repair``, ``tiered_memory.recall.forgetting.pay_owed``).

The vector engine here refuses one id only (a point it cannot write or delete); a wrapper of
the real Chroma index's methods, nothing else faked (tests/repair_support.py). The layers' and
store items' passes: tests/test_layer_repair_skips.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import pytest

from repair_support import NOTES, RefusingEngine, add_note, owed_ids, pending_ids, repair_now, stored_pending
from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.layers.item_rules import ItemWrite, vector_id
from tiered_memory.vector.chroma import ChromaVectorIndex


def test_a_row_the_index_refuses_is_skipped_and_the_rest_are_indexed(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Three rows pending, the engine refusing ``note-2``'s vector: the repair wrote none (one
    upsert for the batch failed and the pass stopped), so every later row waited behind it."""
    memory, index = stored_pending(make_memory, tmp_path, ["note-1", "note-2", "note-3"])
    index.refused = "note-2"
    with pytest.raises(VectorIndexError, match="1 turn"):
        repair_now(memory)  # says what it left
    assert pending_ids(memory) == {"note-2"}  # kept pending, for the next pass
    assert index.inner.ids("u") == {"note-1", "note-3"}
    assert index.refusals <= 3  # tried apart, once alone, not in a loop
    index.refused = ""  # the engine takes it again
    assert repair_now(memory)["indexed"] == 1 and pending_ids(memory) == set()


def test_an_engine_that_fails_every_call_is_not_asked_row_by_row(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Skipping what fails must not turn an engine that is down into one call per pending row."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    index.down = True
    rows = [{"id": f"n{i}", "role": "user", "content": f"note number {i}"} for i in range(64)]
    with pytest.raises(VectorIndexError):
        memory.add_many(rows, session_id="s", user_id="u")
    calls = 0
    real = index._check

    def counted(ids: Sequence[str], method: str) -> None:
        nonlocal calls
        calls += 1
        real(ids, method)

    index._check = counted  # type: ignore[method-assign]
    with pytest.raises(VectorIndexError, match="down"):
        repair_now(memory)
    assert len(pending_ids(memory)) == 64 and calls <= 12


def test_a_payment_the_index_refuses_holds_back_its_row_only(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """``note-2`` stored again while its old vector was owed, and the engine refusing to delete
    it: the repair's payment for the batch failed, and no row of it was indexed. The rows owing
    nothing are indexed now; ``note-2`` stays pending, its old vector still owed."""
    memory, index = stored_pending(make_memory, tmp_path, ["note-1"])
    add_note(memory, "note-2", "I keep wasps")
    index.down = True
    with pytest.raises(VectorIndexError):
        memory.forget("note-2", user_id="u")  # its vector owed
    for note in ("note-2", "note-3"):
        with pytest.raises(VectorIndexError):
            add_note(memory, note, NOTES[note])  # pending, note-2 under an owed id
    index.down, index.refused = False, "note-2"
    with pytest.raises(VectorIndexError):
        repair_now(memory)
    assert pending_ids(memory) == {"note-2"} and owed_ids(memory) == {"note-2"}
    assert {"note-1", "note-3"} <= index.inner.ids("u")
    index.refused = ""
    repair_now(memory)
    assert pending_ids(memory) == set() and owed_ids(memory) == set()
    assert "note-2" in index.inner.ids("u")  # the new vector, written after the old was deleted


def test_a_deletion_the_index_refuses_holds_back_no_other_payment_or_pending_row(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Three notes forgotten while deletes failed, and one stored while writes failed: the next
    write's payment sent the three deletions in one call, which the engine refused for
    ``note-2``, so none was paid, and the pending row waited too (the repair after a payment was
    not run). The others are paid and the row indexed; ``note-2``'s deletion stays owed."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    for note in ("note-1", "note-2", "note-3"):
        add_note(memory, note, NOTES[note])
    index.down = True
    for note in ("note-1", "note-2", "note-3"):
        with pytest.raises(VectorIndexError):
            memory.forget(note, user_id="u")
    with pytest.raises(VectorIndexError):
        add_note(memory, "note-4", NOTES["note-4"])
    index.down, index.refused = False, "note-2"
    memory.add("user", "Another note", session_id="t", user_id="u")  # pays, then indexes what is pending
    assert owed_ids(memory) == {"note-2"}
    assert index.inner.ids("u") & set(NOTES) == {"note-2", "note-4"}  # note-2's old vector, owed
    assert pending_ids(memory) == set()


def test_an_episode_the_index_refuses_holds_back_no_other_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Two episodes stored pending (ended while the engine was down), the engine refusing the
    first one's key points: the open's pass over pending episodes stopped at it, and the second
    waited behind it. The second is written now; the first stays pending for the next open."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    for session, text in (("s1", "I keep bees on the roof of the library"), ("s2", "My sister moved to Porto")):
        memory.add("user", text, session_id=session, user_id="u")
    index.down = True
    for session in ("s1", "s2"):
        with pytest.raises(VectorIndexError):
            memory.end_session(session, user_id="u")
    first, second = sorted(memory.episodes("u"), key=lambda e: e.session_id)
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = f"ep:{first.id}:0"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its repair runs, logged
    points = {i.split(":")[1] for i in index.inner.ids("u") if i.startswith("ep:")}
    assert points == {second.id}
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # the next open writes it
    assert {i.split(":")[1] for i in index.inner.ids("u") if i.startswith("ep:")} == {first.id, second.id}


def test_a_store_item_the_index_refuses_holds_back_no_other_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Two store items whose vectors a failed write left to the next open, the engine refusing
    one's: the open's payment wrote both in one call, refused, and owed both again."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    index.down = "upsert"
    with pytest.raises(VectorIndexError, match="the next open"):
        memory.item_store().write_many([
            ItemWrite(namespace=("u", "notes"), key=key, user_id="u", value={"text": text}, text=text)
            for key, text in (("tea", "Drinks green tea"), ("bees", "Keeps bees on the roof"))])
    tea, bees = (memory.item_store().get(("u", "notes"), key) for key in ("tea", "bees"))
    assert tea is not None and bees is not None
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = vector_id(tea.id, 0)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its payment runs, logged
    assert {i for i in index.inner.ids("u") if i.startswith("item:")} == {vector_id(bees.id, 0)}
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # still owed: the next open writes it
    assert {vector_id(tea.id, 0), vector_id(bees.id, 0)} <= index.inner.ids("u")
