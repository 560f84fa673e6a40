"""Run a coroutine from sync code, even where an event loop is already running (Jupyter)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tiered-memory-sync")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # a loop is running in this thread: run ours in a worker thread with its own loop
    return _POOL.submit(asyncio.run, coro).result()
