"""A payment over everything owed (a write's, an open's) and ``rebuild_index``'s clearing of it
leave an entry another payer holds to that payer, instead of waiting for it under the write lock.

That payer is a deletion (``forget``, ``clear_session``) deleting its vectors outside the write
lock, in this process or another worker: on SQLite it holds its ids in the process, on PostgreSQL
its entries' rows locked (``tiered_memory.store.pending_deletes``). Waiting for its slow delete
held up every write of the process. The entry is not lost: its payer pays it, or fails and leaves
it owed for the next payment. Forced as in ``test_user_locks``: the real Chroma index holds its
delete of user a's ids on an event, every wait bounded.
"""

from __future__ import annotations

from typing import Callable

import pytest
from test_user_locks import HeldDeletes, _deleting, held, meanwhile

from tiered_memory import TieredMemory, VectorIndexError
from tiered_memory.testing import FailingVectorIndex

__all__ = ["held"]  # the fixture, imported for the tests below


@pytest.mark.record_stores("sqlite", "postgres")
def test_a_rebuild_leaves_what_a_clear_session_is_paying_to_it_and_holds_up_no_other_user(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    """``rebuild_index`` clears what is owed once it dropped every vector; a's ``clear_session`` is
    paying a's entries outside the write lock, held in the index's delete. The rebuild waited for
    that delete holding the write lock (and b's ``add`` behind it): it leaves those entries to
    their payer now, which pays them (or leaves them owed, and the next payment deletes them)."""
    memory, index = held
    delete = _deleting(memory, index, "clear_session")
    try:
        meanwhile(memory.rebuild_index, "rebuild_index waited for a's vector delete, holding the write lock")
        new = meanwhile(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="b"),
                        "b's add waited behind a rebuild waiting for a's vector delete")
        assert delete.thread.is_alive()  # a's delete still held: neither call waited for it
    finally:
        index.release.set()
    delete.result()
    assert new in memory.index.ids("b") and memory.index.ids("a") == set()
    assert memory.store.owed_rows.owed(10) == []  # a's entries paid by a's clear_session
    assert memory.search("where did I move?", user_id="b")[0].id == new


@pytest.mark.record_stores("postgres")  # workers: one database, one vector index
@pytest.mark.parametrize("held", ["wrapped"], indirect=True)
def test_a_workers_write_paying_what_is_owed_leaves_what_another_worker_pays_and_that_worker_pays_it_later(
        held: tuple[TieredMemory, HeldDeletes], make_memory: Callable[..., TieredMemory]) -> None:
    """Worker two's ``forget`` of a's turn is held in the index's delete (its entry's row locked);
    worker one pays what b's failed ``delete_fact`` left before b's next write, under its write lock.
    It waited for worker two's delete: it leaves a's entry to worker two now. That delete fails: the
    entry stays owed, and worker two's next write pays it."""
    one, index = held
    failing = one.index
    assert isinstance(failing, FailingVectorIndex)
    two = make_memory("two", vector_store=index, record_store=getattr(one.store, "url"))
    fact = one.add_fact("User sails on Sundays", user_id="b")
    failing.fail_on = {"delete"}
    with pytest.raises(VectorIndexError):
        one.delete_fact(fact.id, user_id="b")
    failing.healthy()
    first = one.get_messages("s", user_id="a")[0].id
    index.error = RuntimeError("vector server overloaded")
    delete = _deleting(two, index, "forget")
    try:
        new = meanwhile(lambda: one.add("user", "I moved to Porto", session_id="s", user_id="b"),
                        "worker one's write, paying what was owed, waited for worker two's vector delete")
        assert f"fact:{fact.id}" not in index.ids("b") and new in index.ids("b")
        assert delete.thread.is_alive()
    finally:
        index.release.set()
    with pytest.raises(VectorIndexError, match="deleted, but their vectors not yet"):
        delete.result()
    assert [(e.user_id, e.item_id) for e in one.store.owed_rows.owed(10)] == [("a", first)]  # not lost
    assert first in index.ids("a")
    two.add("user", "I sail on Mondays", session_id="s", user_id="b")  # pays it first
    assert first not in index.ids("a") and one.store.owed_rows.owed(10) == []
