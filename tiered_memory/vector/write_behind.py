"""Write-behind for an embedded index: upserts reach the engine from one background thread.

An embedded engine charges a fixed cost per write call (Chroma: 6-13 ms for one vector,
with eight fsyncs; bench/README.md), so a caller adding one session at a time paid it on
every call. Here the calls of many batches become one engine write while the caller goes
on embedding and storing the next batch.

Invariants:

- Only an index that is the one writer of its folder may use it, with its users' vectors
  held in memory (:mod:`.exact`): a query of a held user sees an upsert at once, and
  every other read of the engine (a query of a user not held, ``ids``, ``count``, a load
  for the exact scan) first waits for what is queued, so nothing reads a stale engine.
- Writes reach the engine in the order they were queued; a delete, reset or close waits
  for the queue first, so it never overtakes an upsert of the same id.
- A vector lost here is never lost for good: the rows were marked indexed, so a crash
  leaves the memory flagged unclean and the next open's full repair re-embeds what the
  engine lacks; a failed background write keeps its ids for the caller
  (:meth:`WriteBehind.take_lost`), which puts them back to pending.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .base import VectorItem

log = logging.getLogger("tiered_memory")


class WriteBehind:
    """One background writer draining a queue of upserts through ``write``.

    The writer lingers while the caller keeps adding: it writes once ``batch`` items are
    queued, once no batch arrived for ``linger`` seconds, or at once when anyone waits for
    the engine. Chroma holds the GIL through much of a write, so a write in the middle of
    a bulk load stalls the caller as much as it would have cost it; a few large writes
    stall it least.

    Args:
        write: the engine's own upsert of a list of items (called from the writer thread,
            with what is queued, each id once with its latest vector).
        most: items per engine call at most.
    """

    def __init__(self, write: Callable[[list[VectorItem]], None], *, batch: int = 500, most: int = 2000,
                 linger: float = 0.02) -> None:
        self._write = write
        self._batch = batch
        self._most = most
        self._linger = linger
        self._queue: list[VectorItem] = []
        self._submits = 0
        self._waiting = 0
        self._busy = False
        self._lost: list[str] = []
        self._error: Exception | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, items: list[VectorItem]) -> None:
        """Queue ``items`` for the engine; returns at once."""
        if not items:
            return
        with self._cond:
            if self._closed:
                raise RuntimeError("the vector index is closed")
            self._queue.extend(items)
            self._submits += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tiered-memory-vector-writer", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far reached the engine (or failed); ``False`` on timeout."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()  # a lingering writer writes now
            try:
                return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)
            finally:
                self._waiting -= 1

    def take_lost(self) -> tuple[list[str], Exception | None]:
        """After :meth:`wait`: the ids a background write failed to write since the last call,
        and the first error, then forgets both."""
        with self._cond:
            lost, error = self._lost, self._error
            self._lost, self._error = [], None
            return lost, error

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                while len(self._queue) < self._batch and not self._waiting and not self._closed:
                    seen = self._submits
                    self._cond.wait(self._linger)
                    if self._submits == seen:  # quiet for a linger: the caller paused
                        break
                batch, self._queue = self._queue[:self._most], self._queue[self._most:]
                self._busy = True
            latest = list({i.id: i for i in batch}.values())  # an engine call takes each id once
            try:
                self._write(latest)
            except Exception as e:  # the caller is told at its next write (take_lost)
                log.warning("writing %d vectors in the background failed: %s", len(latest), e)
                with self._cond:
                    self._lost.extend(i.id for i in latest)
                    self._error = self._error or e
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
