"""The vectors of the store items (:mod:`.items`), restored from their rows.

An item's row commits before its vectors are written (where the record store and the index are
two engines), so a vector engine that fails in between leaves an item stored without them:
found by ``get``, filters and its words, never ranked by similarity. Such a write is recorded
(:func:`owe_items`): the ids of its items in the record store's ``meta`` record
:data:`UNINDEXED_ITEMS`, a JSON list, changed in one step (``change_meta``) so that workers
writing at once lose none. Every open of the memory pays it (:func:`pay_owed_items`, in the
repair of the pending vectors of turns, facts and episodes): it re-embeds those items' texts
and writes their vectors, without listing the index. More ids than :data:`MAX_OWED_IDS` are
recorded as :data:`EVERY_ITEM`, paid by comparing every item with the index
(:func:`restore_item_vectors`, which ``rebuild_index`` and a full repair run too).

Invariants: an id is taken off the record before its vectors are written and put back should
the index fail again, so a write recorded meanwhile is never dropped; paying an item that was
deleted or rewritten since writes nothing stale (its row is read as it is now: gone, nothing);
the earlier vectors an id still owes the index are deleted before its new ones are written
(:func:`~tiered_memory.recall.forgetting.pay_before_storing`), as for turns and episodes.
"""

from __future__ import annotations

import json
from typing import Sequence

from ..embedding import embed
from ..errors import VectorIndexError
from ..guard import vector_errors_typed
from ..parts import Parts
from ..recall.forgetting import delete_strays, pay_before_storing
from ..recall.skipping import SkippingPass, raise_or_hand_on
from ..records import Item
from ..store.base import RecordStore
from ..store.pending_deletes import NO_USER, VECTOR, OwedVector
from ..store.repositories import ItemRepository
from ..vector.base import VectorItem
from .item_rules import LAYER, text_parts, vector_id

#: the meta record of the items whose vectors a failed write left unwritten
UNINDEXED_ITEMS = "unindexed_items"
EVERY_ITEM = "*"  # in the record: too many to name, compare every item with the index
MAX_OWED_IDS = 1_000

#: the VectorIndexError of a write whose vectors the engine refused after the rows were written
UNINDEXED = ("{n} store items were not indexed ({error}). Where one engine holds rows and vectors, nothing "
             "was written; otherwise they are stored and found by get, filters and their words, and ranked "
             "again once their vectors are written: by the next open of the memory, or the "
             "TieredMemoryStore's next call")
REPAIR_FAILED = ("restoring store item vectors failed ({error}); the items are kept, and the next open of the "
                 "memory (or rebuild_index()) restores their vectors")


def owed_ids(raw: str | None) -> list[str]:
    """The ids a :data:`UNINDEXED_ITEMS` record holds (pure): ``[EVERY_ITEM]`` for every item;
    a record that cannot be read, as every item too."""
    if not raw:
        return []
    try:
        ids = json.loads(raw)
    except ValueError:
        return [EVERY_ITEM]
    return sorted({str(i) for i in ids}) if isinstance(ids, list) else [EVERY_ITEM]


def changed(raw: str | None, *, add: Sequence[str] = (), remove: Sequence[str] = ()) -> str:
    """The record ``raw`` with ``add`` and without ``remove`` (pure); past :data:`MAX_OWED_IDS`
    ids it names :data:`EVERY_ITEM` alone.

    Example:
        >>> changed('["a", "b"]', add=["c"], remove=["a"])
        '["b", "c"]'
    """
    ids = (set(owed_ids(raw)) - set(remove)) | set(add)
    return json.dumps([EVERY_ITEM] if EVERY_ITEM in ids or len(ids) > MAX_OWED_IDS else sorted(ids))


def owe_items(store: RecordStore, ids: Sequence[str]) -> None:
    """Record that the vectors of the items ``ids`` are not written (their write failed)."""
    if ids:
        store.change_meta(UNINDEXED_ITEMS, lambda raw: changed(raw, add=ids))


