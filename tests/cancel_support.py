"""The harness of the cancel-and-close races (tests/test_adapters_cancel_close.py): a loop
executor with one worker held busy, so a write waits in its queue while a test cancels it and
closes the memory; what a folder holds after."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from tiered_memory import TieredMemory, UsageError
from tiered_memory.embedding import Embedder


class HeldExecutor(ThreadPoolExecutor):
    """A one-worker executor that counts what is submitted to it; :meth:`hold` keeps its worker
    busy until :meth:`release`, so a job submitted meanwhile waits in its queue."""

    def __init__(self) -> None:
        super().__init__(1)
        self.submitted = 0
        self._changed = asyncio.Event()  # submit() is called from the loop's thread
        self._gate = threading.Event()
        self._blocker: Future[Any] | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        self._changed.set()
        return super().submit(fn, *args, **kwargs)

    def hold(self) -> None:
        self._gate.clear()
        self._blocker = super().submit(self._gate.wait)  # not counted: not the loop's job

    async def queued(self, n: int) -> None:
        """Return once ``n`` jobs were submitted by the loop."""
        while self.submitted < n:
            self._changed.clear()
            await self._changed.wait()

    async def release(self) -> None:
        self._gate.set()
        if self._blocker is not None:
            await asyncio.wrap_future(self._blocker)

    async def drained(self) -> None:
        """Return once every job submitted before has run (a job queued after them ran)."""
        await asyncio.wrap_future(super().submit(lambda: None))


@contextlib.asynccontextmanager
async def held_executor() -> AsyncIterator[HeldExecutor]:
    pool = HeldExecutor()
    asyncio.get_running_loop().set_default_executor(pool)
    try:
        yield pool
    finally:
        await pool.release()


async def until_closing(memory: TieredMemory) -> None:
    """Return once ``close()`` has begun: the memory refuses new calls (polled, not timed)."""
    while True:
        try:
            memory.stats()
        except UsageError:
            return
        await asyncio.sleep(0.005)


async def cancel_then_close(memory: TieredMemory, pool: HeldExecutor, write: Awaitable[Any], jobs: int) -> None:
    """Start ``write`` while the executor is held, wait until it has queued ``jobs`` jobs, cancel
    it, begin ``close()`` in another thread, then let the queue run and the close finish."""
    task = asyncio.ensure_future(write)
    await pool.queued(pool.submitted + jobs)
    task.cancel()
    closing = threading.Thread(target=memory.close)
    closing.start()
    await until_closing(memory)
    await pool.release()
    await asyncio.get_running_loop().run_in_executor(None, closing.join)
    with pytest.raises(asyncio.CancelledError):
        await task


def stored_turns(path: Path, embedder: Embedder) -> list[str]:
    with TieredMemory(path, embedder=embedder) as again:
        return [m.content for m in again.get_messages("s", user_id="u")]
