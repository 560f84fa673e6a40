"""The adapters' async writes, cancelled and raced with ``close()``: a write whose caller was
cancelled (a timeout around it) is stored whole and ``close()`` waits for it, as the core's
own twins promise (``tests/test_core_async.py``); a cancelled ``aopen`` leaves nothing open;
a cancelled LlamaIndex ``WriteThroughMemory.aput`` leaves its chat buffer and the store
agreeing. Each race is held deterministically: the loop's executor has one worker, held busy,
so the write waits in its queue while the test cancels it and closes the memory."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import gc
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableLambda
from langgraph.store.base import GetOp, PutOp

from cancel_support import cancel_then_close, held_executor, stored_turns, until_closing
from langchain_tiered_memory import (
    TieredChatMessageHistory,
    TieredConversationMemory,
    TieredMemoryMiddleware,
    TieredMemoryStore,
    with_tiered_memory,
)
from tiered_memory import InvalidInputError, TieredMemory
from tiered_memory.aio import open_in_thread
from tiered_memory.embedding import Embedder

USER_TURN, AI_TURN = "I keep bees on the roof", "How lovely! Do they sting?"


WRITES: dict[str, Callable[[TieredMemory], Awaitable[Any]]] = {
    "history.aadd_messages": lambda m: TieredChatMessageHistory(m, "s", user_id="u").aadd_messages(
        [HumanMessage(USER_TURN), AIMessage(AI_TURN)]),
    "classic.asave_context": lambda m: TieredConversationMemory(memory=m, user_id="u", session_id="s").asave_context(
        {"input": USER_TURN}, {"output": AI_TURN}),
    # at the end of the run, the save that stores the model's reply (after_model leaves it to a later save)
    "middleware.aafter_agent": lambda m: TieredMemoryMiddleware(m, user_id="u", session_id="s").aafter_agent(
        {"messages": [HumanMessage(USER_TURN, id="h1"), AIMessage(AI_TURN, id="a1")]}, None),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", list(WRITES))
async def test_an_adapter_write_cancelled_while_it_waits_for_a_thread_is_stored_whole_before_close(
        tmp_path: Path, embedder: Embedder, name: str) -> None:
    """The adapters ran their write (one ``add_many``, or a read then ``add_many``) with
    ``to_thread``, which counts nothing for ``close()`` until the memory's own call starts in
    the worker: a ``close()`` that began while the write waited for a thread finished at once,
    and the write, run after it, was refused with a ``UsageError`` nobody saw (its caller had
    been cancelled): both turns lost, though the caller saw the write begin."""
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    async with held_executor() as pool:
        pool.hold()
        await cancel_then_close(memory, pool, WRITES[name](memory), jobs=1)
    assert stored_turns(tmp_path / "m", embedder) == [USER_TURN, AI_TURN]


async def test_a_store_put_cancelled_while_its_batch_waits_for_a_thread_is_stored_before_close(
        tmp_path: Path, embedder: Embedder) -> None:
    """The LangGraph store's batch, once its coalescer has taken it, is the same: a cancelled
    ``aput`` whose batch waited for a thread was lost to a ``close()`` meanwhile."""
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    async with held_executor() as pool:
        pool.hold()
        await cancel_then_close(memory, pool, TieredMemoryStore(memory).aput(("u", "memories"), "bees", {"text": USER_TURN}),
                                jobs=1)
    with TieredMemory(tmp_path / "m", embedder=embedder) as again:
        item = TieredMemoryStore(again).get(("u", "memories"), "bees")
        assert item is not None and item.value == {"text": USER_TURN}


QUEUED_WRITES: dict[str, Callable[[TieredMemoryStore], Awaitable[Any]]] = {
    "aput": lambda store: store.aput(("u", "memories"), "bees", {"text": USER_TURN}),
    "abatch": lambda store: store.abatch([GetOp(("u", "memories"), "bees"),
                                          PutOp(("u", "memories"), "bees", {"text": USER_TURN})]),
}


@pytest.mark.parametrize("name", list(QUEUED_WRITES))
async def test_a_store_write_cancelled_while_queued_behind_another_batch_is_stored(
        tmp_path: Path, embedder: Embedder, name: str) -> None:
    """A store write cancelled before its coalescer took it (it waited behind a batch that
    waited for a thread) was skipped, so never stored, while a cancelled ``aadd_many`` is
    stored whole: its writes run now (its reads may not); its caller still gets the cancel."""
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    store = TieredMemoryStore(memory)
    await store.aput(("u", "memories"), "warm", {"text": AI_TURN})  # the store's one-time repair is done
    async with held_executor() as pool:
        pool.hold()
        first = asyncio.ensure_future(store.aput(("u", "memories"), "first", {"text": AI_TURN}))
        await pool.queued(pool.submitted + 1)  # the first batch was taken and waits for the thread
        queued = asyncio.ensure_future(QUEUED_WRITES[name](store))
        await asyncio.sleep(0)  # the write is queued behind it
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        await pool.release()
        await first
        item = await store.aget(("u", "memories"), "bees")  # a batch after the queued one
    assert item is not None and item.value == {"text": USER_TURN}
    memory.close()



@pytest.mark.parametrize("name", list(QUEUED_WRITES))
async def test_a_store_write_cancelled_while_queued_is_stored_before_a_close_that_begins_meanwhile(
        tmp_path: Path, embedder: Embedder, name: str) -> None:
    """A store write cancelled while it waited in the coalescer's queue (behind a batch that
    waited for a thread) was lost to a ``close()`` that began before the queue ran it: close
    waited only for the batch already taken, and the queued one, run after, was refused with a
    ``UsageError`` nobody saw. A write once queued is run, and close() waits for it."""
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    store = TieredMemoryStore(memory)
    await store.aput(("u", "memories"), "warm", {"text": AI_TURN})  # the store's one-time repair is done
    async with held_executor() as pool:
        pool.hold()
        first = asyncio.ensure_future(store.aput(("u", "memories"), "first", {"text": AI_TURN}))
        await pool.queued(pool.submitted + 1)  # the store's thread job waits for the held worker
        queued = asyncio.ensure_future(QUEUED_WRITES[name](store))
        await asyncio.sleep(0)  # the write is queued behind it
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        closing = threading.Thread(target=memory.close)
        closing.start()
        await until_closing(memory)
        await pool.release()
        await first
        await asyncio.get_running_loop().run_in_executor(None, closing.join)
    with TieredMemory(tmp_path / "m", embedder=embedder) as again:
        item = TieredMemoryStore(again).get(("u", "memories"), "bees")
        assert item is not None and item.value == {"text": USER_TURN}


@pytest.mark.timeout(60)
async def test_a_store_write_queued_when_close_is_called_on_the_loop_thread_is_stored(
        tmp_path: Path, embedder: Embedder) -> None:
    """``close()`` called on the event loop's own thread (a sync close in a coroutine) while an
    ``aput`` waited in the queue returned at once, and the write, run after it, was refused:
    the queued write is run by its thread, which the loop does not have to reach, before close
    returns (nothing waits for the blocked loop)."""
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    store = TieredMemoryStore(memory)
    await store.aput(("u", "memories"), "warm", {"text": AI_TURN})
    put = asyncio.ensure_future(store.aput(("u", "memories"), "bees", {"text": USER_TURN}))
    await asyncio.sleep(0)  # queued; its batch not taken yet
    memory.close()
    assert await put is None
    with TieredMemory(tmp_path / "m", embedder=embedder) as again:
        item = TieredMemoryStore(again).get(("u", "memories"), "bees")
        assert item is not None and item.value == {"text": USER_TURN}


async def test_a_caller_cancelled_while_its_batch_runs_again_alone_fails_no_other_caller(
        tmp_path: Path, embedder: Embedder) -> None:
    """A batch that fails on one caller's operation runs each caller's again alone. A caller
    cancelled while its own run went on got a result set on its cancelled future: the
    ``InvalidStateError`` ended the coalescer, which cancelled the callers after it (their
    writes never ran), and the bad caller got a cancel instead of its error. The cancel is made
    here from inside that run (the store's user mapping waits on a gate), in its thread."""
    reached, gate = threading.Event(), threading.Event()
    calls: list[str] = []

    def owner(namespace: tuple[str, ...], key: str | None) -> str | None:
        if key == "first":
            calls.append(key)
            if len(calls) == 2:  # the first caller's run alone, after the batch failed
                reached.set()
                gate.wait(30)
        return namespace[0]

    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    store = TieredMemoryStore(memory, user_namespace=owner)
    first = asyncio.ensure_future(store.aput(("u", "memories"), "first", {"text": AI_TURN}))
    bad = asyncio.ensure_future(store.aput((" ",), "k", {"v": 1}))  # a blank user: refused when it runs
    last = asyncio.ensure_future(store.aput(("u", "memories"), "bees", {"text": USER_TURN}))
    while not reached.is_set():  # polled: the run is in the queue's thread
        await asyncio.sleep(0.005)
    first.cancel()
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(InvalidInputError):
        await bad
    await last
    stored = {key: await store.aget(("u", "memories"), key) for key in ("first", "bees")}
    assert {key: item.value if item else None for key, item in stored.items()} == {
        "first": {"text": AI_TURN}, "bees": {"text": USER_TURN}}
    memory.close()


async def test_a_runnable_turn_cancelled_while_its_record_waits_for_a_thread_is_stored_before_close(
        tmp_path: Path, embedder: Embedder) -> None:
    """``with_tiered_memory(...).ainvoke``: the model answered, the call was cancelled while its
    record of the turn waited for a thread, and the memory closed meanwhile."""
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    answered, go = asyncio.Event(), asyncio.Event()

    async def model(_: Any) -> AIMessage:
        answered.set()
        await go.wait()
        return AIMessage(AI_TURN)

    chain = with_tiered_memory(RunnableLambda(model), memory)
    config: Any = {"configurable": {"user_id": "u", "session_id": "s"}}
    async with held_executor() as pool:
        call = asyncio.ensure_future(chain.ainvoke({"input": USER_TURN}, config))
        await answered.wait()  # the recall ran; the model is answering
        pool.hold()
        go.set()
        await cancel_then_close(memory, pool, call, jobs=1)
    assert stored_turns(tmp_path / "m", embedder) == [USER_TURN, AI_TURN]



def folder_state(folder: Path) -> tuple[bool, str | None]:
    """Whether another process could lock ``folder`` now (a new open file description of its
    lock file, as another process would take), and the store's state mark ("closed" after a
    clean close, "open" while open or after an unclean end)."""
    with open(folder / ".lock", "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            free = False
        else:
            free = True
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    with contextlib.closing(sqlite3.connect(f"file:{folder / 'records.sqlite3'}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'state'").fetchone()
    return free, row[0] if row else None


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No garbage collection meanwhile: a memory nobody references is not closed behind the
    test's back (its lock file is closed when collected), so a leak cannot pass unseen."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_cancelled_aopen_leaves_nothing_open(tmp_path: Path, embedder: Embedder) -> None:
    """``aopen`` opens in a worker thread, which a cancel does not stop (``to_thread`` is
    shielded): the memory it made was left open with nobody to close it, its folder locked
    against every other process and marked open (the next open repairs it as after a crash)
    until a garbage collection happened to close its lock file."""
    await _cancelled_open_leaves_nothing_open(tmp_path / "m", embedder, TieredMemory.aopen)


async def test_a_cancelled_open_in_thread_closes_what_it_opened(tmp_path: Path, embedder: Embedder) -> None:
    """:func:`~tiered_memory.aio.open_in_thread`, cancelled while the open waits for a thread:
    the worker closes the memory as soon as it is made."""
    await _cancelled_open_leaves_nothing_open(tmp_path / "m", embedder, functools.partial(open_in_thread, TieredMemory))


async def _cancelled_open_leaves_nothing_open(folder: Path, embedder: Embedder,
                                              aopen: Callable[..., Awaitable[TieredMemory]]) -> None:
    TieredMemory(folder, embedder=embedder).close()  # a folder to open, closed cleanly
    with no_collection():
        async with held_executor() as pool:
            pool.hold()
            opening = asyncio.ensure_future(aopen(folder, embedder=embedder))
            await pool.queued(pool.submitted + 1)
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
            await pool.release()
            await pool.drained()  # the open (which a cancel does not stop) has run
        assert folder_state(folder) == (True, "closed")


async def test_an_open_in_thread_cancelled_once_the_memory_is_made_closes_it(
        tmp_path: Path, embedder: Embedder) -> None:
    """The cancel comes after the worker made the memory, before the caller took it: the caller
    hands it to a worker thread to close."""
    folder = tmp_path / "m"
    TieredMemory(folder, embedder=embedder).close()
    with no_collection():
        async with held_executor() as pool:
            opening = asyncio.ensure_future(open_in_thread(TieredMemory, folder, embedder=embedder))
            await pool.queued(pool.submitted + 1)
            ThreadPoolExecutor.submit(pool, lambda: None).result()  # blocks the loop until the open ran
            opening.cancel()  # before the loop hands the caller the memory
            with pytest.raises(asyncio.CancelledError):
                await opening
            await pool.drained()  # the close queued after it has run
        assert folder_state(folder) == (True, "closed")


async def test_a_write_through_put_cancelled_mid_way_leaves_the_chat_buffer_and_the_store_agreeing(
        tmp_path: Path, embedder: Embedder) -> None:
    """LlamaIndex ``WriteThroughMemory.aput`` stores the message in the tiered store, then in
    the ``Memory``'s chat buffer. Cancelled between the two (while the store's write waited for
    a thread), the store's write went on (shielded) and the buffer's never ran: the agent's
    next turn lacked a message the store holds."""
    from llama_index.core.llms import ChatMessage

    from llamaindex_tiered_memory import TieredMemoryBlock, WriteThroughMemory, offline_tokenizer

    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    block = TieredMemoryBlock(memory=memory, user_id="u", every_turn=True)
    chat = WriteThroughMemory.from_defaults(session_id="s", memory_blocks=[block], tokenizer_fn=offline_tokenizer())
    put: Callable[[], Awaitable[None]]
    for put in (lambda: chat.aput(ChatMessage(role="user", content=USER_TURN)),
                lambda: chat.aput_messages([ChatMessage(role="assistant", content=AI_TURN)])):
        async with held_executor() as pool:
            pool.hold()
            task = asyncio.ensure_future(put())
            await pool.queued(pool.submitted + 1)  # the store's write waits for a thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not asyncio.current_task()))
        stored = [m.content for m in await memory.aget_messages("s", user_id="u")]
        assert [m.content for m in await chat.aget_all()] == stored
    assert stored == [USER_TURN, AI_TURN]
    memory.close()


async def test_an_end_session_cancelled_mid_flush_archives_what_it_stored(tmp_path: Path, embedder: Embedder) -> None:
    """LlamaIndex ``aend_session`` stores the short-term queue in the tiered store, then archives
    it from the queue. Cancelled between the two, the store's write went on and the archive
    never ran: the queue still held the stored messages, which the next end (or flush) stored
    a second time (messages carry no id to tell)."""
    from llama_index.core.llms import ChatMessage
    from llama_index.core.memory import Memory
    from llama_index.core.storage.chat_store.base_db import MessageStatus

    from llamaindex_tiered_memory import TieredMemoryBlock, aend_session, offline_tokenizer

    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    chat = Memory.from_defaults(session_id="s", memory_blocks=[TieredMemoryBlock(memory=memory, user_id="u")],
                                tokenizer_fn=offline_tokenizer())
    await chat.aput_messages([ChatMessage(role="user", content=USER_TURN), ChatMessage(role="assistant", content=AI_TURN)])
    async with held_executor() as pool:
        pool.hold()
        task = asyncio.ensure_future(aend_session(chat))
        await pool.queued(pool.submitted + 1)  # the store's write waits for a thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not asyncio.current_task()))
    assert [m.content for m in await memory.aget_messages("s", user_id="u")] == [USER_TURN, AI_TURN]
    assert await chat.sql_store.get_messages("s", status=MessageStatus.ACTIVE) == []
    memory.close()
