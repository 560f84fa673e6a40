"""One user's async writes waiting for that user's lock (its ``forget_user`` deleting vectors on a
slow vector server) hold no worker thread of the event loop's executor: the other users' async
calls, and whatever else the app runs there, go on meanwhile.

The loop's default executor is set to ``POOL`` threads, so the test does not depend on the
machine's core count (Python's default is ``min(32, cpu_count + 4)``); user a then sends more
async writes than it has threads. The deletion is held inside the real Chroma index's delete
(``HeldDeletes`` of ``test_user_locks``), every wait bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Callable

import pytest
from test_user_locks import WAIT, HeldDeletes, Run, _forgetting, held  # noqa: F401 - held is a fixture

from tiered_memory import TieredMemory
from tiered_memory.vector.chroma import ChromaVectorIndex

POOL = 3  # threads of the loop's default executor in these tests
WRITES = POOL + 2  # more of user a's async writes than it has threads


def _pool(loop: asyncio.AbstractEventLoop) -> concurrent.futures.ThreadPoolExecutor:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=POOL, thread_name_prefix="app-default")
    loop.set_default_executor(pool)
    return pool


async def test_one_users_async_writes_waiting_for_its_forget_user_leave_the_threads_to_the_others(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    memory, index = held
    loop = asyncio.get_running_loop()
    _pool(loop)
    forget = _forgetting(memory, index)  # a's forget_user, held inside the index's delete
    try:
        writes = [asyncio.ensure_future(memory.aadd("user", f"note {i}", session_id="s", user_id="a"))
                  for i in range(WRITES)]
        new_b = await asyncio.wait_for(memory.aadd("user", "I moved to Porto", session_id="s", user_id="b"), WAIT)
        hits = await asyncio.wait_for(memory.asearch("I sail on Sundays", user_id="b", k=1), WAIT)
        other = await asyncio.wait_for(loop.run_in_executor(None, lambda: "the app's own work"), WAIT)
        assert forget.thread.is_alive() and not any(w.done() for w in writes)  # a's delete still held
    finally:
        index.release.set()
    assert await loop.run_in_executor(None, forget.result) == 2
    ids = await asyncio.wait_for(asyncio.gather(*writes), WAIT)
    assert other == "the app's own work" and hits[0].text == "I sail on Sundays"
    assert new_b in memory.index.ids("b")
    # stored after the deletion (none taken by it), in the order they were called
    assert [m.content for m in memory.get_messages("s", user_id="a")] == [f"note {i}" for i in range(WRITES)]
    assert memory.index.ids("a") == set(ids)


async def test_a_cancelled_async_write_waiting_for_its_users_deletion_is_still_stored_and_closed_over(
        held: tuple[TieredMemory, HeldDeletes], make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A cancel (a timeout around the call) never cuts a write short, also while it waits for its
    user's lock without a thread: it is stored once the deletion ends, and ``close()`` waits for it."""
    memory, index = held
    _pool(asyncio.get_running_loop())
    forget = _forgetting(memory, index)
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(memory.aadd("user", "I moved to Porto", session_id="s", user_id="a"), 0.05)
    finally:
        index.release.set()
    await asyncio.get_running_loop().run_in_executor(None, forget.result)
    await asyncio.wait_for(memory.aclose(), WAIT)  # waits for the cancelled write
    again = make_memory(vector_store=ChromaVectorIndex(str(tmp_path / "index")))
    [moved] = again.get_messages("s", user_id="a")
    assert moved.content == "I moved to Porto" and again.index.ids("a") == {moved.id}  # indexed after the delete


def test_an_async_write_waiting_for_its_users_deletion_when_its_loop_ends_is_still_stored(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    """``asyncio.run`` ends (cancelling what still waits) while a write of a waits for a's deletion:
    the write is not dropped; the loop's end waits for it, as for a call already in a worker thread."""
    memory, index = held
    forget = _forgetting(memory, index)

    async def abandon() -> None:
        _pool(asyncio.get_running_loop())
        asyncio.ensure_future(memory.aadd("user", "I moved to Porto", session_id="s", user_id="a"))
        await asyncio.sleep(0)  # it starts, and waits for a's lock

    run = Run(lambda: asyncio.run(abandon()))
    try:
        assert not run.done.wait(0.1)  # the loop's end waits for the write, which waits for the deletion
    finally:
        index.release.set()
    run.result()
    assert forget.result() == 2
    assert [m.content for m in memory.get_messages("s", user_id="a")] == ["I moved to Porto"]
