"""What a :class:`~.memory.TieredMemory` holds open, under its public calls: the engines
(record store, vector index, embedder), the :class:`~.parts.Parts` its layers share and the
layers themselves (created on first use), the handles it hands out (a session's working
memory, the LangGraph store's items), the one transaction of rows and vectors where both
live in one engine, and the pending-vector pass: the repair an open runs, ``rebuild_index``
and ``flush``, and the deletions the index owes (paid at open and before a write).

:class:`MemoryEngines` declares the attributes ``TieredMemory.__init__`` sets; the call
groups above it (:mod:`.memory_writes`, :mod:`.memory_reads`, :mod:`.memory_layers`) use
only these.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeVar

from .aio import ReadWriteGate, twin
from .backends import open_layer_store, supports_layers
from .config import MemoryConfig
from .embedding import Embedder, embedder_name
from .errors import InvalidInputError, UsageError, VectorIndexError
from .guard import Calls, usable
from .layers.items import ItemStore
from .layers.longterm import Layers
from .layers.working import WorkingMemory, reembed as reembed_working
from .parts import Parts
from .recall.forgetting import all_owed, clear_owed, pay_owed
from .recall.indexing import repair, settle_background_writes
from .startup import REPAIR_DUE
from .store.base import RecordStore
from .store.repositories import LayerRepository
from .tokens import TokenCounter
from .user_locks import UserLocks
from .validation import check_query, check_timeout
from .vector.base import VectorIndex
from .vector.identity import INDEX_META

T = TypeVar("T")
log = logging.getLogger("tiered_memory")


def nonempty_query(query: object) -> str:
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query must be a non-empty string")
    return check_query(query)


class Joint(Protocol):
    """Runs ``fn`` as one transaction of rows and vectors (:func:`~.backends.joint_writes`)."""

    def __call__(self, fn: Callable[[], T], /) -> T: ...


class MemoryEngines:
    """The engines and parts of an open memory; :class:`~.memory.TieredMemory` sets them as it
    opens (see its docstring for ``store``, ``index`` and ``parts``)."""

    store: RecordStore
    index: VectorIndex
    embedder: Embedder
    count_tokens: TokenCounter
    parts: Parts
    path: Path
    _config: MemoryConfig
    _llm: Any
    _calls: Calls
    _write_lock: threading.RLock
    _gate: ReadWriteGate
    _users: UserLocks  # a lock per user, taken before the write lock (see .user_locks)
    _joint: Joint | None  # None: rows and vectors in two engines
    _unfinished: set[str]  # users whose forget_user a failure interrupted, as this process knows them
    _in_unit = False  # a unit of _jointly runs (read and set under the write lock)
    _owed: bool  # a deletion of this process left vectors owed: paid before the next write
    _index_name: str  # the index's name, recorded by a rebuild (see .vector.identity)

    # ---- the parts below the facade --------------------------------------
    @functools.cached_property
    def _rows(self) -> LayerRepository:
        """The layer repositories of the record store, opened (and migrated) once."""
        return open_layer_store(self.store)

    @functools.cached_property
    def _layers(self) -> Layers:
        """Episodic, semantic and working memory, created on first use."""
        return Layers(self.parts, self._rows, self._llm, owing=self._note_owed)

    def _note_owed(self) -> None:
        """Background work left vectors pending: the next write or call writes them first."""
        self._owed = True

    def _layers_ok(self) -> bool:
        return supports_layers(self.store)

    @functools.cached_property
    def _items(self) -> ItemStore:
        return ItemStore(self.parts, self._rows)

    @usable
    def item_store(self) -> ItemStore:
        """The namespaced key-value items behind the LangGraph store adapter."""
        return self._items

    @usable
    def working_memory(self, session_id: str, *, user_id: str) -> WorkingMemory:
        """The session's :class:`~tiered_memory.layers.working.WorkingMemory` (``remember``, ``items``,
        ``scratchpad``)."""
        return self._layers.working(session_id, user_id)

    @property
    def config(self) -> MemoryConfig:
        """The configuration this memory was opened with (fixed: every part holds it)."""
        return self._config

    @config.setter
    def config(self, value: MemoryConfig) -> None:
        raise UsageError("a memory's config is fixed when it opens, since every part holds it: "
                         "close this one and open TieredMemory(path, config=...) instead")

    def _jointly(self, fn: Callable[[], T]) -> T:
        """``fn()`` as one transaction of rows and vectors where both live in one engine. The
        write lock is taken first and held to the commit: a unit never waits for the lock
        while it holds row locks that a lock holder (the access-count flush) may wait for.

        A write finishes an interrupted ``forget_user`` of its user inside its unit
        (``Parts.writing``): the users left unfinished (``_unfinished``) are what the unit found,
        at each run of ``fn`` (the unit runs it again on a conflict) and after a failure (rolled
        back, the finish with it; or its commit in doubt): the next write finishes it again."""
        if self._joint is None:
            return fn()
        with self._write_lock:
            if self._in_unit:  # joins the unit this thread runs
                return self._joint(fn)
            unfinished = set(self._unfinished)

            def attempt() -> T:
                self._unfinished = set(unfinished)
                return fn()

            self._in_unit = True
            try:
                return self._joint(attempt)
            except BaseException:
                self._unfinished |= unfinished
                raise
            finally:
                self._in_unit = False

    # ---- the pending-vector pass: repair at open, rebuild, flush -----------
    def _repair(self, *, full: bool) -> dict[str, int]:
        with self._write_lock:
            left: list[VectorIndexError] = []  # turns the index refused: the layers' rows do not wait behind them
            if full:  # till every kind is compared: one cut short runs again at the next open
                self.store.set_meta(REPAIR_DUE, "full")
            report = repair(store=self.store, index=self.parts.index, embedder=self.embedder,
                            threshold=self.config.dedup_threshold, full=full, skipped=left)
            if full and self._layers_ok():  # episode / fact / item vectors are derived from their rows too
                report.update(self._layers.repair(skipped=left))
                report["items"] = self._items.repair(skipped=left)
            if full:  # what it could not write is pending or owed now
                self.store.set_meta(REPAIR_DUE, "")
            if self._has_layer_rows():  # facts and episodes a crash or failure left pending, as turns
                report.update(self._layers.index_pending(skipped=left))
                if items := self._items.pay_owed():  # and store items a failed write left unindexed
                    report["items_pending"] = items
            if left:
                raise left[0]
            return report

    def _has_layer_rows(self) -> bool:
        """Whether the layers may hold rows: a store that never used them has no layer tables,
        and an open must not create them."""
        version = getattr(self.store, "schema_version", None)
        return self._layers_ok() and (version is None or version("layers") > 0)

    @contextlib.contextmanager
    def _owing(self) -> Iterator[None]:
        """Run a deletion: should the index fail to delete its vectors, they stay owed (recorded
        with the rows' deletion) and the next write pays them first."""
        try:
            yield
        except VectorIndexError:
            self._owed = True
            raise

    def _pay_owed(self) -> None:
        """Delete the vectors deleted rows still owe the index (:mod:`.recall.forgetting`), then
        index what was left pending meanwhile, as an open does (turns, facts, episodes, store
        items: an id stored again waits for its old vectors to go); an index still failing leaves
        them owed, for the next write or open."""
        with self._write_lock:
            # deletions the index refused (the others paid) hold back no pending row: each id is paid first, or skipped
            skipped: list[VectorIndexError] = []
            try:
                self._jointly(lambda: pay_owed(self.store, self.index, skipped=skipped))
                if self._owed:  # this process deferred or failed something: index what is pending
                    self._repair(full=False)
                self._owed = bool(skipped)
            except VectorIndexError as e:
                self._owed = True
                skipped.append(e)
            for error in skipped:
                log.warning("%s", error)

    def _rebuild(self) -> dict[str, int]:
        with self._write_lock:
            layered = self._has_layer_rows()
            if layered:
                self._layers.pend_all()
            # working items keep their vectors in their rows: re-embedded before the new embedder is
            # recorded, so a rebuild cut short does them again at the next open
            working = reembed_working(self._rows, self.embedder, self._write_lock) if layered else 0
            owed = all_owed(self.store)
            self.index.reset()
            clear_owed(self.store, owed)  # all dropped
            self._owed = False
            self.store.reset_indexed()
            self.store.set_meta("embedder", embedder_name(self.embedder))
            report = repair(store=self.store, index=self.parts.index, embedder=self.embedder,
                            threshold=self.config.dedup_threshold, full=False)
            left: list[VectorIndexError] = []  # facts and episodes refused, left pending: raised once the rest is done
            if self._layers_ok():
                report.update(self._layers.reindex(skipped=left))
                report["items"] = self._items.repair()  # the LangGraph store's: an open adapter finds them too
            report["working_items"] = working
            self.store.set_meta(INDEX_META, self._index_name)  # the records are in line with this index now
            self.store.set_meta(REPAIR_DUE, "")  # every kind compared: a full repair cut short needs no rerun
            if left:
                raise left[0]
            return report

    @usable
    def rebuild_index(self) -> dict[str, int]:
        """Drop the vector index and rebuild it from the record store. Searches that start
        meanwhile wait for it (they never see a missing or half-built index)."""
        with self._gate.writing():
            return self._rebuild()

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

    arebuild_index = twin(rebuild_index)
    aflush = twin(flush)
