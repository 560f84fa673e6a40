"""Run a coroutine from sync code, even where an event loop is already running (Jupyter).

Every sync call runs on one long-lived event loop in a daemon thread, not on a
fresh ``asyncio.run`` loop per call: async HTTP clients that providers cache per
process (langchain-openai, llama-index's OpenAI classes) keep connections bound
to the loop that opened them, and a new loop per call breaks every other call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tiered-memory-sync")
_GUARD = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None
_THREAD: threading.Thread | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP, _THREAD
    with _GUARD:
        if _LOOP is None or _THREAD is None or not _THREAD.is_alive():
            _LOOP = asyncio.new_event_loop()
            _THREAD = threading.Thread(target=_LOOP.run_forever, name="tiered-memory-loop", daemon=True)
            _THREAD.start()
        return _LOOP


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on the library's loop thread and return its result."""
    loop = _loop()
    if threading.current_thread() is _THREAD:
        # called from code already running on our loop: blocking it would deadlock
        return _POOL.submit(asyncio.run, coro).result()
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
