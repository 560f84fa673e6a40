"""How :class:`~langchain_tiered_memory.TieredMemoryStore` runs a batch, and coalesces
concurrent async calls into one.

The semantics are LangGraph's (its in-memory and SQL stores, and
``AsyncBatchedBaseStore``):

- **Within one batch, reads see the state before the batch.** Gets, searches and
  namespace listings run first, then every put and delete is written, in one
  transaction with one embedding call; for the same (namespace, key) the last write
  wins. Results come back in the order of the operations.
- **Identical reads in a batch run once** and each caller gets its own copy of the result.
- **Concurrent async calls are one batch.** ``aget``/``aput``/``asearch``/``adelete``/
  ``alist_namespaces`` (and ``abatch``) made in the same event-loop tick are queued and
  run together, in a worker thread, while the next calls queue up behind them. A
  caller that awaits its ``aput`` and then calls ``aget`` is in a later batch, so it
  reads its own write, as with LangGraph's stores.
- **A cancel never cuts a write short**, as with the core's ``aadd_many``: a caller cancelled
  while its operations wait in the queue (or run) still has its puts run, whole, in the batch
  they join; only its reads are skipped, and the caller gets its ``CancelledError``. ``close()``
  counts a batch from when it is taken to run, not while it waits in the queue.

:func:`plan_batch` is the pure decision; :class:`Coalescer` is the thin async shell.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

from langgraph.store.base import Op, PutOp, Result

__all__ = ["BatchPlan", "Coalescer", "plan_batch", "spread_results"]


@dataclass(frozen=True)
class BatchPlan:
    """What to run for a batch: the distinct reads, then the writes."""

    #: distinct read operations (gets, searches, listings), in first-seen order
    reads: list[Op]
    #: for each operation of the batch, the index of its read in ``reads`` (``None``: a write)
    read_of: list[int | None]
    #: puts and deletes, in order (the store keeps the last one per namespace and key)
    writes: list[PutOp]


def plan_batch(ops: Sequence[Op]) -> BatchPlan:
    """Split ``ops`` into distinct reads and the writes (pure)."""
    reads: list[Op] = []
    read_of: list[int | None] = []
    writes: list[PutOp] = []
    seen: dict[Op, int] = {}
    for op in ops:
        if isinstance(op, PutOp):
            writes.append(op)
            read_of.append(None)
            continue
        try:
            at = seen.setdefault(op, len(reads))
        except TypeError:  # a search whose filter holds a dict or a list cannot be hashed
            at = next((n for n, r in enumerate(reads) if r == op), len(reads))
        if at == len(reads):
            reads.append(op)
        read_of.append(at)
    return BatchPlan(reads=reads, read_of=read_of, writes=writes)


def spread_results(plan: BatchPlan, read_results: Sequence[Result]) -> list[Result]:
    """Each operation's result, in the order of the batch (pure): a write's is ``None``; a
    read run once for several callers hands each its own copy of the list it returned."""
    out: list[Result] = []
    handed: set[int] = set()
    for at in plan.read_of:
        if at is None:
            out.append(None)
            continue
        result = read_results[at]
        out.append(copy.copy(result) if isinstance(result, list) and at in handed else result)
        handed.add(at)
    return out


#: a queued caller: the future it awaits, and its operations
Caller = tuple[asyncio.Future[list[Result]], list[Op]]


def _to_run(caller: Caller) -> Caller:
    """What to run for a queued caller: all its operations, or only the writes of one already
    cancelled (before the coalescer sets its future, only a cancel makes it done), since a
    cancel never cuts a write short; nobody waits for its reads."""
    fut, ops = caller
    return (fut, [op for op in ops if isinstance(op, PutOp)]) if fut.done() else caller


class Coalescer:
    """Queue the batches submitted from one event loop and run those queued in the same
    tick as one, with ``run`` (which runs them in a worker thread). No task lingers: the draining task ends
    when the queue is empty, and the next submit starts another."""

    def __init__(self, run: Callable[[list[Op]], Awaitable[list[Result]]]) -> None:
        self._run = run
        self._pending: list[Caller] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, ops: list[Op]) -> list[Result]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Result]] = loop.create_future()
        self._pending.append((fut, ops))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            await self._run_pending()
        finally:  # a finished task holds its loop, which holds this queue only weakly
            self._task = None

    async def _run_pending(self) -> None:
        while self._pending:
            taken, self._pending = self._pending, []
            groups = [g for g in map(_to_run, taken) if g[1]]
            if not groups:
                continue
            try:
                try:
                    results = await self._run([op for _, ops in groups for op in ops])
                except Exception as e:
                    if len(groups) == 1:
                        if not groups[0][0].done():
                            groups[0][0].set_exception(e)
                        continue
                    # its writes commit all-or-nothing, so none did (a read's TTL refresh may have:
                    # doing it again is harmless): each caller's operations run again on their
                    # own, and one caller's bad operation fails only that caller
                    for f, ops in map(_to_run, groups):  # one cancelled meanwhile: its writes only
                        if not ops:
                            continue
                        try:
                            alone = await self._run(ops)
                        except Exception as error:
                            if not f.done():  # a cancelled caller's error has no one to see it
                                f.set_exception(error)
                            continue
                        if not f.done():
                            f.set_result(alone)
                    continue
            except BaseException:  # this task was cancelled: don't leave callers waiting forever
                for f, _ in groups + self._pending:
                    if not f.done():
                        f.cancel()
                self._pending = []
                raise
            start = 0
            for f, ops in groups:
                if not f.done():
                    f.set_result(results[start:start + len(ops)])
                start += len(ops)
