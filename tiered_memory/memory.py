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

The public calls come in groups, one module each, over :class:`~.memory_engines.MemoryEngines`
(what an open memory holds, and the pending-vector pass): :mod:`.memory_writes`,
:mod:`.memory_reads` and :mod:`.memory_layers`; this module opens and closes a memory and
holds the calls on the whole of it (``stats``, ``export_jsonl``, ``import_jsonl``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .aio import ReadWriteGate, open_in_thread, twin
from .arguments import check_parts
from .backends import (
    attach_sessions,
    check_index_folder,
    configured_record_store,
    configured_vector_store,
    is_embedded_index,
    joint_writes,
    open_record_store,
    open_vector_index,
    unnamed_index,
    VECTOR_STORE_ENV,
)
from .config import MemoryConfig, check_config
from .embedding import Embedder, default_embedder
from .errors import ConfigurationError, InvalidInputError, StoreError, VectorIndexError
from .guard import Calls, usable
from .layers.working import touch_items
from .llm.adapters import resolve_llm
from .memory_folder import STORE_ENTRIES as STORE_ENTRIES, check_export_target, foreign_entries as foreign_entries
from .memory_layers import MemoryLayers
from .memory_reads import MemoryReads
from .memory_writes import MemoryWrites
from .parts import AccessLog, Parts
from .portable import ImportReport, export_jsonl, import_jsonl
from .recall.indexing import settle_background_writes
from .recall.search import turn_weights
from .startup import startup_repair
from .store.base import RecordStore
from .tokens import CachedCounter, TokenCounter, default_token_counter
from .types import Stats
from .user_locks import UserLocks, gated_index
from .validation import check_callback, check_flag, check_path
from .vector.base import VectorIndex
from .vector.identity import index_name
from .writes import pending_forgets

log = logging.getLogger("tiered_memory")


def default_path() -> Path:
    """``$TIERED_MEMORY_HOME`` or ``~/.tiered-memory``."""
    return Path(os.environ.get("TIERED_MEMORY_HOME") or Path.home() / ".tiered-memory")


@dataclass(frozen=True, kw_only=True)
class FolderSettings:
    """What opens a memory whose folder holds all of it (see :attr:`TieredMemory.folder_settings`)."""

    path: Path
    config: MemoryConfig
    vector_store: str  # "chroma" or "qdrant", in the folder


class TieredMemory(MemoryWrites, MemoryReads, MemoryLayers):
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
            ``$TIERED_MEMORY_VECTOR_STORE``, else the index the records were last indexed into
            (the folder's Qdrant, pgvector; one a setting cannot make, a server's or an object,
            is a ``ConfigurationError`` naming it), else ``"chroma"``.
        record_store: a :class:`~tiered_memory.store.base.RecordStore`, ``"sqlite"`` (SQLite in
            ``path``) or a ``postgresql://`` URL; unset, ``$TIERED_MEMORY_RECORD_STORE``, else SQLite.
        token_counter: ``str -> int`` (or a float: ``len(text) / 4``), a pure function of the
            text (its counts are remembered); default cl100k offline, else a heuristic.
        llm: makes episodes and facts smarter: any object with ``async def complete(...)``,
            a LangChain chat model or a LlamaIndex LLM.
        clock: ``() -> float`` seconds since the epoch (default ``time.time``), the time of
            the store items (their TTL) and of working memory (when an item is remembered,
            how far its importance has decayed in ``items``, eviction, ``build_context`` and
            ``consolidate``'s prune, the scratchpad's ``updated_at``); a simulation or a test
            can move time on without sleeping. Turns, facts and episodes are dated by the
            system clock. A time that is not epoch seconds within 1900..2200 (a datetime from
            ``clock=datetime.now``, milliseconds, NaN) is a ``ConfigurationError`` at the call
            that reads it, before anything is written.

    The attributes ``store``, ``index`` and ``parts`` are the engines underneath (the record
    store, the vector index, the layers' shared parts), there for tests, benchmarks and repair
    tools. They are not the API: they take no user scope of their own, skip the checks, locks
    and caches of these methods, and may change between versions. (``parts.index`` is ``index``
    behind the gate of :mod:`~tiered_memory.user_locks`, where rows and vectors live in two engines.)

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
        named = vector_store is not None or bool(os.environ.get(VECTOR_STORE_ENV))  # else: the records' last index
        vector_store = configured_vector_store(vector_store)  # so does a bad vector server URL or collection
        records = record_store if record_store is not None else configured_record_store()
        records_in_folder = records is None or isinstance(records, str) and records == "sqlite"
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
        if named or records_in_folder and not (self.path / "records.sqlite3").exists():  # before anything is made
            check_index_folder(self.path, vector_store)
        self._folder = self.path.resolve()  # the folder opened: a relative path names another after a chdir
        self._calls = Calls()  # close() waits for the calls running when it starts, the handles' too
        self._write_lock = threading.RLock()
        self._users = UserLocks(self._write_lock)  # a user's writes wait for its deletion, the others' do not
        self._gate = ReadWriteGate()  # reads wait while rebuild_index replaces the vector index
        try:
            self.store, self._lock = open_record_store(self.path, record_store, owner=self)
        except OSError as e:
            raise StoreError(f"cannot open the memory at {self.path}: {e.strerror or e}") from e
        try:
            if embedder is None:  # the store's own, if one of ours made its vectors: no silent re-embed
                self.embedder = default_embedder(self.config.embed_batch_size, recorded=self.store.get_meta("embedder"))
            if not named:  # the index the records were last indexed into, not a second one beside it
                vector_store = unnamed_index(self.store, records_in_folder=records_in_folder)
                check_index_folder(self.path, vector_store)
            self._folder_index: str | None = (
                vector_store if records_in_folder and isinstance(vector_store, str) and is_embedded_index(vector_store)
                else None)
            self.index, self._lock = open_vector_index(self.path, vector_store, self.store, self._lock, owner=self)
            attach_sessions(self.index, self.store)
            self._joint = joint_writes(self.store, self.index)  # None: rows and vectors in two engines
            # what writes vectors writes them through the gate: forget_user deletes a user's vectors
            # outside the write lock, and a write of theirs waits meanwhile (.user_locks)
            gated = gated_index(self.index, self._users) if self._joint is None else self.index
            self.parts = Parts(
                store=self.store, index=gated, embedder=self.embedder, config=self.config,
                lock=self._write_lock, count_tokens=self.count_tokens,
                access=AccessLog({"turn": lambda user, ids, now: self.store.touch(user, ids, now),
                                  "fact": lambda user, ids, now: self._layers.facts.touch(user, ids, now),
                                  "episode": lambda user, ids, now: self._layers.episodes.touch(user, ids, now),
                                  "working": lambda user, ids, now: touch_items(self._layers.rows, user, ids, now)},
                                 self._write_lock, flush_size=self.config.access_flush_size,
                                 flush_seconds=self.config.access_flush_seconds),
                calls=self._calls, clock=clock or time.time, jointly=self._jointly, user_lock=self._users.user,
                finish_forget=self._finish_forget_of)
            self._index_name = index_name(self.index, folder=self._folder, records_in_folder=records_in_folder)
            self._owed, self._unfinished = False, set()  # the deletions left unfinished: read below
            self._pay_owed()  # first: a row stored again under a deleted id is indexed after its old vectors go
            startup_repair(self.store, self.index, self.embedder,
                           repair=lambda full: self._repair(full=full), rebuild=self._rebuild,
                           index_in_folder=self._lock is not None and is_embedded_index(vector_store),
                           name=self._index_name)
            self._unfinished = pending_forgets(self.store)
            self._finish_forgets()  # and the vectors deleted rows still owe the index
        except BaseException as e:
            self.store.close()
            if self._lock:
                self._lock.release()
            if isinstance(e, (OSError, sqlite3.Error)):
                raise StoreError(f"cannot open the memory at {self.path}: {e}") from e
            raise

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

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun (every new call is refused). A memory inherited
        through ``fork`` is not closed by the child: its calls are refused there for that reason."""
        return self._calls.refusing()

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
        self._calls.check()  # a closed memory's block would fail at its first call
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    async def aopen(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        config: MemoryConfig | None = None,
        embedder: Embedder | None = None,
        vector_store: VectorIndex | str | None = None,
        record_store: RecordStore | str | None = None,
        token_counter: TokenCounter | None = None,
        llm: Any = None,
        clock: Callable[[], float] | None = None,
    ) -> "TieredMemory":
        """``TieredMemory(path, ...)`` made in a worker thread: opening reads the store and,
        after an unclean close, repairs it (re-embedding what its index lacks), which would hold
        up an event loop. ``async with await TieredMemory.aopen(path) as memory: ...``
        The parameters are the constructor's, spelt out so type checkers see them (a test keeps
        them equal)."""
        return await open_in_thread(cls, path, config=config, embedder=embedder, vector_store=vector_store,
                                    record_store=record_store, token_counter=token_counter, llm=llm, clock=clock)

    async def __aenter__(self) -> "TieredMemory":
        self._calls.check()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()  # close waits for background work: not on the caller's loop

    # ---- the whole memory: moved as JSONL, counted ---------------------------
    @usable
    def export_jsonl(self, path: str | os.PathLike[str], user_id: str | None = None) -> int:
        """Write one user's memory, or everyone's, as JSONL; returns the number of lines: the
        live turns, then every fact (invalidated ones too, each with its history) and the
        history of deleted ones, every episode (with its key points), how far episodes cover
        each session (so their turns are not summarised again), every live store item
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
                     progress: Callable[[int], None] | None = None, user_id: str | None = None,
                     checked: Callable[[int], None] | None = None) -> ImportReport:
        """Import a JSONL export (vectors recomputed); returns an ``ImportReport``. Each line
        goes to the user it names, unless ``user_id`` scopes the import to one user (lines of
        others are then invalid). Facts, episodes, items, archived turns (into the archive)
        and working memory are restored as exported (ids, times, validity, history, access
        counts, importance, TTLs), without resolution or summarising; a working-memory session
        past this memory's capacity evicts as :meth:`WorkingMemory.remember` does. A record
        whose id is already stored (or a session's scratchpad) is skipped and counted. A
        ``forget_user`` a failure left unfinished (of ``user_id``, or of any user) is finished
        first, so it never deletes what the import writes. ``checked(n)`` is called once every
        line is checked, before any is written, with the number of valid lines (what ``progress``
        counts up to when none is stored yet: a progress bar's total, without reading the file
        again)."""
        check_flag(skip_invalid, "skip_invalid")
        path = check_path(path)
        check_callback(progress, "progress", 1)
        check_callback(checked, "checked", 1)
        ok = self._layers_ok()
        # the user's lock first (scoped to one user: .user_locks); an index failure leaves rows pending
        # for the next write
        with self.parts.writing(user_id), self._owing():
            # a forget_user left unfinished is finished first, as add_many does: finished later (the
            # next open), it would delete the rows this import writes for that user
            for user in sorted(self._unfinished if user_id is None else self._unfinished & {user_id}):
                self._finish_forgets(only=user)
            return import_jsonl(self.parts, path, skip_invalid=skip_invalid, progress=progress, user_id=user_id,
                                layers=self._layers if ok else None, items=self._items if ok else None,
                                checked=checked)

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

    astats = twin(stats)
    aexport_jsonl = twin(export_jsonl)
    aimport_jsonl = twin(import_jsonl, user="user_id")  # scoped to a user, it waits for their lock on the loop
    aclose = twin(close)
