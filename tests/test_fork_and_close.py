"""A memory inherited through fork, or used after close, refuses at once with a typed error."""

from __future__ import annotations

import os
import time
from typing import Callable

import pytest

from tiered_memory import TieredMemory, UsageError


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
def test_a_forked_child_gets_a_usage_error_not_a_hang(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("forked")
    memory.add("user", "I live in Lisbon", session_id="s", user_id="u")
    pid = os.fork()
    if pid == 0:  # the child: every call is refused at once; closing only forgets the object
        code = 0
        for call in (lambda: memory.add("user", "x", session_id="s", user_id="u"),
                     lambda: memory.search("where?", user_id="u"),
                     lambda: memory.build_context("where?", user_id="u", session_id="s"),
                     lambda: _with_block(memory)):
            try:
                call()
                code = 1
            except UsageError as e:
                code = code or (0 if "forked child" in str(e) else 2)
            except BaseException:
                code = 3
        memory.close()
        os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the forked child hung")
    assert os.waitstatus_to_exitcode(status) == 0
    # the parent's memory is untouched by the child's close
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["I live in Lisbon"]
    memory.add("user", "still works", session_id="s", user_id="u")


def _with_block(memory: TieredMemory) -> None:
    with memory:
        pass


def _exit_code_of(pid: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    pytest.fail("the forked child hung")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
@pytest.mark.record_stores("sqlite", "postgres")
def test_a_working_memory_handle_refuses_in_a_forked_child(make_memory: Callable[..., TieredMemory]) -> None:
    """A handle got before the fork (a session's working memory, its scratchpad) does not pass
    through the memory's own checks: the record store refuses it, so the child never writes
    through the parent's connection."""
    memory = make_memory("forked-wm")
    wm = memory.working_memory("s", user_id="u")
    wm.remember("the user is moving to Porto", importance=0.9)
    wm.scratchpad["step"] = 1
    pid = os.fork()
    if pid == 0:
        code = 0
        for call in (lambda: wm.remember("written by the child", importance=0.9),
                     lambda: wm.scratchpad.__setitem__("step", 2),
                     lambda: wm.items(), lambda: dict(wm.scratchpad)):
            try:
                call()
                code = code or 1
            except UsageError as e:
                code = code or (0 if "forked child" in str(e) else 2)
            except BaseException:
                code = code or 3
        os._exit(code)
    assert _exit_code_of(pid) == 0
    # the parent's handle and memory are untouched and still work
    assert [i.text for i in wm.items()] == ["the user is moving to Porto"]
    assert dict(wm.scratchpad) == {"step": 1}
    wm.scratchpad["step"] = 3
    assert memory.working_memory("s", user_id="u").scratchpad["step"] == 3


@pytest.mark.record_stores("sqlite", "postgres")
def test_a_working_memory_handle_refuses_after_close(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("closed-wm")
    wm = memory.working_memory("s", user_id="u")
    wm.remember("the user is moving to Porto")
    memory.close()
    for call in (lambda: wm.remember("after close"), lambda: wm.items(),
                 lambda: wm.scratchpad.__setitem__("k", 1), lambda: dict(wm.scratchpad)):
        with pytest.raises(UsageError, match="closed"):
            call()


def test_a_closed_memory_refuses_with_a_usage_error(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("closed")
    memory.close()
    memory.close()  # twice is fine
    for call in (lambda: memory.add("user", "x", session_id="s", user_id="u"),
                 lambda: memory.search("x", user_id="u"), lambda: memory.stats(),
                 lambda: memory.facts("u")):
        with pytest.raises(UsageError, match="closed"):
            call()


async def test_the_async_twin_refuses_too(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("closed-async")
    memory.close()
    with pytest.raises(UsageError, match="closed"):
        await memory.asearch("x", user_id="u")


def test_a_with_block_on_a_closed_memory_is_refused_before_it_runs(
        make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("closed-with")
    memory.close()
    ran = []
    with pytest.raises(UsageError, match="closed"):
        with memory:
            ran.append("the block")
    assert ran == []


async def test_an_async_with_block_on_a_closed_memory_is_refused_before_it_runs(
        make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("closed-async-with")
    await memory.aclose()
    ran = []
    with pytest.raises(UsageError, match="closed"):
        async with memory:
            ran.append("the block")
    assert ran == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # Python 3.12+
def test_the_library_thread_pools_work_in_a_forked_child() -> None:
    """A worker forked after the parent used the library (gunicorn --preload) opens its own
    memory, as the refusal above tells it to: the module-level pools that memory uses (the
    keyword query beside the vector scan, the sync bridge) must not be the parent's, whose
    threads the child does not have (a submit waited forever)."""
    from tiered_memory import aio
    from tiered_memory.recall import search
    for pool in (search.beside_pool(), aio.sync_pool()):  # used by the parent
        assert pool.submit(os.getpid).result(timeout=30) == os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for pool in (search.beside_pool(), aio.sync_pool()):
                if pool.submit(os.getpid).result(timeout=10) != os.getpid():
                    code = 1
        except BaseException:
            code = 2
        os._exit(code)
    assert _exit_code_of(pid) == 0
