"""Deleting the vectors of deleted rows, and paying the deletions the index still owes.

Every path that deletes rows with vectors (``forget``, ``clear_session``, ``delete_fact``,
``delete_episode``, consolidation's merge, archive and prune, the store items' TTL sweep)
records what the index must delete in the transaction that deletes the rows, one entry per
turn or vector (:mod:`..store.pending_deletes`), then pays it (:func:`delete_owed`). Should the
index fail, the entries stay owed: the memory pays them at its next open and before its next
write (:func:`pay_owed`), and ``rebuild_index``, which drops every vector, clears them. Where
rows and vectors share one engine (pgvector), all of it is one transaction: a failure leaves
nothing deleted and nothing owed.

A payment holds its entries (the record store's ``paying``) from before the index deletes their
vectors until the entries are deleted. A write that stores an id again (a caller's message id, an
import's fact, episode or item) pays that id's entries before it writes the new vectors
(:func:`pay_before_storing`): the old vectors go first, the new ones after, and a payment of the
same entries by another worker meanwhile is waited for, never run after the new vectors are in.
Should that payment fail, the write stores its rows pending (:data:`STORED_OWING`), and what
indexes pending rows later pays their ids first too (the turns' repair, the episodes' pending
pass): an open whose payment failed, or another worker's open while a payment is in flight,
would otherwise write the new vectors for a later payment to delete. Removing the entry instead,
or letting the payment skip ids whose rows exist again, loses either old vectors the new row does
not write again (a duplicate turn has none, a shorter text fewer chunks, an invalid fact none) or,
between that check and the index's delete, the new vector.
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence

from ..errors import VectorIndexError
from ..guard import vector_errors_typed
from ..store.base import RecordStore
from ..store.pending_deletes import PENDING_DELETIONS, TURN, OwedRows, OwedVector, changed, legacy_entries
from ..vector.base import VectorIndex
from .chunking import vector_ids
from .skipping import SkippingPass, summary_error


#: what a deletion's error says of its vectors when the index failed
STILL_OWED = ("deleted, but their vectors not yet ({error}); the vectors are deleted on the next open, "
              "before the next write, or by rebuild_index()")
#: what a write says of rows it stored pending because their ids' earlier vectors are still owed
STORED_OWING = ("{n} messages were stored but not yet indexed: ids among them held deleted messages whose "
                "vectors the index has not deleted yet, and those go first ({error}); they are indexed by the "
                "next write, the next open or rebuild_index()")
BATCH = 1000  # entries per payment at open: one index call and one transaction each
#: the VectorIndexError of vectors no row holds (a full repair's strays) the index refused to delete
STRAY_OWED = ("{n} vector(s) no row holds could not be deleted ({{error}}); they are owed, and deleted on the next "
              "open, before the next write, or by rebuild_index()")


def owed_ids(owed: Sequence[OwedVector], long: Collection[str] | None = None) -> list[str]:
    """The vector ids ``owed`` names: a turn's own and its chunks' (only for the turns in ``long``
    when the caller knows which are chunked), and each other vector (pure)."""
    turns = sorted({e.item_id for e in owed if e.kind == TURN})
    return [*vector_ids(turns, long), *sorted({e.item_id for e in owed if e.kind != TURN})]


def delete_owed(rows: OwedRows, index: VectorIndex, owed: Sequence[OwedVector], *, what: str,
                long: Collection[str] | None = None, wait: bool = True) -> int:
    """Delete the vectors of ``owed`` (entries a deletion recorded) from ``index`` and clear the
    entries; returns how many were paid (an entry another payer paid meanwhile is not).
    ``long``: see :func:`owed_ids`. ``wait``: see ``OwedRows.paying``.

    Raises:
        VectorIndexError: the index failed; the entries stay owed (``what`` names the rows).
    """
    if not owed:
        return 0
    with rows.paying(owed, wait=wait) as due:
        if due:
            with vector_errors_typed(f"{what} {STILL_OWED}"):
                index.delete(owed_ids(due, long))
        return len(due)


def pay_before_storing(rows: OwedRows, index: VectorIndex, *, turns: Sequence[str] = (),
                       vectors: Sequence[str] = ()) -> None:
    """Pay what is owed of these turn and vector ids, about to be written again, before their new
    vectors are (one look-up when nothing is owed).

    Raises:
        VectorIndexError: the index failed; the old vectors stay owed, and the caller stores the
            new rows pending (indexed after the next payment) and raises :data:`STORED_OWING`.
    """
    if turns or vectors:
        delete_owed(rows, index, rows.owed_for(turns=turns, vectors=vectors),
                    what="rows stored again under ids whose earlier rows were")


def delete_strays(rows: OwedRows, index: VectorIndex, strays: Sequence[str],
                  owed: Callable[[str], OwedVector]) -> tuple[int, VectorIndexError | None]:
    """Delete the vectors ``strays`` no row holds (a full repair's), in one call while the index
    takes it; returns how many were deleted and the error of those it refused. One refused is
    skipped (:class:`~.skipping.SkippingPass`: logged by its id) and recorded owed (``owed(id)``
    its entry, which a write storing that id again pays first), so the next payment (at open,
    before a write) deletes it: a full repair runs only after an unclean close, and the passes
    after this one (missing and pending vectors) do not wait behind it.

    Raises:
        VectorIndexError: the engine is down (:data:`~.skipping.DOWN_AFTER`); what was not
            deleted is owed.
    """
    skipping = SkippingPass[str](what="vector no row holds", name=repr)
    deleted: set[str] = set()

    def delete(part: Sequence[str]) -> None:
        with vector_errors_typed(STRAY_OWED.format(n=len(part))):
            index.delete(list(part))
        deleted.update(part)

    try:
        skipping.write(strays, delete)
    finally:
        rows.owe(sorted({owed(i) for i in strays if i not in deleted}))
    if skipping.error is None:
        return len(deleted), None
    return len(deleted), summary_error(STRAY_OWED.format(n=len(strays) - len(deleted)), skipping.error)


def take_legacy(store: RecordStore) -> int:
    """Move the turn and vector entries an earlier version wrote into the ``meta`` record (a
    worker of it in a rolling upgrade still does) into the table; returns how many. Written to
    the table first: a crash between the two leaves them in both, moved again (once) next time."""
    found, moved = legacy_entries(store.get_meta(PENDING_DELETIONS))
    if found:
        store.owed_rows.owe(found)
        store.change_meta(PENDING_DELETIONS, lambda raw: changed(raw, remove=moved))
    return len(found)


def pay_owed(store: RecordStore, index: VectorIndex, *, skipped: list[VectorIndexError] | None = None) -> int:
    """Remove every vector the record store says ``index`` owes (what an earlier version recorded
    too), in batches of :data:`BATCH`, and clear them; returns how many entries were paid. An
    entry whose deletion the index refuses is skipped (:class:`~.skipping.SkippingPass`), still
    owed, and the others are paid: one bad vector does not hold back the rest. An entry another
    payer holds (a ``forget`` deleting vectors outside the write lock, in this process or another
    worker) is left to it, not waited for: a write paying under the write lock would hold up every
    other write meanwhile, and that payer pays it or leaves it owed (and says so: its process's
    next write, or any worker's next open, pays it). ``skipped``: the error of those refused goes
    there, not raised, for a caller with more to do first.

    Raises:
        VectorIndexError: the index failed (raised once the rest are paid, or at once when the
            engine is down); what was not paid stays owed.
    """
    take_legacy(store)
    paid = 0
    skipping = SkippingPass[OwedVector](what="owed deletion", name=lambda e: f"{e.kind} {e.item_id!r}")
    seen: set[OwedVector] = set()  # this pass's, paid, skipped or left to their payer: read past, not again

    def pay(part: Sequence[OwedVector]) -> None:
        nonlocal paid
        paid += delete_owed(store.owed_rows, index, part, what="rows are", wait=False)

    def unpaid() -> list[OwedVector]:
        return [e for e in store.owed_rows.owed(BATCH + len(seen)) if e not in seen][:BATCH]

    while due := unpaid():
        skipping.write(due, pay)
        seen.update(due)
    if skipping.error is not None:
        if skipped is None:
            raise skipping.error
        skipped.append(skipping.error)
    return paid


def all_owed(store: RecordStore) -> list[OwedVector]:
    """Every entry owed (the earlier version's moved in first): what ``rebuild_index``, which
    drops every vector, clears with :func:`clear_owed` once the index is empty (an entry owed
    after the drop is paid, not cleared)."""
    take_legacy(store)
    return store.owed_rows.owed(2**62)


def clear_owed(store: RecordStore, owed: Sequence[OwedVector]) -> None:
    """Clear ``owed`` without asking the index (it dropped every vector). An entry another payer
    holds (a ``forget`` deleting vectors outside the write lock, which ``rebuild_index`` holds) is
    left to it, not waited for: its vectors went with the index, and it deletes its row, or leaves
    it owed for the next payment to delete nothing."""
    for start in range(0, len(owed), BATCH):
        with store.owed_rows.paying(owed[start:start + BATCH], wait=False):
            pass
