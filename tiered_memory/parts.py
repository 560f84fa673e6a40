"""The bundle of parts every layer works with, and the access log that keeps reads
read-only.

:class:`Parts` is what the facade hands down: the record store, the vector index, the
embedder, the config, the write lock, the token counter and the clock, plus the
:class:`AccessLog` and the memory's :class:`~tiered_memory.guard.Calls` (which the handles it
hands out run their calls under); the layers get their repositories beside it. Layers receive it and
never the facade, so they can only look down. Its ``now()`` is the clock's time, checked to be
epoch seconds (:func:`clock_seconds`) before anything is dated by it.

:class:`AccessLog` is why ``search`` and ``build_context`` commit nothing: what they hand
to the caller is noted in memory, and the access counts and last-access times reach the
record store in batches: from a background thread when the log holds
``MemoryConfig.access_flush_size`` entries or is ``access_flush_seconds`` old, before
anything that reads those counts (listing facts or episodes, ``consolidate``), and on
``close``. A batch the store could not write (its server down) is kept for the next flush,
up to :data:`KEPT_FLUSHES` flushes' worth; ``close`` then only logs it. A crash loses at most
the unflushed counts, never a record.
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal

from .config import MemoryConfig
from .embedding import Embedder
from .errors import ConfigurationError, RuntimeFailure
from .guard import Calls
from .store.base import RecordStore
from .tokens import TokenCounter
from .validation import MAX_TIMESTAMP, MIN_TIMESTAMP
from .vector.base import VectorIndex

log = logging.getLogger("tiered_memory")

AccessLayer = Literal["turn", "fact", "episode", "working"]
# layer -> (user_id, ids, now) -> None: the write that applies one batch of accesses
Toucher = Callable[[str, list[str], float], None]
#: how many flushes' worth of accesses a store that cannot be written keeps waiting; past that
#: a failed batch is dropped (counts are bookkeeping: never worth unbounded memory)
KEPT_FLUSHES = 8


class AccessLog:
    """Accesses noted by reads, written later in batches by ``toucher`` per layer.

    Args:
        touchers: for each layer, the function that adds one access per listed id
            (ids may repeat) and sets their last access to ``now``, on rows of the given
            user only: by the time a batch is written, an id may have been forgotten and
            taken by another user's record.
        lock: the memory's write lock, held while a batch is written.
        flush_size: entries that make the background thread flush.
        flush_seconds: the longest an entry waits for a flush.
    """

    def __init__(self, touchers: dict[AccessLayer, Toucher], lock: threading.RLock, *,
                 flush_size: int = 512, flush_seconds: float = 30.0) -> None:
        self._touchers = touchers
        self._write_lock = lock
        self.flush_size = flush_size
        self.flush_seconds = flush_seconds
        self._guard = threading.Lock()
        self._pending: dict[tuple[AccessLayer, str], list[str]] = {}
        self._last: dict[tuple[AccessLayer, str], float] = {}
        self._size = 0
        self._oldest: float | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def note(self, layer: AccessLayer, user_id: str, ids: Iterable[str], now: float) -> None:
        """Remember that ``ids`` of ``user_id`` were handed to a caller at ``now`` (no I/O)."""
        ids = list(ids)
        if not ids or layer not in self._touchers:
            return
        with self._guard:
            if self._closed:
                return
            self._pending.setdefault((layer, user_id), []).extend(ids)
            self._last[(layer, user_id)] = max(now, self._last.get((layer, user_id), now))
            self._size += len(ids)
            if self._oldest is None:
                self._oldest = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tiered-memory-access", daemon=True)
                self._thread.start()
            if self._size >= self.flush_size:
                self._wake.set()

    @property
    def pending(self) -> int:
        """Accesses noted and not yet written."""
        return self._size

    def flush(self) -> int:
        """Write every pending access now; returns how many were written."""
        with self._guard:
            batch, last = self._pending, self._last
            self._pending, self._last, self._size, self._oldest = {}, {}, 0, None
        written = 0
        if not batch:
            return 0
        with self._write_lock:
            for key, ids in sorted(batch.items()):
                try:
                    self._touchers[key[0]](key[1], ids, last[key])
                except BaseException:  # one transaction each: this one and the rest are unwritten
                    self._keep({k: v for k, v in batch.items() if k >= key}, last)
                    raise
                written += len(ids)
        return written

    def _keep(self, batch: dict[tuple[AccessLayer, str], list[str]], last: dict[tuple[AccessLayer, str], float]) -> None:
        """Put back the accesses of a failed flush, unless that would hold too many."""
        with self._guard:
            if self._size + sum(map(len, batch.values())) > KEPT_FLUSHES * self.flush_size:
                log.warning("dropping %d access counts that could not be written", sum(map(len, batch.values())))
                return
            for key, ids in batch.items():
                self._pending[key] = ids + self._pending.get(key, [])
                self._last[key] = max(last[key], self._last.get(key, last[key]))
                self._size += len(ids)
            if self._oldest is None:
                self._oldest = time.monotonic()

    def _run(self) -> None:
        while True:
            self._wake.wait(timeout=self.flush_seconds)
            self._wake.clear()
            with self._guard:
                if self._closed:
                    return
                due = self._size >= self.flush_size or (
                    self._oldest is not None and time.monotonic() - self._oldest >= self.flush_seconds)
            if due:
                try:
                    self.flush()
                except RuntimeFailure as e:  # bookkeeping only: the next flush or close tries again
                    log.warning("writing access counts failed; they will be retried (%s)", e)
                except Exception:
                    log.exception("writing access counts failed; they will be retried")

    def close(self) -> None:
        """Write what is pending and stop the background thread. A store that cannot be
        written (its server down) is logged, not raised: the records are safe, only counts lost."""
        try:
            self.flush()
        except RuntimeFailure as e:
            log.warning("%d access counts were not written on close (%s)", self.pending, e)
        finally:
            with self._guard:
                self._closed = True
            self._wake.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=5)


def run_now(fn: Callable[[], Any]) -> Any:
    """``fn()``: how a write runs where rows and vectors live in two engines."""
    return fn()


def no_user_lock(user_id: str) -> AbstractContextManager[None]:
    """No lock of a user's own (a memory whose deletions all run under the write lock)."""
    return nullcontext()


