"""A LangGraph ``BaseStore`` backed by tiered-memory: the modern long-term memory path.

LangChain recommends ``create_agent(..., store=...)`` (and the ``store`` of LangGraph
graphs) for memory that outlives a thread. :class:`TieredMemoryStore` keeps those
items in the same folder as the conversation memory, in the core's item table
(:mod:`tiered_memory.layers.items`), and searches them with the core's hybrid recall
(vector + keyword + recency), using the memory's embedder: no separate
embedding or index configuration.

Users: every item belongs to the user its namespace maps to, and
``TieredMemory.forget_user`` removes the user's items with everything else. The
mapping is one of:

- ``user_position`` (default ``0``): the label at that position, ``("u1", "memories")``;
- ``user_namespace=("memories", "{user_id}")``: a template (LangMem's pattern); the
  label in place of ``{user_id}`` is the user, where the other labels match;
- ``user_namespace=callable(namespace, key) -> user_id | None``: anything else, such as
  the docs' profile pattern (namespace ``("users",)``, key = user id:
  ``lambda ns, key: key if ns == ("users",) else None``). For a search the callable
  gets the prefix and ``key=None``.

Items whose namespace maps to no user are the store's shared items (owner
:data:`~tiered_memory.layers.items.SHARED_OWNER`, which no user id can equal, so no
``forget_user`` touches them). A semantic search sees the items of the one owner its
prefix maps to: that user's, or the shared items when the prefix names no user. User
ids are matched exactly on every path: ``*`` is a plain character in a label, and in a
``list_namespaces`` pattern it is LangGraph's wildcard everywhere but at the user's
position (``user_position`` or the template's ``{user_id}``), where it is matched
literally, so a user called ``*`` never lists other users' namespaces. As in LangGraph, a
label is a non-empty ``str`` without ``.`` or NUL, in every operation (those handed to
``batch`` too: one bad label fails the whole batch, before anything runs); a bad namespace is a
:class:`~.store_checks.NamespaceLabelError` on every method (:mod:`.store_namespaces`), both
LangGraph's ``InvalidNamespaceError`` and the library's ``InvalidInputError``; a user id with a
``.`` works as a key, with a callable.

TTL: ``ttl=TTLConfig(default_ttl=minutes, refresh_on_read=True, sweep_interval_minutes=...)``
and ``put(..., ttl=minutes)`` as in LangGraph. Expired items are never returned, listed
or searched (as with ``omit_expired=True``, always); reads that refresh restart the
clock (a small write; a read's ``refresh_ttl=True`` overrides ``refresh_on_read=False``); :meth:`TieredMemoryStore.sweep_ttl` deletes them (rows and
vectors), and :meth:`~TieredMemoryStore.start_ttl_sweeper` does it periodically.

Scores are cosine similarities in [-1, 1] (higher is better), as LangGraph's stores
report with ``distance_type="cosine"``; items that only filters or the listing found
have ``score=None``. As in LangGraph's SQL stores, each text at ``fields`` (each field,
and each value of a path that matches several) has its own vector and an item scores
as its best one (up to 16 per item; the rest share the last).

Batches (:mod:`.store_batch`): as in LangGraph's stores, a batch's reads see the state
before it and its writes go in one transaction with one embedding call; concurrent async
calls are coalesced into one batch, as ``AsyncBatchedBaseStore`` does.

Indexing: ``fields`` (default ``["$"]``, the whole value as JSON) names what text to
search an item by, with LangGraph's path syntax (``"text"``, ``"notes[*].body"``);
``put(..., index=[...])`` overrides it per item and ``index=False`` stores an item
that only ``get`` and filters can find.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence

from langgraph.store.base import (
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import get_text_at_path, tokenize_path

from tiered_memory import TieredMemory
from tiered_memory.aio import call_in_thread
from tiered_memory.errors import InvalidInputError, UsageError, VectorIndexError
from tiered_memory.records import Item as CoreItem
from tiered_memory.layers.items import FIELD_SEP, SHARED_OWNER, ItemStore, ItemWrite, check_ttl
from tiered_memory.validation import check_id, check_optional_id, nearest_time

from .history import check_memory
from .store_batch import Coalescer, plan_batch, spread_results
from .store_checks import NamespaceLabelError, check_op, check_paths, check_ttl_config
from .store_namespaces import NamespaceCheckedStore
from .store_users import USER_LABEL, UserMapping, check_template, user_from_template

__all__ = ["TieredMemoryStore", "UserMapping", "user_from_template"]

#: how often the TTL sweeper runs when neither the call nor the TTLConfig says (LangGraph's default)
DEFAULT_SWEEP_MINUTES = 5.0

log = logging.getLogger("tiered_memory")


def _dt(ts: float) -> datetime:
    # a time written by other code (milliseconds, say) is shown as the nearest one the core
    # accepts, which a datetime can hold (and an export writes)
    return datetime.fromtimestamp(nearest_time(ts), tz=timezone.utc)


def _item(i: CoreItem) -> Item:
    return Item(value=i.value, key=i.key, namespace=i.namespace,
                created_at=_dt(i.created_at), updated_at=_dt(i.updated_at))


def item_text(value: dict[str, Any], fields: Sequence[str]) -> str | None:
    """The searchable text of ``value``: the texts at ``fields``, one per line (pure)."""
    return "\n".join(field_texts(value, fields)) or None


def field_texts(value: dict[str, Any], fields: Sequence[str]) -> list[str]:
    """The texts at ``fields`` (a path matching several values gives several), in order (pure)."""
    texts: list[str] = []
    for f in fields:
        texts += get_text_at_path(value, f if f == "$" else tokenize_path(f))
    return [t for t in texts if t and t.strip()]


class TieredMemoryStore(NamespaceCheckedStore):
    """LangGraph store over a :class:`~tiered_memory.TieredMemory`.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory` (on SQLite or PostgreSQL).
        user_position: which namespace label is the user id (default ``0``).
        user_namespace: instead, a template such as ``("memories", "{user_id}")``, or a
            callable ``(namespace, key) -> user_id | None`` (``key`` is ``None`` for searches).
        fields: default paths of the text to index (``["$"]``: the whole value).
        ttl: LangGraph's ``TTLConfig`` (``default_ttl`` minutes, ``refresh_on_read``,
            ``sweep_interval_minutes``).

    Example:
        >>> store = TieredMemoryStore(memory, fields=["text"])  # doctest: +SKIP
        >>> store.put(("u1", "memories"), "tea", {"text": "Prefers green tea"})  # doctest: +SKIP
        >>> store.search(("u1", "memories"), query="what drink?")[0].key  # doctest: +SKIP
        'tea'
        >>> agent = create_agent(model, tools, store=store)  # doctest: +SKIP
    """

    def __init__(self, memory: TieredMemory, *, user_position: int | None = None,
                 user_namespace: UserMapping | None = None,
                 fields: Sequence[str] | None = None, ttl: TTLConfig | None = None) -> None:
        if user_position is not None and user_namespace is not None:
            raise InvalidInputError("pass user_position or user_namespace, not both")
        if user_position is not None and (isinstance(user_position, bool) or not isinstance(user_position, int)
                                          or user_position < 0):
            raise InvalidInputError("user_position must be an int >= 0")
        self.memory = check_memory(memory)
        self.user_position = 0 if user_position is None and user_namespace is None else user_position
        self._template: tuple[str, ...] | None = None
        self._user_fn: Callable[[tuple[str, ...], str | None], str | None] | None = None
        if callable(user_namespace):
            self._user_fn = user_namespace
        elif user_namespace is not None:
            if isinstance(user_namespace, str):
                raise InvalidInputError("user_namespace must be a tuple of labels, such as ('memories', '{user_id}')")
            self._template = check_template(user_namespace)
        self.user_namespace = user_namespace
        self.fields = check_paths(fields, "fields") if fields is not None else ["$"]
        self.ttl_config = check_ttl_config(ttl)
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()
        self._repaired = False
        self._owed = False  # a write of this store failed after its rows: the next call writes their vectors
        self._coalescers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Coalescer] = (
            weakref.WeakKeyDictionary())
        self._coalescers_lock = threading.Lock()

    @property
    def items(self) -> ItemStore:
        """The memory's item store, asked for at each use: a closed memory, or one inherited
        by a forked child, then raises its ``UsageError`` instead of reaching a closed
        database or a vector engine that would hang."""
        return self.memory.item_store()

    @property
    def embeddings(self) -> Any:
        """What embeds the items: the LangChain ``Embeddings`` the memory was given (through
        ``LangChainEmbedder``), else the memory's own embedder."""
        return getattr(self.memory.embedder, "embeddings", self.memory.embedder)

    @functools.cached_property
    def index_config(self) -> dict[str, Any]:
        """LangGraph's ``index_config`` view of the store (``dims``, ``embed``, ``fields``), for
        code that checks it to know semantic search is on (it always is here). ``dims`` is
        learnt by embedding one short text, the first time this is read."""
        dims = len(self.memory.embedder.embed_query("dimensions"))
        return {"dims": dims, "embed": self.embeddings, "fields": list(self.fields)}

    def user_of(self, namespace: tuple[str, ...], key: str | None = None) -> str | None:
        """The user id ``namespace`` (and ``key``, for a write) maps to; ``None``: shared."""
        if self._user_fn is not None:
            found = self._user_fn(tuple(namespace), key)
            return check_optional_id(found, "the user id user_namespace returned")
        if self._template is not None:
            return user_from_template(self._template, namespace)
        pos = self.user_position or 0
        return namespace[pos] if len(namespace) > pos else None

    def _owner(self, namespace: tuple[str, ...], key: str | None = None) -> str:
        user = self.user_of(namespace, key)
        if user is None:
            return SHARED_OWNER
        try:
            return check_id(user, "user_id")
        except InvalidInputError as e:  # LangGraph's callers catch InvalidNamespaceError
            raise NamespaceLabelError(f"namespace {namespace!r} maps to no usable user id: {e}") from e

    def _owns(self, item: CoreItem) -> bool:
        """Whether ``item`` belongs to the user its namespace and key map to, as every put here
        makes it. An item stored by other means in another user's namespace (a crafted line of
        a scoped import, which stores it as the importer's) is never read there, and its
        namespace is never listed for it."""
        return self._owned(tuple(item.namespace), item.key, item.user_id)

    def _owned(self, namespace: tuple[str, ...], key: str | None, user_id: str) -> bool:
        try:
            return user_id == self._owner(namespace, key)
        except InvalidInputError:  # the mapping gives no usable user for it: no one's
            return False

    def _ready(self) -> None:
        # restore item vectors dropped by rebuild_index() or a crash, once per store object; after a
        # failed write, those it left unwritten (the memory recorded which: no listing of the index)
        if not self._repaired:
            self.items.repair()
            self._repaired = True
        elif self._owed:
            self.items.pay_owed()
        self._owed = False

    # ---- ops -----------------------------------------------------------------
    def _writes(self, ops: Sequence[PutOp]) -> list[ItemWrite]:
        writes = []
        for op in ops:
            user = self._owner(op.namespace, op.key)
            text = None
            if op.value is not None and op.index is not False:
                # one part (and so one vector) per field text; keyword search sees them all. A
                # FIELD_SEP inside a text would split that field into several parts: it is a space
                paths = op.index if op.index is not None else self.fields
                text = FIELD_SEP.join(t.replace(FIELD_SEP, " ") for t in field_texts(dict(op.value), paths)) or None
            ttl = op.ttl if op.value is not None else None
            # any Mapping, as BaseStore.put takes (a MappingProxyType, say), is stored as the dict of
            # it, as LangGraph's InMemoryStore and SqliteStore store dict(value)
            value = dict(op.value) if op.value is not None else None
            writes.append(ItemWrite(namespace=op.namespace, key=op.key, user_id=user,
                                    value=value, text=text, ttl_minutes=ttl))
        return writes

    def _search(self, op: SearchOp, refresh: list[str]) -> list[SearchItem]:
        user = self._owner(op.namespace_prefix) if op.query else None
        hits = self.items.search(op.namespace_prefix, query=op.query, user_id=user,
                                 filter=op.filter, limit=op.limit, offset=op.offset, owned=self._owns)
        if self._refreshes(op.refresh_ttl):
            refresh += [h.item.id for h in hits]
        return [SearchItem(namespace=h.item.namespace, key=h.item.key, value=h.item.value,
                           created_at=_dt(h.item.created_at), updated_at=_dt(h.item.updated_at),
                           score=h.score) for h in hits]

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = [(c.match_type, tuple(c.path)) for c in op.match_conditions or ()]
        # the user's label is matched exactly: a user id "*" is that user, not a wildcard
        exact_at = (self._template.index(USER_LABEL) if self._template is not None
                    else None if self._user_fn is not None else self.user_position)
        # only namespaces holding an item their user owns; a position or a template maps the
        # namespace alone, so its distinct owners are enough: a callable may read the key
        return self.items.namespaces(conditions=conditions, max_depth=op.max_depth, limit=op.limit,
                                     offset=op.offset, exact_at=exact_at, owned=self._owned,
                                     by_key=self._user_fn is not None)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` as LangGraph's stores do (see :mod:`.store_batch`): the reads first,
        against the state before the batch, then every put and delete in one transaction
        with one embedding call (the last write per namespace and key wins); results in
        the order of ``ops``. Every operation is checked first: a bad one raises
        ``InvalidInputError`` and nothing runs."""
        ops = list(ops)
        for op in ops:
            check_op(op)
        return self._run_checked(ops)

    def _run_checked(self, ops: list[Op]) -> list[Result]:
        self._ready()
        plan = plan_batch(ops)
        refresh: list[str] = []
        read_results = [self._read(op, refresh) for op in plan.reads]
        if refresh:  # one write for every TTL the reads restart
            self.items.refresh(list(dict.fromkeys(refresh)))
        if plan.writes:
            try:
                self.items.write_many(self._writes(plan.writes))
            except VectorIndexError:  # rows stored, vectors refused: the next call restores them
                self._owed = True
                raise
        return spread_results(plan, read_results)

    def _read(self, op: Op, refresh: list[str]) -> Result:
        if isinstance(op, GetOp):
            found = self.items.get(op.namespace, op.key)
            if found is not None and not self._owns(found):
                found = None
            if found is not None and self._refreshes(op.refresh_ttl):
                refresh.append(found.id)
            return _item(found) if found else None
        if isinstance(op, SearchOp):
            return self._search(op, refresh)
        if isinstance(op, ListNamespacesOp):
            return self._list(op)
        raise InvalidInputError(f"unknown store operation {type(op).__name__}")

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Like :meth:`batch`, in a worker thread; calls made in the same event-loop tick
        (``aget``, ``aput``, ``asearch``... all come here) are coalesced into one batch."""
        ops = list(ops)
        for op in ops:  # a bad operation fails its own caller, never the batch it would join
            check_op(op)
        loop = asyncio.get_running_loop()
        with self._coalescers_lock:
            coalescer = self._coalescers.get(loop)
            if coalescer is None:
                # checked above; each call counted by the memory from when it is queued
                coalescer = self._coalescers[loop] = Coalescer(self._run_checked, self.memory)
        return await coalescer.submit(ops)

    # ---- TTL -------------------------------------------------------------------------
    supports_ttl = True

    def _refreshes(self, asked: bool) -> bool:
        # a refresh is a write: only a store configured for TTL does it. The operation's own
        # refresh_ttl decides (BaseStore.get/search resolve None to the config's refresh_on_read),
        # so an explicit refresh_ttl=True overrides refresh_on_read=False, as LangGraph's TTLConfig says
        return bool(asked and self.ttl_config is not None)

    def sweep_ttl(self) -> int:
        """Delete the expired items now; returns how many. (Expired items are never
        returned, listed or searched, swept or not.)"""
        return self.items.sweep()

    async def asweep_ttl(self) -> int:
        return await call_in_thread(self.memory, self.sweep_ttl)

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> threading.Thread:
        """Sweep every ``sweep_interval_minutes`` (default the TTLConfig's, else 5 minutes, as
        LangGraph's stores) in a daemon thread, until :meth:`stop_ttl_sweeper` or until the
        memory's ``close()`` begins (the thread ends then, not at its next interval); a failed
        sweep is logged and the next one runs. Starting twice returns the running thread. A
        store without ``ttl=`` needs the interval passed; a closed memory's is refused
        (``UsageError``)."""
        check_ttl(sweep_interval_minutes, "sweep_interval_minutes")  # the TTLConfig's was checked with it
        interval = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes") or (
            DEFAULT_SWEEP_MINUTES if self.ttl_config is not None else None)
        if not interval:
            raise InvalidInputError(
                "no sweep interval: pass sweep_interval_minutes, or set ttl=TTLConfig(...) on the store")
        if self._sweeper is not None and self._sweeper.is_alive():
            return self._sweeper
        self._stop_sweeping = threading.Event()  # a stopped sweeper's stays set for it
        self.items.wake_on_close(self._stop_sweeping)  # the memory's close ends it at once

        stop = self._stop_sweeping

        def run() -> None:
            while not stop.wait(float(interval) * 60.0):
                try:
                    self.sweep_ttl()
                except UsageError:  # the memory was closed: nothing left to sweep
                    return
                except Exception:  # noqa: BLE001  a failing database may come back: sweep again next time
                    log.exception("TTL sweep of the LangGraph store failed; retrying in %s minutes", interval)

        self._sweeper = threading.Thread(target=run, name="tiered-memory-ttl-sweeper", daemon=True)
        self._sweeper.start()
        return self._sweeper

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; True when it has stopped (or never ran)."""
        self._stop_sweeping.set()
        if self._sweeper is None:
            return True
        self._sweeper.join(timeout)
        stopped = not self._sweeper.is_alive()
        if stopped:
            self._sweeper = None
        return stopped
