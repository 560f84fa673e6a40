"""Deleting the vectors of deleted rows, and paying the deletions the index still owes.

Every path that deletes rows with vectors (``forget``, ``clear_session``, ``delete_fact``,
``delete_episode``, consolidation's merge, archive and prune, the store items' TTL sweep)
records what the index must delete in the transaction that deletes the rows
(:mod:`..store.pending_deletes`), then deletes it from the index and, once the index has,
clears it (:func:`delete_owed`). Should the index fail, the deletion stays owed: the memory
pays it at its next open and before its next write (:func:`pay_owed`), and ``rebuild_index``,
which drops every vector, clears it. Where rows and vectors share one engine (pgvector), all
of it is one transaction: a failure leaves nothing deleted and nothing owed.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, Protocol, Sequence

from ..guard import vector_errors_typed
from ..store.base import RecordStore
from ..store.pending_deletes import PENDING_DELETIONS, Owed, changed, owed
from ..store.repositories import OwedWrites
from ..vector.base import VectorIndex
from .chunking import vector_ids

class Units(Protocol):
    """A layer repository: its units record and settle what the index owes."""

    def unit(self) -> AbstractContextManager[OwedWrites]: ...


#: what a deletion's error says of its vectors when the index failed
STILL_OWED = ("deleted, but their vectors not yet ({error}); the vectors are deleted on the next open, "
              "before the next write, or by rebuild_index()")


def delete_owed(index: VectorIndex, ids: Sequence[str], settle: Callable[[], object], *, what: str) -> None:
    """Delete ``ids`` (vectors a deletion recorded as owed) from ``index``, then ``settle()``
    (clear them from the record).

    Raises:
        VectorIndexError: the index failed; the vectors stay owed (``what`` names the rows).
    """
    if not ids:
        return
    with vector_errors_typed(f"{what} {STILL_OWED}"):
        index.delete(list(ids))
    settle()


def settled_by(rows: Units, *, turns: Sequence[str] = (), vectors: Sequence[str] = ()) -> Callable[[], None]:
    """What clears deletions a layer's unit recorded, once the index has made them."""
    def run() -> None:
        with rows.unit() as u:
            u.settle_vectors(turns=turns, vectors=vectors)
    return run


def settle(store: RecordStore, *, turns: Sequence[str] = (), vectors: Sequence[str] = ()) -> None:
    """Clear deletions the index has made from the record (one :meth:`~RecordStore.change_meta`:
    what another worker recorded meanwhile is kept)."""
    paid = Owed(turns=frozenset(turns), vectors=frozenset(vectors))
    if paid:
        store.change_meta(PENDING_DELETIONS, lambda raw: changed(raw, remove=paid))


def owed_vectors(store: RecordStore) -> Owed:
    """The vectors the record says the index owes (its users aside: ``forget_user``'s)."""
    due = owed(store.get_meta(PENDING_DELETIONS))
    return Owed(turns=due.turns, vectors=due.vectors)


def pay_owed(store: RecordStore, index: VectorIndex) -> int:
    """Remove every vector the record says ``index`` owes, and clear them; returns how
    many entries were paid. A turn whose id a row holds again (a caller's id, stored anew since)
    is cleared without deleting: that vector is the new row's.

    Raises:
        VectorIndexError: the index failed; everything stays owed.
    """
    due = owed_vectors(store)
    if not due:
        return 0
    again = store.existing_ids(sorted(due.turns))
    ids = [*vector_ids(sorted(due.turns - again)), *sorted(due.vectors)]
    with vector_errors_typed(f"rows are {STILL_OWED}"):
        if ids:
            index.delete(ids)
    settle(store, turns=sorted(due.turns), vectors=sorted(due.vectors))
    return len(due.turns) + len(due.vectors)
