"""``close()`` called twice at once, or from inside one of the memory's own calls (a progress
callback, a signal handler): the second close returns once the memory is closed, never
before, and a close inside a call lets that call finish and closes the memory as it
returns, instead of cutting it short or waiting forever for background work that waits for
the call's lock."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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


def test_close_inside_a_progress_callback_lets_the_call_finish_then_closes(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A progress callback that closes the memory: close() cut the call after its first chunk
    (the rest refused as 'closed'), and with background compression at work it never
    returned (the worker waits for the write lock the call holds while close waits for it).
    Then it raised UsageError; now it returns, the call stores everything, and the memory
    closes (background compression finished) as the call returns."""
    config = MemoryConfig(write_chunk=1, buffer=BufferConfig(max_messages=2),
                          episodes=EpisodeConfig(compress_after_turns=1))
    memory = make_memory("inside", config=config)
    memory.add_many([{"role": "user", "content": f"I like topic {i} very much"} for i in range(8)],
                    session_id="a", user_id="u")  # hands session a to the background worker
    stored: list[int] = []

    def progress(n: int) -> None:
        memory.close()
        stored.append(memory.stats().messages)  # the call still has its memory

    ids = memory.add_many([{"role": "user", "content": f"another note {i}"} for i in range(3)],
                          session_id="b", user_id="u", progress=progress)
    assert stored == [9, 10, 11] and _closing(memory)
    memory.close()  # again: a no-op
    again = make_memory("inside", config=config)
    assert [m.id for m in again.get_messages("b", user_id="u")] == ids  # the call stored everything


def test_close_from_a_signal_handler_during_a_write_closes_once_the_write_is_stored(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A process manager's SIGTERM whose handler closes the memory while the main thread is
    inside a write: close() raised UsageError into that write at whatever line it had reached,
    cutting it short, and the memory was never closed (access counts unwritten, the folder
    held). The close now waits for the call the handler interrupted: the write goes on and is
    stored whole, and the memory closes as it returns."""
    memory = make_memory("signal", config=MemoryConfig(write_chunk=1))
    handled: list[str] = []

    def on_term(signum: int, frame: object) -> None:
        memory.close()
        handled.append("closed")

    def progress(n: int) -> None:  # after each chunk of one message
        if not handled:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, in the main thread

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        ids = memory.add_many([{"role": "user", "content": f"note {i} for the harbour"} for i in range(4)],
                              session_id="s", user_id="u", progress=progress)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert handled == ["closed"] and _closing(memory)
    again = make_memory("signal")  # the folder was released
    assert [m.id for m in again.get_messages("s", user_id="u")] == ids


# an application writing in its main thread whose SIGTERM handler closes the memory and exits,
# as a process manager's stop asks; it notes each write's ids in a file once the write has
# returned (a file, not a pipe nobody reads: a full pipe would hold it outside its writes)
SIGTERM_APP = """
import signal, sys
from tiered_memory import StaticEmbedder, TieredMemory

memory = TieredMemory(sys.argv[1], embedder=StaticEmbedder())

def on_term(signum, frame):
    memory.close()
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
with open(sys.argv[2], "a", encoding="utf-8") as acks:
    n = 0
    while True:
        ids = memory.add_many([{"role": "user", "content": f"note {n} about the harbour"},
                               {"role": "assistant", "content": f"noted {n}"}], session_id="s", user_id="u")
        acks.write(" ".join(ids) + "\\n")
        acks.flush()
        n += 1
"""


def test_sigterm_whose_handler_closes_the_memory_exits_cleanly_and_keeps_every_acknowledged_write(
        tmp_path: Path) -> None:
    """The handler's close() ran while the main thread was inside a write (where a writing
    loop nearly always is) and raised UsageError, so the process died with a traceback
    (exit 1) and an unclean memory. Now it exits 0; every write it acknowledged is stored and
    the memory was closed cleanly (its state is 'closed', so the next open repairs nothing)."""
    folder, acks = tmp_path / "app", tmp_path / "acks.txt"
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_APP, str(folder), str(acks)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and (not acks.exists() or len(acks.read_text().splitlines()) < 20):
        threading.Event().wait(0.01)  # polled, not timed: twenty writes acknowledged
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, err
    acknowledged = [line.split() for line in acks.read_text().splitlines()]
    with sqlite3.connect(folder / "records.sqlite3") as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'state'").fetchone() == ("closed",)
        stored = {row[0] for row in db.execute("SELECT id FROM messages")}
    assert {i for ids in acknowledged for i in ids} <= stored


def test_closed_says_whether_close_has_begun(make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    """``closed`` is False while calls are taken, True from the moment close() begins (a call
    still running then finishes), and stays True (an adapter holding the object asks it)."""
    held = HeldEmbedder(embedder)
    memory = make_memory("closed-flag", embedder=held)
    assert memory.closed is False
    held.hold()
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(memory.add, "user", "the gate code is 4471", session_id="s", user_id="u")
        assert held.entered.wait(60), "the call never reached the embedder"
        closing = pool.submit(memory.close)
        while not _closing(memory):
            threading.Event().wait(0.005)
        assert memory.closed is True  # begun, the running call not yet finished
        held.release()
        running.result()
        closing.result()
    assert memory.closed is True
