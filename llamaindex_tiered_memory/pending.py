"""The messages a :class:`~.block.TieredMemoryBlock` was given and has not stored yet.

``Memory`` archives the messages it flushes out of its short-term queue in its chat store
*before* it hands them to its blocks (``_manage_queue`` in llama-index-core 0.14), and a
block that raises changes neither: the messages stay archived, the error reaches the caller
of ``Memory.aput``, and no later call hands them over again. So the block keeps a flushed
batch its memory could not store (a locked or full database, a failing vector engine) and
stores it first at its next call.

Invariants:

- Every row carries an id and a timestamp the block chose before the first attempt, so a
  batch written twice (a retry after a failure that came after the commit, as a vector
  engine's does; two copies of the block) is stored once: the core skips a message id it
  holds with the same message.
- Kept batches are written oldest first, and a failure stops the round: a session's turns
  reach the store in the order they left the queue.
- A batch the caller was told failed (a write-through put, ``aend_session``) is not kept: the
  caller owns the retry. Its ids are remembered, per session, so a retry of the same
  messages reuses them and is stored once however far the failed attempt got.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from tiered_memory.ids import new_id


@dataclass(frozen=True, kw_only=True)
class Batch:
    """Core message rows of one session, each with its id and timestamp."""

    session_id: str
    rows: tuple[dict[str, Any], ...]


def _message(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["role"], row["content"], row["metadata"]


def stamped(session_id: str, rows: Sequence[dict[str, Any]], like: Optional[Batch] = None) -> Batch:
    """``rows`` as a batch, each row given an id and a timestamp (pure but for the clock):
    those of ``like`` when it holds the same messages of the same session (a retry), else new ones."""
    if like is not None and like.session_id == session_id and [_message(r) for r in like.rows] == [
            _message(r) for r in rows]:
        return like
    now = time.time()
    return Batch(session_id=session_id, rows=tuple({**r, "id": new_id(), "timestamp": now} for r in rows))


@dataclass(eq=True)
class PendingWrites:
    """Batches kept to store (oldest first), and the last failed batch of each session whose
    caller was told (a retry of it reuses its ids). Safe to share between threads; it pickles
    and copies without its lock."""

    kept: list[Batch] = field(default_factory=list)
    failed: dict[str, Batch] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"kept": list(self.kept), "failed": dict(self.failed)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.kept = list(state["kept"])
        self.failed = dict(state["failed"])
        self._lock = threading.Lock()

    @property
    def messages(self) -> int:
        """How many messages are kept."""
        with self._lock:
            return sum(len(b.rows) for b in self.kept)

    def batch(self, session_id: str, rows: Sequence[dict[str, Any]]) -> Batch:
        """``rows`` stamped, reusing the ids of the session's failed batch when they are its retry."""
        with self._lock:
            return stamped(session_id, rows, self.failed.get(session_id))

    def keep(self, batch: Batch) -> None:
        with self._lock:
            self.kept.append(batch)

    def oldest(self) -> Optional[Batch]:
        with self._lock:
            return self.kept[0] if self.kept else None

    def stored(self, batch: Batch) -> None:
        """``batch`` is in the store: no longer kept, nor a failed batch to retry."""
        with self._lock:
            self.kept = [b for b in self.kept if b != batch]  # a copy's batch too (equal: the same ids)
            if self.failed.get(batch.session_id) == batch:
                del self.failed[batch.session_id]

    def not_stored(self, batch: Batch) -> None:
        """Writing ``batch`` failed and its caller was told: a retry of it reuses its ids."""
        with self._lock:
            self.failed[batch.session_id] = batch
