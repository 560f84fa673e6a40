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
import threading
from pathlib import Path
from typing import Any, Callable, Coroutine

import pytest
from test_user_locks import WAIT, HeldDeletes, Run, _forgetting, held  # noqa: F401 - held is a fixture

from tiered_memory import NotFoundError, TieredMemory
from tiered_memory.user_locks import UserLocks
from tiered_memory.vector.chroma import ChromaVectorIndex

POOL = 3  # threads of the loop's default executor in these tests
WRITES = POOL + 2  # more of user a's async writes than it has threads


def _pool(loop: asyncio.AbstractEventLoop) -> concurrent.futures.ThreadPoolExecutor:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=POOL, thread_name_prefix="app-default")
    loop.set_default_executor(pool)
    return pool


FACTS = ["User keeps bees", "User sails on Sundays", "User plays the cello", "User lives in Porto",
         "User drinks genmaicha", "User collects maps", "User runs marathons"]


def _write(memory: TieredMemory, kind: str, i: int) -> Coroutine[Any, Any, Any]:
    if kind == "aadd":
        return memory.aadd("user", f"note {i}", session_id="s", user_id="a")
    if kind == "aadd_many":
        return memory.aadd_many([{"role": "user", "content": f"note {i}"}], session_id="s", user_id="a")
    return memory.aadd_fact(FACTS[i], user_id="a")


@pytest.mark.parametrize("kind", ["aadd", "aadd_many", "aadd_fact"])
async def test_one_users_async_writes_waiting_for_its_forget_user_leave_the_threads_to_the_others(
        held: tuple[TieredMemory, HeldDeletes], kind: str) -> None:
    memory, index = held
    loop = asyncio.get_running_loop()
    _pool(loop)
    forget = _forgetting(memory, index)  # a's forget_user, held inside the index's delete
    try:
        writes = [asyncio.ensure_future(_write(memory, kind, i)) for i in range(WRITES)]
        new_b = await asyncio.wait_for(memory.aadd("user", "I moved to Porto", session_id="s", user_id="b"), WAIT)
        hits = await asyncio.wait_for(memory.asearch("I sail on Sundays", user_id="b", k=1), WAIT)
        other = await asyncio.wait_for(loop.run_in_executor(None, lambda: "the app's own work"), WAIT)
        assert forget.thread.is_alive() and not any(w.done() for w in writes)  # a's delete still held
    finally:
        index.release.set()
    assert await loop.run_in_executor(None, forget.result) == 2
    written = await asyncio.wait_for(asyncio.gather(*writes), WAIT)
    assert other == "the app's own work" and hits[0].text == "I sail on Sundays"
    assert new_b in memory.index.ids("b")
    if kind == "aadd_fact":  # stored after the deletion, none taken by it
        assert [f.text for f in memory.facts("a")] == FACTS[:WRITES]
        assert memory.index.ids("a") == {f"fact:{f.id}" for f in written}
        return
    # stored after the deletion (none taken by it), in the order they were called
    assert [m.content for m in memory.get_messages("s", user_id="a")] == [f"note {i}" for i in range(WRITES)]
    assert memory.index.ids("a") == {i if kind == "aadd" else i[0] for i in written}


@pytest.mark.parametrize("kind", ["aupdate_fact", "adelete_fact", "adelete_episode", "aforget", "aclear_session",
                                  "aforget_user", "aimport_jsonl"])
async def test_the_users_other_lined_calls_waiting_for_its_forget_user_leave_the_threads_to_the_others(
        held: tuple[TieredMemory, HeldDeletes], kind: str, tmp_path: Path) -> None:
    """Every twin that holds its user's lock throughout waits in the user's line: its calls, more
    than the pool has threads, leave b's ``aadd`` to run. Once a's deletion ends they run, finding
    what it deleted gone (``NotFoundError``) or nothing left, as a sync call then would."""
    memory, index = held
    _pool(asyncio.get_running_loop())
    fact, turn = memory.add_fact("User keeps bees", user_id="a"), memory.get_messages("s", user_id="a")[0]
    episode, dump = memory.end_session("s", user_id="a"), tmp_path / "a.jsonl"
    memory.export_jsonl(dump, user_id="a")
    calls: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
        "aupdate_fact": lambda: memory.aupdate_fact(fact.id, user_id="a", confidence=0.5),
        "adelete_fact": lambda: memory.adelete_fact(fact.id, user_id="a"),
        "adelete_episode": lambda: memory.adelete_episode(episode.id, user_id="a"),
        "aforget": lambda: memory.aforget(turn.id, user_id="a"),
        "aclear_session": lambda: memory.aclear_session("s", user_id="a"),
        "aforget_user": lambda: memory.aforget_user("a"),
        "aimport_jsonl": lambda: memory.aimport_jsonl(dump, user_id="a"),
    }
    forget = _forgetting(memory, index)
    try:
        waiting = [asyncio.ensure_future(calls[kind]()) for _ in range(WRITES)]
        new_b = await asyncio.wait_for(memory.aadd("user", "I moved to Porto", session_id="s", user_id="b"), WAIT)
        assert forget.thread.is_alive() and not any(w.done() for w in waiting)
    finally:
        index.release.set()
    assert await asyncio.get_running_loop().run_in_executor(None, forget.result) > 0
    done = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), WAIT)
    assert all(not isinstance(d, BaseException) or isinstance(d, NotFoundError) for d in done), done
    assert new_b in memory.index.ids("b")


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


async def test_the_first_of_a_line_gives_its_thread_back_if_a_sync_call_took_the_lock_and_the_next_waits() -> None:
    """``ready()`` returned, then a sync call took the user's lock before the worker thread did: the
    worker runs nothing and returns at once (no thread waits for the lock); the call waits again,
    on the loop, and the next of the line waits until the first holds the lock and lets it go."""
    users, loop = UserLocks(threading.RLock()), asyncio.get_running_loop()
    first, second = users.line("a"), users.line("a")
    await asyncio.wait_for(first.ready(), WAIT)
    taken, release = threading.Event(), threading.Event()

    def sync_call() -> None:
        with users.user("a"):
            taken.set()
            release.wait(WAIT)

    holder = Run(sync_call)
    assert taken.wait(WAIT)
    ran: list[str] = []
    assert await loop.run_in_executor(None, first.attempt, lambda: ran.append("first")) is None and ran == []
    waiting, behind = asyncio.ensure_future(first.ready()), asyncio.ensure_future(second.ready())
    done, _ = await asyncio.wait({waiting, behind}, timeout=0.1)
    assert not done  # both wait, on the loop, for the lock
    release.set()
    holder.result()
    await asyncio.wait_for(waiting, WAIT)
    assert not behind.done()  # not first of the line
    assert await loop.run_in_executor(None, first.attempt, lambda: "first") == ("first",)
    await asyncio.wait_for(behind, WAIT)  # the first left the line and let the lock go
    assert await loop.run_in_executor(None, second.attempt, lambda: "second") == ("second",)
