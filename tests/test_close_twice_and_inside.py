"""``close()`` called twice at once, or from inside one of the memory's own calls (a progress
callback): the second close returns once the memory is closed, never before, and a close
inside a call is refused with ``UsageError`` instead of cutting that call short or waiting
forever for background work that waits for the call's lock."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest

from tiered_memory import MemoryConfig, TieredMemory, UsageError
from tiered_memory.config import BufferConfig, EpisodeConfig
from tiered_memory.embedding import Embedder
from tiered_memory.testing import HeldEmbedder

pytestmark = [pytest.mark.record_stores("sqlite", "postgres"), pytest.mark.timeout(120)]


def _closing(memory: TieredMemory) -> bool:
    try:
        memory.stats()
    except UsageError:
        return True
    return False


def test_a_second_close_returns_once_the_memory_is_closed(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    """The first close() waits for a running call; a second close() meanwhile (a shutdown hook
    beside an ``async with``) returned at once, so reopening the folder right after it failed
    with 'already open in this process ... which was not closed'."""
    held = HeldEmbedder(embedder)
    memory = make_memory("twice", embedder=held)
    held.hold()
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(memory.add, "user", "I keep bees on the roof", session_id="s", user_id="u")
        assert held.entered.wait(60), "the call never reached the embedder"
        first = pool.submit(memory.close)
        while not _closing(memory):  # polled, not timed: the first close has begun
            threading.Event().wait(0.005)
        release = threading.Timer(0.5, held.release)  # lets the held call go on while the second close waits
        release.start()
        memory.close()
        again = make_memory("twice", embedder=embedder)  # the folder was released
        assert [m.content for m in again.get_messages("s", user_id="u")] == ["I keep bees on the roof"]
        running.result()
        first.result()
        release.join()


def test_close_inside_a_progress_callback_is_refused_and_the_call_goes_on(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A progress callback that closes the memory: close() cut the call after its first chunk
    (the rest refused as 'closed'), and with background compression at work it never
    returned (the worker waits for the write lock the call holds while close waits for it)."""
    config = MemoryConfig(write_chunk=1, buffer=BufferConfig(max_messages=2),
                          episodes=EpisodeConfig(compress_after_turns=1))
    memory = make_memory("inside", config=config)
    memory.add_many([{"role": "user", "content": f"I like topic {i} very much"} for i in range(8)],
                    session_id="a", user_id="u")  # hands session a to the background worker
    refused: list[UsageError] = []

    def progress(n: int) -> None:
        try:
            memory.close()
        except UsageError as e:
            refused.append(e)

    ids = memory.add_many([{"role": "user", "content": f"another note {i}"} for i in range(3)],
                          session_id="b", user_id="u", progress=progress)
    assert len(refused) == 3 and "inside" in str(refused[0])
    assert [m.id for m in memory.get_messages("b", user_id="u")] == ids  # the call stored everything
    memory.close()
    assert _closing(memory)
