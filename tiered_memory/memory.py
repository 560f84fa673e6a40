"""The :class:`TieredMemory` facade: the top of the core.

It opens the backends (:mod:`.backends`), hands every layer one :class:`~.parts.Parts`
bundle, and validates every call at the edge. One sync/async story: the sync methods are
the implementation, and each ``a*`` twin runs its sync method in a worker thread
(:func:`~.aio.twin`, typed, so the twins keep their signatures for type checkers and
IDEs). The only bridge the other way is the LLM call inside ``end_session`` and
``consolidate`` (:func:`~.aio.run_sync`), which also works inside Jupyter.

Reads (``search``, ``build_context``, ``search_facts``, ``search_episodes``) commit
nothing: what they hand to the caller is noted in the :class:`~.parts.AccessLog`, which
writes access counts in batches.
"""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

from .aio import ReadWriteGate, to_thread, twin
from .arguments import check_parts
from .backends import (
    attach_sessions,
    configured_record_store,
    configured_vector_store,
    is_embedded_index,
    joint_writes,
    open_layer_store,
    open_record_store,
    open_vector_index,
    startup_repair,
    supports_layers,
)
from .config import MemoryConfig, check_config
from .context.assembly import accessed, assemble, session_buffer
from .context.render import MemoryContext
from .embedding import Embedder, default_embedder, embed_query, embedder_name
from .errors import (ConfigurationError, InvalidInputError, NotFoundError, StoreError, TieredMemoryError,
                     UsageError, VectorIndexError)
from .guard import Calls, usable
from .layers.consolidation import ConsolidationReport
from .layers.episodic import EpisodeHit
from .layers.item_recall import ITEM_LAYER, as_memory_hit, merge_by_score
from .layers.items import ItemStore
from .layers.longterm import Layers
from .layers.semantic import FactHit
from .records import AUDIT_LAYERS, AuditEntry, Episode, Fact, FactChange
from .layers.working import WorkingMemory, touch_items
from .llm.adapters import resolve_llm
from .memory_folder import STORE_ENTRIES as STORE_ENTRIES, check_export_target, foreign_entries as foreign_entries
from .parts import AccessLog, Parts
from .portable import ImportReport, export_jsonl, import_jsonl
from .recall.indexing import index_orphans, repair, settle_background_writes
from .recall.search import search_turns, turn_weights
from .recall.sessions import search_sessions as find_sessions
from .store.base import RecordStore
from .store.repositories import LayerRepository
from .textcache import forget_texts
from .tokens import CachedCounter, TokenCounter, default_token_counter
from .types import MemoryHit, Message, SessionHit, SessionInfo, Stats, StoredMessage
from .validation import (MAX_COUNT, check_callback, check_count, check_fact_text, check_filters, check_flag, check_id,
                         check_metadata, check_path, check_query, check_timeout, check_unit)
from .vector.base import VectorIndex
from .writes import (chosen_among, drop_message, drop_session, drop_user, not_yet_archived, not_yet_stored,
                     pending_forgets, rows_of, set_pending_forgets, write_messages)

log = logging.getLogger("tiered_memory")
T = TypeVar("T")


def default_path() -> Path:
    """``$TIERED_MEMORY_HOME`` or ``~/.tiered-memory``."""
    return Path(os.environ.get("TIERED_MEMORY_HOME") or Path.home() / ".tiered-memory")


@dataclass(frozen=True, kw_only=True)
class FolderSettings:
    """What opens a memory whose folder holds all of it (see :attr:`TieredMemory.folder_settings`)."""

    path: Path
    config: MemoryConfig
    vector_store: str  # "chroma" or "qdrant", in the folder


def _query(query: object) -> str:
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty string")
    return check_query(query)


