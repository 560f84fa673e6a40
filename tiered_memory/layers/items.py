"""Namespaced key-value items with hybrid search: the core side of the LangGraph store.

An *item* is a JSON object stored under a ``namespace`` (a tuple of labels) and a
``key``, owned by one ``user_id``. Items are not chat turns: they live in their own
table (``items``, in the schema of each SQL dialect in ``store/``), reached only through
:class:`~tiered_memory.store.repositories.ItemRepository`, take part in ``search`` and
``build_context`` only when asked (``include_items=True``, :meth:`ItemStore.recall`,
:mod:`.item_recall`), and are deleted with the user in the same transaction as the
user's messages (like every table with a ``user_id`` column).

An item may carry ``text`` (what to search it by). That text is indexed like a turn: a keyword
index next to the row (the store's own full-text index), and a vector per field part in the shared
vector index under ``item:<id>[#n]`` with layer ``"item"``, both derived from the row (the vectors a
failed write left unwritten are written by the next open, :mod:`.item_vectors`; all of them by
:meth:`ItemStore.repair`). Search finds candidates by vector and keyword and scores each by its
cosine similarity to the query (in [-1, 1], higher is better, like LangGraph's stores with
``distance_type="cosine"``), so a score threshold means the same thing for every query. The text
holds one part per indexed field (separated by :data:`FIELD_SEP`); each part has its own vector
(``item:<id>``, ``item:<id>#1``, ...) and an item scores as its best part, as in LangGraph's SQL stores.

Items whose namespace maps to no user belong to :data:`SHARED_OWNER`.

Live items are part of ``export_jsonl``/``import_jsonl`` (:mod:`~tiered_memory.portable`):
restored with their ids, times and TTL by :meth:`ItemStore.restore`.

The pure rules (records, namespaces and their matching, vector ids, TTLs, result order:
:mod:`.item_rules`) and filtering (:mod:`.item_filters`) are re-exported here; both are
pure functions with table tests. The reads of a search (a listing, a ranked search, each
reading bounded pages) are :mod:`.item_search`. This module is the shell that reads and writes.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..aio import twin
from ..embedding import embed
from ..errors import InvalidInputError, VectorIndexError
from ..guard import usable, vector_errors_typed
from ..parts import Parts
from ..recall.forgetting import delete_owed, pay_before_storing
from ..records import Item
from ..store.pending_deletes import OwedVector
from ..store.repositories import ItemRepository
from ..textcache import forget_texts
from ..validation import check_id, check_text, encode_json
from ..vector.base import VectorIndex, VectorItem
from .item_vectors import UNINDEXED, owe_items, pay_owed_items, restore_item_vectors
from .item_filters import check_filter, check_filter_key, match_filter, match_value, value_at
from .item_rules import (FIELD_SEP, LAYER, MAX_PARTS, SHARED_OWNER, ItemHit, ItemWrite, best_parts, check_key,
                         check_namespace, check_owner, check_ttl, expiry, item_of_vector, match_namespace,
                         rank_by_similarity, text_parts, truncate_namespaces, vector_id)
from .item_search import ItemSearch

__all__ = [
    "FIELD_SEP", "LAYER", "MAX_PARTS", "SHARED_OWNER", "ItemHit", "ItemStore", "ItemWrite", "best_parts",
    "check_filter", "check_filter_key", "check_namespace", "check_owner", "check_ttl", "expiry",
    "item_of_vector", "match_filter", "match_namespace", "match_value", "rank_by_similarity", "text_parts",
    "truncate_namespaces", "value_at", "vector_id",
]


# ---- the shell -----------------------------------------------------------------
class ItemStore:
    """Items on the record store (SQLite or PostgreSQL) and vector index of a memory's parts.
    Get it with :meth:`TieredMemory.item_store`. Its calls run under the memory's
    :class:`~tiered_memory.guard.Calls` (``parts.calls``): closing the memory waits for them,
    and refuses them after.

    Args:
        parts: the memory's :class:`~tiered_memory.parts.Parts`.
        db: the item repository of its record store.
    """

    def __init__(self, parts: Parts, db: ItemRepository) -> None:
        self.parts = parts
        self.db = db
        self._calls = parts.calls
        self._reads = ItemSearch(parts, db)

    @property
    def index(self) -> VectorIndex:
        return self.parts.index

    @usable
    def wake_on_close(self, event: threading.Event) -> None:
        """Set ``event`` when the memory's ``close()`` begins (see
        :meth:`~tiered_memory.guard.Calls.wake_on_close`); refused on a closed memory."""
        self._calls.wake_on_close(event)

    # ---- writes ------------------------------------------------------------
    @usable
    def write_many(self, writes: Sequence[ItemWrite]) -> None:
        """Apply puts and deletes in order, in one transaction; texts embedded in one batch. A
        batch that deletes or overwrites an item empties the process's text caches once
        (:func:`~tiered_memory.textcache.forget_texts`).

        For the same (namespace, key), the last write wins.
        """
        last: dict[tuple[tuple[str, ...], str], ItemWrite] = {}
        for w in writes:
            ns = check_namespace(w.namespace)
            check_owner(w.user_id)
            check_key(w.key)
            if w.value is not None and not isinstance(w.value, Mapping):
                raise InvalidInputError(f"item value must be a mapping, got {type(w.value).__name__}")
            if w.text and w.text.strip():
                check_text(w.text, "item text")
            check_ttl(w.ttl_minutes)
            last[(ns, w.key)] = w
        if not last:
            return
        puts = [w for w in last.values() if w.value is not None]
        for w in puts:  # checked before anything is written; the store keeps the same JSON
            encode_json(w.value, "item value")
        with_text = [w for w in puts if w.text and w.text.strip()]
        # one vector per field text; (write, part) pairs in the order they are embedded
        pieces = [(w, n, t) for w in with_text for n, t in enumerate(text_parts(w.text or ""))]
        vectors = embed(self.parts.embedder, [t for _, _, t in pieces]) if pieces else None
        now = self.parts.now()
        ids: dict[tuple[tuple[str, ...], str], str] = {}
        stale: list[str] = []
        unindexed: list[str] = []  # the items whose rows are written and vectors not yet

        def write() -> None:
            with self.parts.writing(*(w.user_id for w in last.values())):  # (see Parts.writing)
                with self.db.unit() as u:
                    for (ns, key), w in last.items():
                        found = u.item_id(ns, key, live_at=now)
                        if found is None and (expired := u.item_id(ns, key)) is not None:
                            # expired, not yet swept: gone to every read, so a put makes a new item
                            u.delete_item(expired)
                            stale.append(expired)
                        if w.value is None:
                            if found:
                                u.delete_item(found)
                                stale.append(found)
                            continue
                        item_id = found or uuid.uuid4().hex
                        ids[(ns, key)] = item_id
                        text = w.text if w.text and w.text.strip() else None
                        expires = expiry(w.ttl_minutes, now)
                        if found:
                            u.update_item(item_id, user_id=w.user_id, value=w.value, text=text, updated_at=now,
                                          ttl_minutes=w.ttl_minutes, expires_at=expires)
                            stale.append(item_id)  # its old parts go below
                        else:
                            item = Item(id=item_id, user_id=w.user_id, namespace=ns, key=key, value=dict(w.value),
                                        text=text, created_at=now, updated_at=now)
                            written = u.insert_item(item, ttl_minutes=w.ttl_minutes, expires_at=expires)
                            if written != item_id:  # another worker stored this key first: its row was updated
                                ids[(ns, key)] = written
                                stale.append(written)
                    # the rows are the truth; vectors follow. A changed or deleted item loses its old vectors
                    # before the commit and gets its new ones after it: a failure between the two leaves them
                    # owed to the next open (a crash: to its repair), never a vector of the other text
                    with vector_errors_typed("nothing of the store write was written: the vector engine failed ({error})"):
                        self.index.delete([vector_id(i, n) for i in sorted(set(stale)) for n in range(MAX_PARTS)])
                if vectors is not None:
                    unindexed[:] = sorted({ids[(tuple(w.namespace), w.key)] for w in with_text})  # till written
                    with vector_errors_typed(UNINDEXED.format(n=len(with_text), error="{error}")):
                        self.index.upsert([
                            VectorItem(id=vector_id(ids[(tuple(w.namespace), w.key)], n), vector=vectors[k],
                                       user_id=w.user_id, layer=LAYER, timestamp=now)
                            for k, (w, n, _) in enumerate(pieces)])
                    unindexed.clear()

        self._owing(write, unindexed)
        if stale:  # a deleted or overwritten item's text is gone: from the process's caches too, once a batch
            forget_texts()

    @usable
    def restore(self, rows: Sequence[tuple[Item, float | None, float | None]]) -> int:
        """Write items as they were exported (ids, times, TTL and expiry kept), their text parts
        re-embedded and indexed; an item whose namespace and key are already stored is left as it
        is. Returns how many were written. The caller skips ids already stored."""
        pieces = [(item, n, t) for item, _, _ in rows if item.text for n, t in enumerate(text_parts(item.text))]
        vectors = embed(self.parts.embedder, [t for _, _, t in pieces]) if pieces else None
        written: set[str] = set()
        unindexed: list[str] = []

        def write() -> None:
            with self.parts.lock:
                with self.db.unit() as u:
                    for item, ttl, expires in rows:
                        if u.item_id(item.namespace, item.key) is None:
                            u.insert_item(item, ttl_minutes=ttl, expires_at=expires)
                            written.add(item.id)
                if vectors is not None:  # after the commit: a crash before it leaves no orphan vector
                    unindexed[:] = sorted(written)
                    # ids deleted before whose vectors the index still owes: those go first
                    pay_before_storing(self.parts.store.owed_rows, self.index, vectors=[
                        vector_id(item.id, n) for item, n, _ in pieces if item.id in written])
                    self.index.upsert([
                        VectorItem(id=vector_id(item.id, n), vector=vectors[k], user_id=item.user_id, layer=LAYER,
                                   timestamp=item.updated_at)
                        for k, (item, n, _) in enumerate(pieces) if item.id in written])
                    unindexed.clear()

        self._owing(write, unindexed)
        return len(written)

    def _owing(self, write: Callable[[], None], unindexed: list[str]) -> None:
        """``write()`` (in one transaction where one engine holds rows and vectors); the items
        ``unindexed`` names when it fails (rows written, vectors not) are owed to the next open."""
        try:
            self.parts.jointly(write)
        except BaseException:
            owe_items(self.parts.store, unindexed)
            raise

    @usable
    def repair(self, skipped: list[VectorIndexError] | None = None) -> int:
        """Re-embed items whose vector is missing (after ``rebuild_index`` or a crash); drop
        vectors of items that no longer exist. Returns how many vectors were restored.
        ``skipped``: the error of vectors the index refused to drop (owed) goes there, not raised."""
        return restore_item_vectors(self.parts, self.db, skipped)

    @usable
    def pay_owed(self) -> int:
        """Write the vectors of the items whose write failed after their rows committed (every
        open runs it, :mod:`.item_vectors`); returns how many items were indexed."""
        return pay_owed_items(self.parts, self.db)

    # ---- reads -------------------------------------------------------------
    @usable
    def get(self, namespace: Sequence[str], key: str, *, refresh_ttl: bool = False) -> Item | None:
        """The item, unless missing or expired; ``refresh_ttl`` restarts its TTL."""
        now = self.parts.now()
        found = self.db.item(check_namespace(tuple(namespace)), key, live_at=now)
        if found is not None and refresh_ttl:
            self.refresh([found.id], now)
        return found

    @usable
    def refresh(self, ids: Sequence[str], now: float | None = None) -> None:
        """Restart the TTL of those of ``ids`` that have one (a write: LangGraph's refresh-on-read)."""
        if ids and (expiring := self.db.expiring_items(ids)):  # none: the read stays a read, no write lock
            with self.parts.lock, self.db.unit() as u:
                u.refresh_items(expiring, self.parts.now() if now is None else now)

    @usable
    def sweep(self, now: float | None = None) -> int:
        """Delete the items that have expired (rows and vectors, and their texts from the
        process's caches); returns how many."""
        ids = self.db.expired_items(self.parts.now() if now is None else now)
        if ids:
            def drop() -> None:
                with self.parts.lock:
                    owed: list[OwedVector] = []
                    with self.db.unit() as u:
                        for i in ids:
                            if (owner := u.delete_item(i)) is not None:  # every field's, till the index deletes them
                                owed += u.owe_vectors(owner, vectors=[vector_id(i, n) for n in range(MAX_PARTS)])
                    delete_owed(self.parts.store.owed_rows, self.index, owed, what="expired items are")

            self.parts.jointly(drop)  # rows and vectors in one transaction where one engine holds both
            forget_texts()
        return len(ids)

    @usable
    def search(
        self, prefix: Sequence[str], *, query: str | None = None, user_id: str | None = None,
        filter: Mapping[str, Any] | None = None, limit: int = 10, offset: int = 0, refresh_ttl: bool = False,
        owned: Callable[[Item], bool] | None = None,
    ) -> list[ItemHit]:
        """Items under ``prefix`` that match ``filter``; ranked by similarity to ``query``
        (which needs ``user_id``), else newest first. Unranked items fill a short page.
        Expired items are left out; ``refresh_ttl`` restarts the TTL of those returned.
        A listing (no ``query``) is of ``user_id``'s items when it is given (every owner's when
        not), and keeps only the items ``owned`` says yes to, before paging."""
        hits = self._search(prefix, query=query, user_id=user_id, filter=filter, limit=limit, offset=offset,
                            owned=owned)
        if refresh_ttl:
            self.refresh([h.item.id for h in hits])
        return hits

    def _search(
        self, prefix: Sequence[str], *, query: str | None, user_id: str | None,
        filter: Mapping[str, Any] | None, limit: int, offset: int, owned: Callable[[Item], bool] | None = None,
    ) -> list[ItemHit]:
        ns = check_namespace(tuple(prefix), allow_empty=True)
        if limit < 0 or offset < 0:
            raise InvalidInputError("limit and offset must be >= 0")
        check_filter(filter)
        if not query or not query.strip():
            return self._reads.listing(ns, filter=filter, limit=limit, offset=offset, owned=owned,
                                       user_id=None if user_id is None else check_owner(user_id))
        if user_id is None:
            raise InvalidInputError(
                "a search query needs the user (a user id, or SHARED_OWNER for items of no user)")
        check_owner(user_id)
        return self._reads.semantic(ns, query, user_id=user_id, filter=filter, limit=limit, offset=offset)

    @usable
    def recall(self, query: str, *, user_id: str, k: int, vector: np.ndarray | None = None) -> list[ItemHit]:
        """The user's best ``k`` items for ``query``, in any namespace (what ``search`` and
        ``build_context`` add with ``include_items=True``); reads only."""
        check_id(user_id, "user_id")  # a real user: shared items are nobody's recall
        if not query.strip():
            return []
        return self._reads.ranked((), query, user_id=user_id, filter=None, n=k, vector=vector)[:k]

    @usable
    def namespaces(
        self, *, conditions: Sequence[tuple[str, Sequence[str]]] = (), max_depth: int | None = None,
        limit: int = 100, offset: int = 0, exact_at: int | None = None,
        owned: Callable[[tuple[str, ...], str | None, str], bool] | None = None, by_key: bool = False,
    ) -> list[tuple[str, ...]]:
        """Distinct namespaces matching every ``(kind, pattern)`` condition, sorted; a ``"*"``
        on namespace position ``exact_at`` is literal (see :func:`match_namespace`).

        With ``owned(namespace, key, user_id)``, only namespaces holding an item it says yes to
        are listed, before paging. It is asked once per distinct namespace and owner, or once
        per item with ``by_key`` (``key`` is ``None`` without it)."""
        rows = self.db.item_namespaces(live_at=self.parts.now(), with_keys=by_key)
        kept = [ns for ns, key, user in rows
                if all(match_namespace(ns, p, kind, exact_at) for kind, p in conditions)
                and (owned is None or owned(ns, key, user))]
        return truncate_namespaces(kept, max_depth)[offset:offset + limit]

    @usable
    def count(self, user_id: str | None = None) -> int:
        return self.db.count_items(user_id)

    # async twins: the same methods, run in a worker thread
    asweep = twin(sweep)
    arefresh = twin(refresh)
    awrite_many = twin(write_many)
    aget = twin(get)
    asearch = twin(search)
    anamespaces = twin(namespaces)
    acount = twin(count)
