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
- **A write once queued is run**, as the core's ``aadd_many`` is: each call is counted as one
  call of the memory when it is queued (refused at once, with ``UsageError``, once ``close()``
  has begun: then nothing is queued), so a ``close()`` waits for every write queued before it
  began, and its caller may be cancelled (a timeout around it) at any point: its puts still
  run, whole, in the batch they join (only the reads of a caller cancelled before its batch was
  taken are skipped), and the caller gets its ``CancelledError``. The queue is run by a worker
  thread, not by a task of the loop, so a write is run even if its loop never runs again, or is
  blocked in a ``close()`` called on it: the thread waits for the loop's current tick (so that
  calls made in the same tick are one batch) only until ``close()`` begins.

:func:`plan_batch` and :func:`run_groups` are the decisions; :class:`Coalescer` is the thin shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from langgraph.store.base import Op, PutOp, Result

from tiered_memory.guard import Admitted, Guarded

__all__ = ["BatchPlan", "Coalescer", "plan_batch", "run_groups", "spread_results"]


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


def run_groups(run: Callable[[list[Op]], list[Result]], groups: Sequence[list[Op]]
               ) -> list[list[Result] | Exception]:
    """Each caller's outcome (its results, or the error that failed it) for its operations run as
    one batch with ``run``. A failed batch's writes commit all-or-nothing, so none did (a read's
    TTL refresh may have: doing it again is harmless): each caller's operations run again alone,
    so one caller's bad operation fails only that caller."""
    try:
        results = run([op for ops in groups for op in ops])
    except Exception as e:
        if len(groups) == 1:
            return [e]
        outcomes: list[list[Result] | Exception] = []
        for ops in groups:
            try:
                outcomes.append(run(ops))
            except Exception as error:
                outcomes.append(error)
        return outcomes
    starts = list(itertools.accumulate((len(ops) for ops in groups), initial=0))
    return [results[a:b] for a, b in zip(starts, starts[1:])]


#: how long the queue's thread waits for the loop's tick to end before it takes the queue anyway
#: (a loop blocked by other code; a close() that begins ends the wait at once)
TICK_WAIT = 1.0


@dataclass(eq=False)
class _Caller:
    """A queued call: its future (on its loop), its operations, and its count as a memory call."""

    fut: asyncio.Future[list[Result]]
    ops: list[Op]
    admitted: Admitted
    cancelled: bool = False  # set by the caller, read by the queue's thread

    def to_run(self) -> list[Op]:
        """All its operations, or only the puts of a caller cancelled already: nobody waits for its reads."""
        return [op for op in self.ops if isinstance(op, PutOp)] if self.cancelled else self.ops


def _retrieve(job: asyncio.Future[None]) -> None:
    if not job.cancelled():
        job.exception()  # raised in the thread and handed to its callers: no 'never retrieved' log


def _settle(fut: asyncio.Future[list[Result]], outcome: list[Result] | BaseException) -> None:
    if fut.done():  # the caller gave up (a cancel, a timeout)
        return
    if isinstance(outcome, StopIteration):  # an asyncio future cannot hold it: its awaiter would hang
        error = RuntimeError(f"a store batch raised StopIteration: {outcome!r}")
        error.__cause__ = outcome
        outcome = error
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


class Coalescer:
    """Queue the calls made from one event loop and run those queued by the end of a tick as one
    batch, with ``run``, in a worker thread of the loop's executor; one batch at a time, in the
    order queued. Each call is counted as a call of ``owner`` (the memory) from when it is queued,
    so its ``close()`` waits for it, as :func:`~tiered_memory.aio.call_in_thread` counts one. No
    thread lingers: the thread ends when the queue is empty, and the next call starts another."""

    def __init__(self, run: Callable[[list[Op]], list[Result]], owner: Guarded) -> None:
        self._run = run
        self._calls = owner._calls
        self._lock = threading.Lock()
        self._pending: list[_Caller] = []
        self._draining = False

    async def submit(self, ops: list[Op]) -> list[Result]:
        loop = asyncio.get_running_loop()
        caller = _Caller(loop.create_future(), ops, self._calls.admit())  # refused once close() began
        with self._lock:
            self._pending.append(caller)
            start, self._draining = not self._draining, True
        if start:
            try:
                job = functools.partial(contextvars.copy_context().run, self._drain, loop)
                loop.run_in_executor(None, job).add_done_callback(_retrieve)
            except BaseException:  # no thread to run the queue (an executor shut down)
                with self._lock:
                    taken, self._pending, self._draining = self._pending, [], False
                for c in taken:
                    c.admitted.drop()
                    if c is not caller:
                        c.fut.cancel()
                raise
        try:
            return await caller.fut
        except asyncio.CancelledError:
            caller.cancelled = True  # its puts still run, unless its batch has already run them
            raise

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """The queue's thread: after each tick of the loop, take what is queued and run it."""
        try:
            more = True
            while more:
                self._await_tick(loop)
                with self._lock:
                    taken, self._pending = self._pending, []
                outcomes = self._run_taken(taken)
                with self._lock:  # decided before the callers hear: a call they make next starts a thread
                    more = self._draining = bool(self._pending)
                for fut, outcome in outcomes:
                    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for the result
                        loop.call_soon_threadsafe(_settle, fut, outcome)
        except BaseException as e:  # never expected: no call is left waiting, the next starts a thread
            with self._lock:
                taken, self._pending, self._draining = self._pending, [], False
            for c in taken:
                c.admitted.drop()
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, c.fut, e)
            raise

    def _await_tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Let the loop finish the callbacks queued so far (calls made in this tick join the batch),
        unless close() begins, or the loop is closed."""
        tick = threading.Event()
        self._calls.wake_on_close(tick)
        try:
            loop.call_soon_threadsafe(tick.set)
        except RuntimeError:  # the loop is closed: nothing more queues from it
            return
        tick.wait(TICK_WAIT)

    def _run_taken(self, taken: list[_Caller]
                   ) -> list[tuple[asyncio.Future[list[Result]], list[Result] | BaseException]]:
        """Run the callers taken from the queue as one batch; each caller's future and outcome."""
        groups = []
        for c in taken:
            ops = c.to_run()
            if ops:
                groups.append((c, ops))
            else:  # a cancelled caller with nothing to write: never run
                c.admitted.drop()
        if not groups:
            return []
        outcomes: list[list[Result] | Exception] | list[BaseException]
        try:  # one count of the memory runs the batch; the others are let go once it has run
            outcomes = groups[0][0].admitted.run(run_groups, self._run, [ops for _, ops in groups])
        except BaseException as e:  # noqa: BLE001  handed to every caller; the thread goes on
            outcomes = [e] * len(groups)
        finally:
            for c, _ in groups[1:]:
                c.admitted.drop()
        return [(c.fut, outcome) for (c, _), outcome in zip(groups, outcomes)]