class TieredMemory:
    """Long-term memory for LLM agents, scoped by ``user_id`` and ``session_id``.

    Args:
        path: folder of the embedded store (SQLite + Chroma); default ``$TIERED_MEMORY_HOME``,
            else ``~/.tiered-memory``.
        config: tuning (buffer, retrieval, budgets, limits).
        embedder: any object with ``embed_documents``/``embed_query``; default
            :func:`~tiered_memory.embedding.default_embedder` (the static table distilled
            from all-MiniLM-L6-v2; no torch; ``$TIERED_MEMORY_EMBEDDER=minilm`` for MiniLM).
        vector_store: a :class:`~tiered_memory.vector.base.VectorIndex`, or ``"chroma"``
            (default), ``"qdrant"`` (local mode in ``path``), an ``http(s)://`` Chroma URL, a
            ``qdrant+http(s)://`` Qdrant URL (its key from ``$QDRANT_API_KEY``), or ``"pgvector"``
            (in a PostgreSQL record store, rows and vectors in one transaction); unset,
            ``$TIERED_MEMORY_VECTOR_STORE``, else ``"chroma"``.
        record_store: a :class:`~tiered_memory.store.base.RecordStore`, ``"sqlite"`` (SQLite in
            ``path``) or a ``postgresql://`` URL; unset, ``$TIERED_MEMORY_RECORD_STORE``, else SQLite.
        token_counter: ``str -> int``, a pure function of the text (its counts are remembered);
            default cl100k offline, else a heuristic.
        llm: makes episodes and facts smarter: any object with ``async def complete(...)``,
            a LangChain chat model or a LlamaIndex LLM.
        clock: ``() -> float`` seconds since the epoch, for the store items' TTL (default
            ``time.time``); a simulation or a test can move time on without sleeping.

    The attributes ``store``, ``index`` and ``parts`` are the engines underneath (the record
    store, the vector index, the layers' shared parts), there for tests, benchmarks and repair
    tools. They are not the API: they take no user scope of their own, skip the checks, locks
    and caches of these methods, and may change between versions.

    Example:
        >>> with TieredMemory("/tmp/tm-doc") as memory:  # doctest: +SKIP
        ...     memory.add("user", "I live in Lisbon", user_id="u1", session_id="s1")
        ...     memory.search("where do I live?", user_id="u1")[0].text
        'I live in Lisbon'
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        config: MemoryConfig | None = None,
        embedder: Embedder | None = None,
        vector_store: VectorIndex | str | None = None,
        record_store: RecordStore | str | None = None,
        token_counter: TokenCounter | None = None,
        llm: Any = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._config = check_config(config or MemoryConfig())  # before any I/O
        turn_weights(self._config.retrieval)  # a bad fusion choice or weight table fails here, before any I/O
        vector_store = configured_vector_store(vector_store)  # so does a bad vector server URL or collection
        records = record_store if record_store is not None else configured_record_store()
        records_in_folder = records is None or isinstance(records, str) and records == "sqlite"
        self._folder_index: str | None = (
            vector_store if records_in_folder and isinstance(vector_store, str) and is_embedded_index(vector_store)
            else None)
        check_parts(embedder, token_counter, clock)
        resolve_llm(llm)  # a model no adapter wraps (or a model's name) fails here, not at the first end_session
        self.embedder: Embedder = embedder or default_embedder(self.config.embed_batch_size)  # a bad choice: no I/O
        self.count_tokens: TokenCounter = CachedCounter(token_counter or default_token_counter())
        self._llm = llm
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ConfigurationError(f"path must be a folder path (str or os.PathLike), got {type(path).__name__}")
        try:
            self.path = check_path(path) if path is not None else default_path()
        except InvalidInputError as e:
            raise ConfigurationError(str(e)) from None
        self._folder = self.path.resolve()  # the folder opened: a relative path names another after a chdir
        self._calls = Calls()  # close() waits for the calls running when it starts, the handles' too
        self._write_lock = threading.RLock()
        self._gate = ReadWriteGate()  # reads wait while rebuild_index replaces the vector index
        try:
            self.store, self._lock = open_record_store(self.path, record_store, owner=self)
        except OSError as e:
            raise StoreError(f"cannot open the memory at {self.path}: {e.strerror or e}") from e
        try:
            if embedder is None:  # the store's own, if one of ours made its vectors: no silent re-embed
                self.embedder = default_embedder(self.config.embed_batch_size, recorded=self.store.get_meta("embedder"))
            self.index, self._lock = open_vector_index(self.path, vector_store, self.store, self._lock, owner=self)
            attach_sessions(self.index, self.store)
            self._joint = joint_writes(self.store, self.index)  # None: rows and vectors in two engines
            self.parts = Parts(
                store=self.store, index=self.index, embedder=self.embedder, config=self.config,
                lock=self._write_lock, count_tokens=self.count_tokens,
                access=AccessLog({"turn": lambda user, ids, now: self.store.touch(user, ids, now),
                                  "fact": lambda user, ids, now: self._layers.facts.touch(user, ids, now),
                                  "episode": lambda user, ids, now: self._layers.episodes.touch(user, ids, now),
                                  "working": lambda user, ids, now: touch_items(self._layers.rows, user, ids, now)},
                                 self._write_lock, flush_size=self.config.access_flush_size,
                                 flush_seconds=self.config.access_flush_seconds),
                calls=self._calls, clock=clock or time.time, jointly=self._jointly)
            startup_repair(self.store, self.index, self.embedder,
                           repair=lambda full: self._repair(full=full), rebuild=self._rebuild,
                           index_in_folder=self._lock is not None and is_embedded_index(vector_store))
            self._unfinished = pending_forgets(self.store)
            self._finish_forgets()
        except BaseException as e:
            self.store.close()
            if self._lock:
                self._lock.release()
            if isinstance(e, (OSError, sqlite3.Error)):
                raise StoreError(f"cannot open the memory at {self.path}: {e}") from e
            raise

    # ---- the parts below the facade --------------------------------------
    @functools.cached_property
    def _rows(self) -> LayerRepository:
        """The layer repositories of the record store, opened (and migrated) once."""
        return open_layer_store(self.store)

    @functools.cached_property
    def _layers(self) -> Layers:
        """Episodic, semantic and working memory, created on first use."""
        return Layers(self.parts, self._rows, self._llm)

    def _layers_ok(self) -> bool:
        return supports_layers(self.store)

    @functools.cached_property
    def _items(self) -> ItemStore:
        return ItemStore(self.parts, self._rows)

    @usable
    def item_store(self) -> ItemStore:
        """The namespaced key-value items behind the LangGraph store adapter."""
        return self._items

    @property
    def config(self) -> MemoryConfig:
        """The configuration this memory was opened with (fixed: every part holds it)."""
        return self._config

    @config.setter
    def config(self, value: MemoryConfig) -> None:
        raise UsageError("a memory's config is fixed when it opens, since every part holds it: "
                         "close this one and open TieredMemory(path, config=...) instead")

    @property
    def folder_settings(self) -> FolderSettings | None:
        """What opens this memory again, in another process too (``TieredMemory(s.path,
        config=s.config, record_store="sqlite", vector_store=s.vector_store)``, whatever that
        process's ``TIERED_MEMORY_*`` settings say), when its folder
        holds all of it: SQLite records and an embedded index. ``None`` for a PostgreSQL store,
        a vector server or engines passed as objects, whose settings carry credentials or cannot
        travel. The embedder, LLM, token counter and clock are not part of it: a folder opened
        again keeps the built-in embedder that made its vectors (and refuses to open without
        the custom one that made them), and has no LLM unless given one."""
        if self._folder_index is None:
            return None
        return FolderSettings(path=self._folder, config=self._config, vector_store=self._folder_index)

    @property
    def llm(self) -> Any:
        """The model that makes episodes and facts smarter (``None``: extractive rules)."""
        return self._llm

    @llm.setter
    def llm(self, value: Any) -> None:
        resolve_llm(value)
        self._llm = value
        if "_layers" in self.__dict__:
            self._layers.llm_source = value

    def _jointly(self, fn: Callable[[], T]) -> T:
        """``fn()`` as one transaction of rows and vectors where both live in one engine. The
        write lock is taken first and held to the commit: a unit never waits for the lock
        while it holds row locks that a lock holder (the access-count flush) may wait for."""
        if self._joint is None:
            return fn()
        with self._write_lock:
            return self._joint(fn)

    # ---- repair -----------------------------------------------------------
    def _repair(self, *, full: bool) -> dict[str, int]:
        with self._write_lock:
            report = repair(store=self.store, index=self.index, embedder=self.embedder,
                            threshold=self.config.dedup_threshold, full=full)
            if full and self._layers_ok():  # episode / fact / item vectors are derived from their rows too
                report.update(self._layers.repair())
                report["items"] = self._items.repair()
            if self._has_layer_rows():  # facts and episodes a crash or failure left pending, as turns
                report.update(self._layers.index_pending())
            return report

    def _has_layer_rows(self) -> bool:
        """Whether the layers may hold rows: a store that never used them has no layer tables,
        and an open must not create them."""
        version = getattr(self.store, "schema_version", None)
        return self._layers_ok() and (version is None or version("layers") > 0)

    def _rebuild(self) -> dict[str, int]:
        with self._write_lock:
            if self._has_layer_rows():
                self._layers.pend_all()
            self.index.reset()
            self.store.reset_indexed()
            self.store.set_meta("embedder", embedder_name(self.embedder))
            report = repair(store=self.store, index=self.index, embedder=self.embedder,
                            threshold=self.config.dedup_threshold, full=False)
            if self._layers_ok():
                report.update(self._layers.reindex())
                report["items"] = self._items.repair()  # the LangGraph store's: an open adapter finds them too
            return report

    # ---- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Refuse new calls, let the calls already running finish (a write whose caller was
        cancelled is stored whole; the calls of a ``working_memory`` or ``item_store`` handle
        too), write pending access counts, wait for background compression, release the
        store. A second close() returns once the first has finished. One made inside a call
        of this memory in the same thread (a progress callback, or a SIGTERM handler that runs
        while the main thread writes) refuses new calls and returns; the call goes on, whole,
        and the memory closes as it returns. In a forked child it only forgets the inherited
        object (the parent owns it)."""
        if self._calls.forked():  # inherited through fork: the parent owns it
            return
        self._calls.close(self._shut)

    def _shut(self) -> None:
        """Close the engines, once no call runs (:meth:`Calls.close` calls it)."""
        try:
            self.parts.access.close()
            if "_layers" in self.__dict__:
                self._layers.close()  # waits for background compression
            try:  # vectors still being written reach the engine before the memory says it closed cleanly
                settle_background_writes(self.store, self.index, wait=True)
            except VectorIndexError as e:  # the rows are pending again: the next open indexes them
                log.warning("%s", e)
            if not getattr(self.store, "shared", False):
                self.store.set_meta("state", "closed")
        finally:
            self.index.close()
            self.store.close()
            if self._lock:
                self._lock.release()

    def __enter__(self) -> "TieredMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    async def aopen(cls, path: str | os.PathLike[str] | None = None, **options: Any) -> "TieredMemory":
        """``TieredMemory(path, **options)`` made in a worker thread: opening reads the store and,
        after an unclean close, repairs it (re-embedding what its index lacks), which would hold
        up an event loop. ``async with await TieredMemory.aopen(path) as memory: ...``"""
        return await to_thread(cls, path, **options)

    async def __aenter__(self) -> "TieredMemory":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()  # close waits for background work: not on the caller's loop

    # ---- writes ----------------------------------------------------------
    @usable
    def add(
        self, role: str, content: str, *, session_id: str, user_id: str,
        metadata: Mapping[str, Any] | None = None, timestamp: Any = None,
    ) -> str:
        """Store one message; returns its id. See :meth:`add_many`."""
        msg = {"role": role, "content": content, "metadata": metadata, "timestamp": timestamp}
        return self.add_many([msg], session_id=session_id, user_id=user_id)[0]

    @usable
    def add_many(
        self, messages: Iterable[Message | Mapping[str, Any]], *, session_id: str, user_id: str,
        progress: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Store messages in order (the bulk path; embeds in batches); returns their ids.

        Every message is validated first; if one is bad, nothing is written and
        :class:`~tiered_memory.errors.InvalidInputError` says which. When this returns,
        the messages are committed. If the vector engine then fails,
        :class:`~tiered_memory.errors.VectorIndexError` is raised, the messages stay
        stored, and they are indexed on the next open or :meth:`rebuild_index`. Where
        rows and vectors share one engine (``vector_store="pgvector"``), they commit in
        one transaction: on any failure nothing of the batch is stored, and the error says so.

        A message may carry its own ``id``: retrying a batch whose call did not return (a
        timeout, a killed worker) then stores it once; the ids are returned either way.

        Any number of messages may go in one call: they are written and indexed in chunks
        of ``MemoryConfig.write_chunk`` (one transaction each), and ``progress(n)`` is
        called after each chunk with its size. A call interrupted half-way has committed
        whole chunks; run it again with the same message ids and it stores the rest.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_callback(progress, "progress")
        rows, chosen = rows_of(messages, session_id=session_id, user_id=user_id, config=self.config, now=time.time())
        if not rows:
            return []
        with self._write_lock:
            if user_id in self._unfinished:  # an interrupted forget of this user is finished first
                self._finish_forgets(only=user_id)
            new = not_yet_stored(self.store, rows, chosen, user_id)
            if new and chosen and self._layers_ok():  # a turn consolidate archived since is stored too
                new = not_yet_archived(new, chosen, user_id, self._layers.rows)
            if not new:
                return [r.id for r in rows]  # a retry of a batch that was stored: nothing to do
            write = functools.partial(write_messages, batch=len(rows), store=self.store, index=self.index,
                                      embedder=self.embedder, config=self.config, progress=progress,
                                      jointly=self._jointly if self._joint is not None else None)
            try:
                write(new)
            except StoreError:
                # another worker storing the same chosen ids at the same moment (a retry racing the
                # call it retries) took their unique keys: what it stored is skipped, the rest written
                left = not_yet_stored(self.store, new, chosen_among(new, chosen), user_id)
                if not chosen or len(left) == len(new):
                    raise
                if left:
                    write(left)
        if self.config.episodes.compress_after_turns is not None and self._layers_ok():  # queued, no LLM here
            self._layers.after_add(user_id, session_id)
        return [r.id for r in rows]

    @usable
    def forget(self, memory_id: str, *, user_id: str) -> None:
        """Delete one message of ``user_id`` from every store and index (and from the archive
        ``consolidate`` moves old turns to). An episode or fact drawn from it stays (it may
        quote it): remove those with :meth:`delete_episode` and :meth:`delete_fact`."""
        check_id(user_id, "user_id")
        check_id(memory_id, "memory_id")

        def drop() -> None:
            archived = self._forget_archived(user_id, ids=[memory_id])
            try:
                drop_message(self.store, self.index, user_id, memory_id)
            except NotFoundError:
                if not archived:
                    raise
            index_orphans(self.store, self.index, self.embedder, user_id, self.config.dedup_threshold)

        with self._write_lock:
            self._jointly(drop)
        forget_texts()

    @usable
    def clear_session(self, session_id: str, *, user_id: str) -> int:
        """Delete a session's messages (archived ones too) and its working memory (items and
        scratchpad); returns how many messages. Episodes and facts already drawn from the
        session stay: remove those with :meth:`delete_episode` and :meth:`delete_fact`."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        with self._write_lock:
            def drop() -> list[str]:
                dropped = drop_session(self.store, self.index, user_id, session_id)
                index_orphans(self.store, self.index, self.embedder, user_id, self.config.dedup_threshold)
                return dropped

            ids = self._jointly(drop)
            archived = self._forget_archived(user_id, session_id=session_id)
            if self._layers_ok():
                self.working_memory(session_id, user_id=user_id).clear()
        forget_texts()
        return len(ids) + archived

    def _forget_archived(self, user_id: str, *, ids: list[str] | None = None, session_id: str | None = None) -> int:
        if not self._layers_ok():
            return 0
        with self._rows.unit() as u:
            return u.forget_archived(user_id, ids=ids or (), session_id=session_id)

    @usable
    def forget_user(self, user_id: str) -> int:
        """Remove every trace of ``user_id`` from every store and index; returns how many messages
        (the turns ``consolidate`` archived too, as :meth:`clear_session` counts them).

        The deletion is recorded in the record store before it starts. If it fails half-way
        (a full disk, a vector engine error, a kill), it is finished on the next open, or
        before the next write for that user, so no row or vector of a forgotten user survives.
        """
        check_id(user_id, "user_id")
        with self._write_lock:
            self.parts.access.flush()  # no pending count may outlive the user's rows
            archived = self._rows.archived_count(user_id) if self._layers_ok() else 0
            self._set_pending_forgets(pending_forgets(self.store) | {user_id})
            ids = self._jointly(lambda: drop_user(self.store, self.index, user_id, joint=self._joint is not None))
            self._set_pending_forgets(pending_forgets(self.store) - {user_id})
        forget_texts()  # no text of theirs stays in the process either (textcache.py)
        return len(ids) + archived

    def _set_pending_forgets(self, users: set[str]) -> None:
        set_pending_forgets(self.store, users)
        self._unfinished = users

    def _finish_forgets(self, only: str | None = None) -> None:
        """Complete deletions a failure interrupted (all at open; one user before a write)."""
        pending = pending_forgets(self.store)
        for user in sorted(pending if only is None else pending & {only}):
            try:
                self.forget_user(user)
            except TieredMemoryError as e:  # still failing: the next open or write tries again
                log.warning("finishing forget_user(%r) failed again: %s", user, e)
                if only is not None:
                    raise

    @usable
    def rebuild_index(self) -> dict[str, int]:
        """Drop the vector index and rebuild it from the record store. Searches that start
        meanwhile wait for it (they never see a missing or half-built index)."""
        with self._gate.writing():
            return self._rebuild()

    # ---- reads -----------------------------------------------------------
    @usable
    def get_messages(self, session_id: str, *, user_id: str, limit: int | None = None) -> list[StoredMessage]:
        """A session's messages, oldest first (the last ``limit`` if given)."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_count(limit, "limit", minimum=0, optional=True)
        return self.store.get_messages(user_id, session_id, limit=limit)

    @usable
    def sessions(self, user_id: str) -> list[SessionInfo]:
        """The user's sessions that hold messages (id, message count, first and last timestamp),
        in the order their first message was stored, not by timestamp: sessions imported or
        added with older timestamps come after those stored before them."""
        check_id(user_id, "user_id")
        return self.store.sessions(user_id)

    @usable
    def get_buffer(self, session_id: str, *, user_id: str) -> list[StoredMessage]:
        """The session's recent whole turns within the buffer's message and token limits."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        return session_buffer(self.parts, user_id, session_id)

    @usable
    def search(
        self, query: str, *, user_id: str, k: int = 10, session_id: str | None = None,
        filters: Mapping[str, Any] | None = None, include_items: bool = False,
    ) -> list[MemoryHit]:
        """Hybrid recall (vector + keyword + recency) over ``user_id``'s memories.

        ``include_items=True`` also searches the user's items written through the LangGraph
        store (hits with ``layer="item"``, see :mod:`.layers.item_recall`); items belong to no
        session and carry no message metadata, so a search with ``session_id`` or ``filters``
        leaves them out."""
        check_id(user_id, "user_id")
        if session_id is not None:
            check_id(session_id, "session_id")
        _query(query)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_COUNT:
            raise InvalidInputError(f"k must be a positive int (at most {MAX_COUNT:,}), got {k!r}")
        check_filters(filters)
        check_flag(include_items, "include_items")
        with_items = include_items and session_id is None and not filters and self._layers_ok()
        now = time.time()
        with self._gate.reading():
            vector = embed_query(self.embedder, query) if with_items else None  # one embedding for both
            hits = search_turns(store=self.store, index=self.index, embedder=self.embedder,
                                config=self.config.retrieval, query=query, user_id=user_id, k=k,
                                session_id=session_id, filters=filters, now=now, vector=vector)
            if with_items:
                items = [as_memory_hit(h) for h in self._items.recall(query, user_id=user_id, k=k, vector=vector)]
                hits = merge_by_score(hits, items, k)
        self.parts.access.note("turn", user_id, [h.id for h in hits if h.layer != ITEM_LAYER], now)
        return hits

    @usable
    def search_sessions(
        self, query: str, *, user_id: str, k: int = 10, turns: int = 3,
        filters: Mapping[str, Any] | None = None,
    ) -> list[SessionHit]:
        """The past sessions of ``user_id`` that hold what ``query`` asks about, best first.

        A session scores as its best turn under :meth:`search`'s ranking; each
        :class:`~tiered_memory.types.SessionHit` carries its best ``turns`` turns (the
        ``filters`` of :meth:`search` apply to them). To find *where* something was talked
        about (the sessions to reread, or whose episodes to load), ten sessions ranked so hold
        more of the right ones than the sessions of the ten best turns.

        Example:
            >>> for found in memory.search_sessions("the trip to Rome", user_id="u1", k=3):
            ...     print(found.session_id, found.hits[0].text)  # doctest: +SKIP
        """
        check_id(user_id, "user_id")
        _query(query)
        check_count(k, "k", minimum=1)
        check_count(turns, "turns", minimum=1)
        check_filters(filters)
        now = time.time()
        with self._gate.reading():
            found = find_sessions(store=self.store, index=self.index, embedder=self.embedder,
                                  config=self.config.retrieval, query=query, user_id=user_id, k=k,
                                  per_session=turns, filters=filters, now=now)
        self.parts.access.note("turn", user_id, [h.id for f in found for h in f.hits], now)
        return found

    @usable
    def build_context(
        self, query: str, *, user_id: str, session_id: str, max_tokens: int | None = None,
        include_items: bool = False,
    ) -> MemoryContext:
        """Recent turns plus working memory, known facts, past sessions and relevant past turns,
        within ``max_tokens``; what did not fit is in ``dropped``. See :mod:`.context.assembly`.
        ``include_items=True`` adds an ``items`` section: the user's LangGraph store items
        that match the query, as quoted data like the rest."""
        check_query(query)
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_count(max_tokens, "max_tokens", minimum=1, optional=True)
        check_flag(include_items, "include_items")
        now = time.time()
        with self._gate.reading():
            context = assemble(self.parts, self._layers if self._layers_ok() else None, query,
                               user_id=user_id, session_id=session_id, max_tokens=max_tokens,
                               items=self._items if include_items and self._layers_ok() else None)
        for layer, ids in accessed(context).items():
            self.parts.access.note(layer, user_id, ids, now)
        return context

    @usable
    def export_jsonl(self, path: str | os.PathLike[str], user_id: str | None = None) -> int:
        """Write one user's memory, or everyone's, as JSONL; returns the number of lines: the
        live turns, then every fact (invalidated ones too, each with its history) and the
        history of deleted ones, every episode (with its key points), how far episodes cover
        each session (so a deleted episode's turns stay covered), every live store item
        (with its TTL), the archived turns, each session's working memory (live items and
        scratchpad) and the audit log. Not in it: pruned working items, expired items,
        vectors (recomputed on import). See :mod:`.portable`."""
        path = check_path(path)
        check_export_target(self.path, path)
        self.parts.access.flush()  # the access counts written are current
        return export_jsonl(self.store, path, user_id, self._rows if self._layers_ok() else None, now=self.parts.now(),
                            max_chars=self.config.max_content_chars,
                            max_metadata_bytes=self.config.max_metadata_bytes)

    @usable
    def import_jsonl(self, path: str | os.PathLike[str], *, skip_invalid: bool = False,
                     progress: Callable[[int], None] | None = None, user_id: str | None = None) -> ImportReport:
        """Import a JSONL export (vectors recomputed); returns an ``ImportReport``. Each line
        goes to the user it names, unless ``user_id`` scopes the import to one user (lines of
        others are then invalid). Facts, episodes, items, archived turns (into the archive)
        and working memory are restored as exported (ids, times, validity, history, access
        counts, importance, TTLs), without resolution or summarising; a working-memory session
        past this memory's capacity evicts as :meth:`WorkingMemory.remember` does. A record
        whose id is already stored (or a session's scratchpad) is skipped and counted."""
        check_flag(skip_invalid, "skip_invalid")
        path = check_path(path)
        check_callback(progress, "progress")
        ok = self._layers_ok()
        return import_jsonl(self.parts, path, skip_invalid=skip_invalid, progress=progress, user_id=user_id,
                            layers=self._layers if ok else None, items=self._items if ok else None)

    @usable
    def stats(self) -> Stats:
        """Counts over every user (:class:`~tiered_memory.types.Stats`): users, sessions and
        messages of the live turns (archived turns are not counted), the messages the vector
        index has taken in (``indexed``), those of them that repeat an earlier message's text and
        got no vector of their own (``duplicates``), and the vectors in the index (turns and
        their chunks, facts, episodes, store items)."""
        c = self.store.counts()
        return Stats(users=c["users"], sessions=c["sessions"], messages=c["messages"],
                     indexed=c["indexed"], duplicates=c["duplicates"], vectors=self.index.count())

    # ---- episodic, semantic and working memory -----------------------------
    @usable
    def end_session(self, session_id: str, *, user_id: str) -> Episode:
        """Extract facts from the session's turns not yet in an episode, then compress them into an
        :class:`~tiered_memory.layers.episodic.Episode` (returned). Without an LLM, or if it fails,
        rules do it (``metadata["method"] == "extractive"``); turns are never lost. Idempotent."""
        episode = self._layers.end_session(check_id(user_id, "user_id"), check_id(session_id, "session_id"))
        assert episode is not None  # only the background path (evicted_only) may find nothing
        return episode

    @usable
    def consolidate(self, user_id: str, progress: Callable[[str, int, int], None] | None = None,
                    ) -> ConsolidationReport:
        """Compress idle sessions, merge near-duplicate facts, promote often-recalled episodes, archive
        old raw turns and prune stale memories; idempotent. See :mod:`.layers.consolidation`."""
        check_id(user_id, "user_id")
        check_callback(progress, "progress")
        self.parts.access.flush()  # promotion and pruning read the access counts
        return self._layers.consolidate(user_id, progress)

    @usable
    def facts(self, user_id: str, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        """The user's facts (``Fact``), optionally of one type; invalidated ones on request."""
        check_id(user_id, "user_id")
        check_flag(include_invalid, "include_invalid")
        self.parts.access.flush()  # the counts shown are current
        return self._layers.facts.select(user_id, type, include_invalid)

    @usable
    def add_fact(self, text: str, *, user_id: str, type: str = "fact", confidence: float = 1.0,
                 metadata: Mapping[str, Any] | None = None) -> Fact:
        """Add a fact through resolution (may update or invalidate a related one); returns the fact."""
        check_id(user_id, "user_id")
        check_fact_text(text)
        check_unit(confidence, "confidence")
        meta = check_metadata(metadata, self.config.max_metadata_bytes)
        return self._jointly(lambda: self._layers.add_fact(user_id, text, type, confidence, meta))

    @usable
    def update_fact(self, /, fact_id: str, *, user_id: str, **changes: Any) -> Fact:
        """Edit ``text``, ``type``, ``confidence`` or ``metadata`` of a fact (recorded in its history)."""
        check_id(user_id, "user_id")
        check_id(fact_id, "fact_id")
        unknown = set(changes) - {"text", "type", "confidence", "metadata"}
        if unknown:
            raise InvalidInputError(f"update_fact can change text, type, confidence and metadata; got {sorted(unknown)}")
        if changes.get("text") is not None:
            check_fact_text(changes["text"])
        if changes.get("confidence") is not None:
            check_unit(changes["confidence"], "confidence")
        if changes.get("metadata") is not None:
            changes["metadata"] = check_metadata(changes["metadata"], self.config.max_metadata_bytes)
        return self._jointly(lambda: self._layers.facts.edit(user_id, fact_id, **changes))

    @usable
    def delete_fact(self, fact_id: str, *, user_id: str) -> None:
        """Delete a fact; its history keeps a ``delete`` entry, with the text (``forget_user``
        erases everything)."""
        check_id(user_id, "user_id")
        check_id(fact_id, "fact_id")
        self._jointly(lambda: self._layers.facts.delete(user_id, fact_id))
        forget_texts()

    @usable
    def delete_episode(self, episode_id: str, *, user_id: str) -> None:
        """Delete an episode (its summary, key points and vectors); the audit log keeps a
        ``delete`` entry. Its turns stay covered: ``end_session`` does not summarise them again.
        With :meth:`clear_session` and :meth:`delete_fact`, what a session left is removable."""
        check_id(user_id, "user_id")
        check_id(episode_id, "episode_id")
        self._layers.episodes.delete(user_id, episode_id)
        forget_texts()

    @usable
    def fact_history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]:
        """The audit trail of the user's facts (``FactChange``), oldest first."""
        if fact_id is not None:
            check_id(fact_id, "fact_id")
        return self._layers.facts.history(check_id(user_id, "user_id"), fact_id)

    @usable
    def audit_log(self, user_id: str, *, layer: str | None = None) -> list[AuditEntry]:
        """What consolidation and eviction did to the user's episodes and working-memory items
        (``AuditEntry``: promote, archive, delete_raw, prune, evict), oldest first; ``layer``:
        ``"episode"`` or ``"working"`` only. Fact changes are in :meth:`fact_history`."""
        check_id(user_id, "user_id")
        if layer is not None and layer not in AUDIT_LAYERS:
            raise InvalidInputError(f"layer must be one of {', '.join(map(repr, AUDIT_LAYERS))} or None, got {layer!r}")
        return self._layers.rows.audit_log(user_id, layer)

    @usable
    def search_facts(self, query: str, *, user_id: str, k: int = 10, type: str | None = None) -> list[FactHit]:
        """Facts by relevance (``FactHit``), optionally of one type; counts as an access."""
        check_id(user_id, "user_id")
        check_count(k, "k", minimum=1)
        now = time.time()
        with self._gate.reading():
            hits = self._layers.facts.search(_query(query), user_id=user_id, k=k, type=type,
                                             retrieval=self.config.retrieval, now=now)
        self.parts.access.note("fact", user_id, [h.fact.id for h in hits], now)
        return hits

    @usable
    def episodes(self, user_id: str, session_id: str | None = None) -> list[Episode]:
        """The user's episodes, oldest first."""
        check_id(user_id, "user_id")
        if session_id is not None:
            check_id(session_id, "session_id")
        self.parts.access.flush()  # the counts shown are current
        return self._layers.episodes.select(user_id, session_id)

    @usable
    def search_episodes(self, query: str, *, user_id: str, k: int = 5) -> list[EpisodeHit]:
        """Whole episodes (``EpisodeHit``) ranked by their best-matching key point and recency."""
        check_id(user_id, "user_id")
        check_count(k, "k", minimum=1)
        now = time.time()
        with self._gate.reading():
            hits = self._layers.episodes.search(_query(query), user_id=user_id, k=k,
                                                retrieval=self.config.retrieval, now=now)
        self.parts.access.note("episode", user_id, [h.episode.id for h in hits], now)
        return hits

    @usable
    def working_memory(self, session_id: str, *, user_id: str) -> WorkingMemory:
        """The session's :class:`~tiered_memory.layers.working.WorkingMemory` (``remember``, ``items``,
        ``scratchpad``)."""
        return self._layers.working(session_id, user_id)

    @usable
    def flush(self, timeout: float | None = None) -> None:
        """Wait for vectors still being written and for background compression queued by
        ``EpisodeConfig.compress_after_turns``, and write the access counts reads have noted.

        Raises:
            VectorIndexError: a background vector write failed; its messages stay stored
                and are indexed on the next open or by :meth:`rebuild_index`.
        """
        timeout = check_timeout(timeout)
        with self._write_lock:
            settle_background_writes(self.store, self.index, wait=True)
        self.parts.access.flush()
        if "_layers" in self.__dict__:
            self._layers.wait(timeout)

    # ---- async twins: the sync method, run in a worker thread --------------
    aadd = twin(add)
    aadd_many = twin(add_many)
    aforget = twin(forget)
    aclear_session = twin(clear_session)
    aforget_user = twin(forget_user)
    arebuild_index = twin(rebuild_index)
    aget_messages = twin(get_messages)
    aget_buffer = twin(get_buffer)
    asessions = twin(sessions)
    asearch = twin(search)
    asearch_sessions = twin(search_sessions)
    abuild_context = twin(build_context)
    aend_session = twin(end_session)
    aconsolidate = twin(consolidate)
    afacts = twin(facts)
    aadd_fact = twin(add_fact)
    aupdate_fact = twin(update_fact)
    adelete_fact = twin(delete_fact)
    adelete_episode = twin(delete_episode)
    afact_history = twin(fact_history)
    aaudit_log = twin(audit_log)
    asearch_facts = twin(search_facts)
    aepisodes = twin(episodes)
    asearch_episodes = twin(search_episodes)
    astats = twin(stats)
    aexport_jsonl = twin(export_jsonl)
    aimport_jsonl = twin(import_jsonl)
    aflush = twin(flush)
    aclose = twin(close)