def pay_owed_items(parts: Parts, db: ItemRepository) -> int:
    """Write the vectors that failed writes left unwritten (:func:`owe_items`); returns how many
    items were indexed. Cheap when nothing is owed: one read of the ``meta`` record.

    One the index refuses is skipped (:class:`~..recall.skipping.SkippingPass`), still owed.

    Raises:
        VectorIndexError: the index failed again (once the others are written, or at once when
            the engine is down); what was not written stays owed.
    """
    taken = owed_ids(parts.store.get_meta(UNINDEXED_ITEMS))
    if not taken:
        return 0
    parts.store.change_meta(UNINDEXED_ITEMS, lambda raw: changed(raw, remove=taken))
    skipping = SkippingPass[Item](what="store item", name=lambda i: repr(i.id))  # one refused holds back no other
    try:
        if EVERY_ITEM in taken:
            return restore_item_vectors(parts, db)
        items = [i for i in db.items_under((), taken) if i.text]
        skipping.write(items, lambda part: _written(parts, part))
    except BaseException:
        owe_items(parts.store, taken)
        raise
    owe_items(parts.store, [i.id for i in skipping.skipped])  # kept owed, for the next open
    if skipping.error is not None:
        raise skipping.error
    return len(items)


def _written(parts: Parts, items: Sequence[Item]) -> None:
    """Embed and write the vectors of ``items``, their ids' earlier vectors paid first."""
    pieces = [(i, n, t) for i in items for n, t in enumerate(text_parts(i.text or ""))]
    if pieces:
        vectors = embed(parts.embedder, [t for _, _, t in pieces])
        # ids whose earlier vectors the index still owes: those go first, else their payment takes these
        pay_before_storing(parts.store.owed_rows, parts.index, vectors=[vector_id(i.id, n) for i, n, _ in pieces])
        with vector_errors_typed(REPAIR_FAILED):
            parts.index.upsert([VectorItem(id=vector_id(i.id, n), vector=vectors[k], user_id=i.user_id,
                                           layer=LAYER, timestamp=i.updated_at)
                                for k, (i, n, _) in enumerate(pieces)])


def restore_item_vectors(parts: Parts, db: ItemRepository, skipped: list[VectorIndexError] | None = None) -> int:
    """Re-embed items whose vector is missing (after ``rebuild_index`` or a crash); drop
    vectors of items that no longer exist. Returns how many vectors were restored.

    A vector no item holds that the index refuses to drop is owed
    (:func:`~..recall.forgetting.delete_strays`: paid by the next open or write) and the missing
    vectors are written all the same; ``skipped``: its error goes there, not raised, for a caller
    with more passes to run first.

    Raises:
        VectorIndexError: the index failed (every item is owed, :data:`EVERY_ITEM`, for the next
            open), or refused to drop some vectors (the rest done).
    """
    try:
        restored, refused = _restore(parts, db)
    except BaseException:
        owe_items(parts.store, [EVERY_ITEM])
        raise
    raise_or_hand_on([refused], skipped)
    return restored


def _restore(parts: Parts, db: ItemRepository) -> tuple[int, VectorIndexError | None]:
    want = {vector_id(i.id, n): (i, t) for i in db.items_with_text() for n, t in enumerate(text_parts(i.text or ""))}
    with vector_errors_typed(REPAIR_FAILED):
        have = {i for i in parts.index.ids() if i.startswith("item:")}
    # one the index refuses is owed (its entry paid before a write stores that id again), not a failed restore
    _, refused = delete_strays(parts.store.owed_rows, parts.index, sorted(have - set(want)),
                               lambda i: OwedVector(NO_USER, VECTOR, i))
    todo = sorted(set(want) - have)
    for start in range(0, len(todo), 256):
        chunk = todo[start:start + 256]
        vectors = embed(parts.embedder, [want[v][1] for v in chunk])
        pay_before_storing(parts.store.owed_rows, parts.index, vectors=chunk)  # as above
        with vector_errors_typed(REPAIR_FAILED):
            parts.index.upsert([VectorItem(id=v, vector=vectors[n], user_id=want[v][0].user_id,
                                           layer=LAYER, timestamp=want[v][0].updated_at)
                                for n, v in enumerate(chunk)])
    return len(todo), refused