def nothing_unfinished(user_id: str) -> None:
    """No deletion of the user left to finish (a memory whose deletions never stop half-way)."""


@dataclass(frozen=True, kw_only=True)
class Parts:
    """What a layer may use. Built once by :class:`~tiered_memory.TieredMemory`; the layers
    get their repositories beside it (a record store may have none)."""

    store: RecordStore
    index: VectorIndex
    embedder: Embedder
    config: MemoryConfig
    lock: threading.RLock
    count_tokens: TokenCounter
    access: AccessLog
    #: the memory's running calls: a handle's calls are refused and waited for by its close()
    calls: Calls
    clock: Callable[[], float] = time.time
    #: runs a write of rows and vectors as one transaction where both live in one engine
    #: (pgvector in the record store), else simply runs it
    jointly: Callable[[Callable[[], Any]], Any] = run_now
    #: the lock of one user's writes and deletions (:mod:`.user_locks`), taken before ``lock``
    user_lock: Callable[[str], AbstractContextManager[None]] = no_user_lock
    #: finishes a ``forget_user`` of the user that a failure interrupted, under ``lock``, before a
    #: write of theirs: finished after it (the next open, the user's next ``add``), it would delete
    #: what that write stored (``add_many`` does the same)
    finish_forget: Callable[[str], None] = nothing_unfinished

    @contextmanager
    def writing(self, *users: str | None) -> Iterator[None]:
        """``lock``, taken after the lock of each of ``users`` (sorted, so two writes of several
        users never wait for each other's; ``None``, an import of every user, takes none): a write
        for a user whose deletion runs outside the write lock waits here for it, not at its vector
        write holding the write lock (:mod:`.user_locks`). None is taken by a thread holding the
        write lock already (``UserLocks.user``): the lock order stays a user's, then the write lock. A
        ``forget_user`` of one of ``users`` that a failure interrupted is finished first
        (``finish_forget``; still failing, it raises and nothing is written). Inside a unit of
        ``jointly`` (pgvector) the finish commits with the write: rolled back, or run again, it is
        unfinished again for the next write (``MemoryEngines._jointly``)."""
        wanted = sorted({u for u in users if u is not None})
        with ExitStack() as held:
            for user in wanted:
                held.enter_context(self.user_lock(user))
            with self.lock:
                for user in wanted:
                    self.finish_forget(user)
                yield

    def now(self) -> float:
        """The clock's time, checked (:func:`clock_seconds`): a clock of another kind is a
        ConfigurationError before anything is dated by it."""
        return clock_seconds(self.clock())


class WritingLock:
    """``parts.writing(user_id)`` as a lock object, taken by ``with`` as often as wanted, from any
    thread: a session's working memory holds one for its writes (the user's lock, then the write
    lock, an interrupted ``forget_user`` of theirs finished first)."""

    def __init__(self, parts: Parts, user_id: str) -> None:
        self._parts, self._user_id, self._held = parts, user_id, threading.local()

    def __enter__(self) -> None:
        held = ExitStack()
        held.enter_context(self._parts.writing(self._user_id))
        self._held.__dict__.setdefault("stack", []).append(held)

    def __exit__(self, *exc: Any) -> None:
        self._held.stack.pop().__exit__(*exc)


def clock_seconds(value: object) -> float:
    """What the memory's clock (``TieredMemory(clock=)``) returned, if it is seconds since the
    epoch: a real number (numpy's too), finite, within 1900..2200 as every stored time is (pure). Its time
    dates what is written (a working item, a scratchpad, a store item's TTL), so a clock of
    another kind would store times that no read can judge.

    Raises:
        ConfigurationError: anything else (``clock=datetime.now`` in place of ``time.time``, a
            clock in milliseconds, NaN).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's numbers too
        raise ConfigurationError(f"the memory's clock returned a {type(value).__name__} ({value!r:.60}), not seconds "
                                 "since the epoch: pass clock=time.time, or a function returning such a float "
                                 "(for a datetime d, d.timestamp())")
    seconds = float(value)
    if not math.isfinite(seconds) or not MIN_TIMESTAMP <= seconds < MAX_TIMESTAMP:
        ms = math.isfinite(seconds) and MAX_TIMESTAMP <= abs(seconds) < MAX_TIMESTAMP * 1000
        raise ConfigurationError(f"the memory's clock returned {seconds!r}, not seconds since the epoch within "
                                 "1900..2200" + ("; it looks like milliseconds: divide by 1000" if ms else ""))
    return seconds
