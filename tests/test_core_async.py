"""Async twins, and sync methods called where an event loop is already running (Jupyter)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from tiered_memory import MemoryContext, TieredMemory, WorkingMemory


async def test_sync_methods_work_inside_a_running_event_loop(memory):
    asyncio.get_running_loop()  # we are inside the loop, as in a notebook cell
    ids = memory.add_many([{"role": "user", "content": "I play the cello in an orchestra"},
                           {"role": "assistant", "content": "How lovely!"}], session_id="s", user_id="u")
    memory.add("user", "Rehearsals are on Thursdays", session_id="s", user_id="u")
    hits = memory.search("which instrument do I play?", user_id="u", k=1)
    assert hits[0].id == ids[0]
    ctx = memory.build_context("instrument", user_id="u", session_id="s")
    assert isinstance(ctx, MemoryContext) and ctx.recent
    assert len(memory.get_messages("s", user_id="u")) == 3
    assert memory.stats().messages == 3


async def test_async_twins_do_the_same_work(memory, tmp_path):
    ids = await memory.aadd_many([{"role": "user", "content": "My favourite tea is genmaicha"}],
                                 session_id="s", user_id="u")
    one = await memory.aadd("user", "I drink it every morning", session_id="s", user_id="u")
    hits = await memory.asearch("what tea do I like?", user_id="u", k=1)
    assert hits[0].id == ids[0]
    ctx = await memory.abuild_context("tea", user_id="u", session_id="s2")
    assert ids[0] in {i.id for s in ctx.sections for i in s.items}
    assert [m.id for m in await memory.aget_messages("s", user_id="u")] == [ids[0], one]
    assert (await memory.astats()).messages == 2
    dump = tmp_path / "d.jsonl"
    assert await memory.aexport_jsonl(dump) == 2
    await memory.aforget(one, user_id="u")
    assert await memory.aclear_session("s", user_id="u") == 1
    report = await memory.aimport_jsonl(dump)
    assert report.imported == 2
    assert await memory.aforget_user("u") == 2


async def test_concurrent_async_writes_are_all_committed(memory):
    batches = [[{"role": "user", "content": f"batch {b} note {i} about topic {b * 10 + i}"}
                for i in range(5)] for b in range(4)]
    results = await asyncio.gather(*(memory.aadd_many(batch, session_id=f"s{b}", user_id="u")
                                     for b, batch in enumerate(batches)))
    assert sum(len(r) for r in results) == 20
    assert memory.stats().messages == 20 and memory.stats().indexed == 20


def test_twins_share_signatures():
    for name in ("add", "add_many", "search", "search_sessions", "build_context", "forget", "forget_user",
                 "clear_session", "get_messages", "export_jsonl", "import_jsonl", "rebuild_index"):
        sync, twin = getattr(TieredMemory, name), getattr(TieredMemory, "a" + name)
        assert inspect.iscoroutinefunction(twin), name
        assert inspect.signature(sync) == inspect.signature(twin), name


# handles a memory hands out without I/O, and a reader only tests use: nothing to run off the loop
_NO_TWIN = {TieredMemory: {"working_memory", "item_store"}, WorkingMemory: {"items_raw"}}


@pytest.mark.parametrize("cls", [TieredMemory, WorkingMemory])
def test_every_public_method_has_an_async_twin_with_its_signature(cls):
    """The house rule, checked on the class as it is, not on a list: a public method added
    without its ``a*`` twin (or with another signature, defaults included) fails here."""
    public = {n for n in dir(cls) if not n.startswith("_") and not isinstance(inspect.getattr_static(cls, n), property)}
    missing, differ = [], []
    for name in sorted(public - _NO_TWIN[cls]):
        method = getattr(cls, name)
        if not callable(method) or inspect.iscoroutinefunction(method):
            continue
        twin = getattr(cls, "a" + name, None)
        if twin is None or not inspect.iscoroutinefunction(twin):
            missing.append(name)
        elif inspect.signature(method) != inspect.signature(twin):
            differ.append(name)
    assert (missing, differ) == ([], [])


def test_aopen_takes_the_constructors_parameters():
    """``aopen`` is ``TieredMemory(...)`` off the loop: its parameters are the constructor's, so a
    type checker and an IDE see them (with ``**options`` a misspelt ``embeder=`` type-checked)."""
    init = list(inspect.signature(TieredMemory.__init__).parameters.values())[1:]  # without self
    assert list(inspect.signature(TieredMemory.aopen).parameters.values()) == init


async def test_async_with_and_aclose_release_the_memory(tmp_path, embedder):
    from tiered_memory import UsageError

    async with TieredMemory(tmp_path / "m", embedder=embedder) as memory:
        await memory.aadd("user", "I keep bees on the roof", session_id="s", user_id="u")
    with pytest.raises(UsageError, match="closed"):
        await memory.asearch("bees", user_id="u")
    again = TieredMemory(tmp_path / "m", embedder=embedder)  # the folder was released
    assert (await again.astats()).messages == 1
    await again.aclose()
    await again.aclose()  # idempotent, as close()
    with pytest.raises(UsageError, match="closed"):
        await again.aadd("user", "x", session_id="s", user_id="u")
    assert inspect.signature(TieredMemory.close) == inspect.signature(TieredMemory.aclose)


async def test_a_cancelled_write_is_stored_whole_when_the_memory_closes_at_once(tmp_path, embedder):
    """The documented promise: cancelling an ``aadd_many`` (a timeout around it) does not stop
    its worker thread, and the batch is still stored whole, even when the application closes
    the memory right away (``async with`` exits, shutdown): close() lets the call finish."""
    import threading

    from tiered_memory import MemoryConfig

    memory = TieredMemory(tmp_path / "m", embedder=embedder, config=MemoryConfig(write_chunk=2))
    writing, closed = threading.Event(), threading.Event()

    def progress(n: int) -> None:
        if not writing.is_set():  # after the first chunk: hold the call until close() returns
            writing.set()         # (a fixed close waits for this call, so this wait runs out)
            closed.wait(2)

    batch = [{"role": "user", "content": f"note {i} about topic {i}", "id": f"m{i}"} for i in range(6)]
    task = asyncio.create_task(memory.aadd_many(batch, session_id="s", user_id="u", progress=progress))
    await asyncio.to_thread(writing.wait)
    task.cancel()
    await memory.aclose()
    closed.set()
    with TieredMemory(tmp_path / "m", embedder=embedder) as again:
        assert [m.id for m in again.get_messages("s", user_id="u")] == [f"m{i}" for i in range(6)]
        again.flush()
        assert again.stats().indexed == 6


async def test_an_async_progress_callback_is_refused_before_anything_is_stored(memory):
    """``progress`` is called in the worker thread that runs the call: an ``async def`` one
    only made coroutines that never ran (no progress reported, a 'never awaited' warning
    later), and the batch was stored as if it had been accepted."""
    from tiered_memory import InvalidInputError

    async def progress(n: int) -> None:  # pragma: no cover - never called
        raise AssertionError("an async callback cannot be run from the worker thread")

    batch = [{"role": "user", "content": "I keep bees on the roof"}]
    with pytest.raises(InvalidInputError, match="progress"):
        await memory.aadd_many(batch, session_id="s", user_id="u", progress=progress)
    with pytest.raises(InvalidInputError, match="progress"):
        await memory.aconsolidate("u", progress=progress)
    assert await memory.aget_messages("s", user_id="u") == []


@pytest.mark.timeout(60)
async def test_a_stop_iteration_from_inside_the_worker_thread_is_raised_not_a_hang(memory):
    """An asyncio future cannot hold ``StopIteration``: one raised in the worker thread (a
    callback's bare ``next()``) never reached the awaiting coroutine, which waited forever.
    It comes back as ``RuntimeError`` with it as the cause (as LangChain's ``run_in_executor``
    does), and the memory goes on working."""
    def progress(n: int) -> None:
        next(iter([]))

    batch = [{"role": "user", "content": "I keep bees on the roof", "id": "m1"}]
    with pytest.raises(RuntimeError) as raised:
        await memory.aadd_many(batch, session_id="s", user_id="u", progress=progress)
    assert isinstance(raised.value.__cause__, StopIteration)
    assert await memory.aadd_many(batch, session_id="s", user_id="u") == ["m1"]


async def test_aopen_opens_off_the_event_loop(tmp_path, embedder):
    """Opening reads the store (and after an unclean close repairs it): ``aopen`` does it in a
    worker thread, so the application's other coroutines go on meanwhile."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        memory = await TieredMemory.aopen(tmp_path / "m", embedder=embedder)
    finally:
        ticker.cancel()
    assert ticks > 0
    async with memory:
        await memory.aadd("user", "I keep bees on the roof", session_id="s", user_id="u")
    async with await TieredMemory.aopen(tmp_path / "m", embedder=embedder) as again:
        assert (await again.astats()).messages == 1


async def test_a_write_cancelled_before_its_worker_thread_starts_is_still_stored_whole(memory):
    """The documented promise holds when the call is cancelled while it waits for a worker
    thread (the loop's executor busy with other calls, as under load): ``asyncio.to_thread``
    then dropped it, so an ``aadd`` whose ``wait_for`` ran out before a thread was free was
    never stored, though the docs say a cancelled write is stored whole."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))  # one worker: the write waits behind a busy one
    busy = threading.Event()
    blocker = loop.run_in_executor(None, busy.wait)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(memory.aadd("user", "I keep bees on the roof", session_id="s", user_id="u"), 0.01)
    busy.set()
    await blocker
    await loop.run_in_executor(None, memory.flush)  # queued after the write: it has run when this returns
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["I keep bees on the roof"]


async def test_close_waits_for_an_async_write_still_waiting_for_a_worker_thread(tmp_path, embedder):
    """A twin's call counts for ``close()`` from the moment it is made, not from when a
    worker thread takes it: a ``close()`` that began while the write still waited for a
    thread finished at once, and the write, run after it, was refused, with nobody left to
    see the error (its caller had been cancelled): the batch was lost."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tiered_memory import UsageError

    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(1))
    busy = threading.Event()
    blocker = loop.run_in_executor(None, busy.wait)
    task = asyncio.create_task(memory.aadd("user", "I keep bees on the roof", session_id="s", user_id="u"))
    await asyncio.sleep(0)  # the write is queued behind the busy worker
    task.cancel()
    closing = threading.Thread(target=memory.close)
    closing.start()
    while True:  # until close() has begun: new calls are refused (polled, not timed)
        try:
            memory.stats()
        except UsageError:
            break
        await asyncio.sleep(0.005)
    busy.set()
    await blocker
    await asyncio.to_thread(closing.join)
    with pytest.raises(asyncio.CancelledError):
        await task
    with TieredMemory(tmp_path / "m", embedder=embedder) as again:
        assert [m.content for m in again.get_messages("s", user_id="u")] == ["I keep bees on the roof"]

