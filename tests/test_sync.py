"""run_sync: one long-lived loop for every sync call, usable inside a running loop."""

from __future__ import annotations

import asyncio

from tiered_memory.aio import run_sync


async def _current_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_sync_calls_share_one_loop() -> None:
    # clients cached per process (langchain-openai) keep connections bound to their loop
    first, second = run_sync(_current_loop()), run_sync(_current_loop())
    assert first is second and first.is_running()


async def test_works_inside_a_running_loop() -> None:
    mine = asyncio.get_running_loop()
    theirs = run_sync(_current_loop())
    assert theirs is not mine


def test_nested_call_from_the_loop_thread_does_not_deadlock() -> None:
    async def outer() -> int:
        async def inner() -> int:
            return 7

        return run_sync(inner())

    assert run_sync(outer()) == 7


def test_exceptions_propagate() -> None:
    async def boom() -> None:
        raise KeyError("x")

    try:
        run_sync(boom())
    except KeyError as e:
        assert e.args == ("x",)
    else:
        raise AssertionError("the exception was swallowed")
