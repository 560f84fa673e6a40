"""Concurrency: threads and asyncio tasks share one TieredMemory; a second process is refused.

Within a process every method is thread-safe (writes are serialised, reads see
only committed data). An embedded folder serves one process: a second process
gets :class:`StoreLockedError` naming the fix (a server backend), never a
silently shared SQLite/Chroma folder.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from tiered_memory import StoreLockedError, TieredMemory

WRITERS, BATCHES, PER_BATCH = 4, 5, 3


def content(user: int, b: int, i: int) -> str:
    return f"writer {user} batch {b} line {i}: the ferry leaves from pier {user * 100 + b * 10 + i}"


def check_all_written(m: TieredMemory, written: dict[str, list[str]]) -> None:
    for user, ids in written.items():
        msgs = m.get_messages("s", user_id=user)
        assert [x.id for x in msgs] == ids, f"{user}: lost or reordered writes"
        assert all(x.user_id == user for x in msgs)
    pending = m.store.query("SELECT count(*) FROM messages WHERE indexed=0")[0][0]  # type: ignore[attr-defined]
    assert pending == 0
    unique = {r[0] for r in m.store.query("SELECT id FROM messages WHERE duplicate_of IS NULL")}  # type: ignore[attr-defined]
    assert unique <= m.index.ids()
    assert m.store.query("PRAGMA integrity_check")[0][0] == "ok"  # type: ignore[attr-defined]


def test_threads_writing_and_searching_at_once(make_memory: Callable[..., TieredMemory]) -> None:
    m = make_memory()
    written: dict[str, list[str]] = {f"t{u}": [] for u in range(WRITERS)}
    errors: list[BaseException] = []
    leaks: list[str] = []
    start = threading.Barrier(WRITERS + 3)
    done = threading.Event()

    def writer(u: int) -> None:
        start.wait()
        for b in range(BATCHES):
            msgs = [{"role": "user", "content": content(u, b, i)} for i in range(PER_BATCH)]
            written[f"t{u}"] += m.add_many(msgs, session_id="s", user_id=f"t{u}")

    def reader(u: int) -> None:
        start.wait()
        while not done.is_set():
            for h in m.search("ferry pier", user_id=f"t{u}", k=20):
                if not h.text.startswith(f"writer {u} "):
                    leaks.append(h.text)
            ctx = m.build_context("which pier?", user_id=f"t{u}", session_id="s")
            leaks.extend(i.text for s in ctx.sections for i in s.items if not i.text.startswith(f"writer {u} "))

    def stats() -> None:
        start.wait()
        while not done.is_set():
            s = m.stats()
            assert s.messages >= s.indexed >= 0

    def guard(fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # reported below
            errors.append(e)
            done.set()

    threads = [threading.Thread(target=guard, args=(writer, u)) for u in range(WRITERS)]
    threads += [threading.Thread(target=guard, args=(reader, u)) for u in (0, 1)]
    threads += [threading.Thread(target=guard, args=(stats,))]
    for t in threads:
        t.start()
    for t in threads[:WRITERS]:
        t.join(timeout=300)
    done.set()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not leaks, leaks[:3]
    assert sum(len(v) for v in written.values()) == WRITERS * BATCHES * PER_BATCH
    check_all_written(m, written)


async def test_asyncio_tasks_writing_and_searching_at_once(make_memory: Callable[..., TieredMemory]) -> None:
    m = make_memory()

    async def writer(u: int) -> tuple[str, list[str]]:
        ids: list[str] = []
        for b in range(BATCHES):
            msgs = [{"role": "user", "content": content(u, b, i)} for i in range(PER_BATCH)]
            ids += await m.aadd_many(msgs, session_id="s", user_id=f"a{u}")
        return f"a{u}", ids

    async def reader(u: int) -> int:
        seen = 0
        for _ in range(4):
            hits = await m.asearch("ferry pier", user_id=f"a{u}", k=20)
            assert all(h.text.startswith(f"writer {u} ") for h in hits)
            ctx = await m.abuild_context("which pier?", user_id=f"a{u}", session_id="s")
            assert all(i.text.startswith(f"writer {u} ") for s in ctx.sections for i in s.items)
            seen += len(hits)
            await asyncio.sleep(0)
        return seen

    results = await asyncio.gather(*[writer(u) for u in range(WRITERS)], reader(0), reader(1))
    written = dict(results[:WRITERS])  # type: ignore[arg-type]
    assert sum(len(v) for v in written.values()) == WRITERS * BATCHES * PER_BATCH
    check_all_written(m, written)


SECOND_PROCESS = """
import sys
from tiered_memory import TieredMemory, StoreLockedError
try:
    TieredMemory(sys.argv[1])
except StoreLockedError as e:
    print("LOCKED:", e)
    sys.exit(3)
print("OPENED")
"""


def test_a_second_process_gets_store_locked_error(make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    m = make_memory("shared")
    ids = m.add_many([{"role": "user", "content": "only one process may hold this folder"}],
                     session_id="s", user_id="u")
    before = (tmp_path / "shared" / "records.sqlite3").stat().st_size
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(tmp_path / "shared")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "another process" in done.stdout and "PostgreSQL" in done.stdout
    # the refused process changed nothing
    assert [x.id for x in m.get_messages("s", user_id="u")] == ids
    assert (tmp_path / "shared" / "records.sqlite3").stat().st_size == before
    m.add("user", "still writable here", session_id="s", user_id="u")


def test_the_lock_is_per_folder_and_released_on_close(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                      embedder: Any) -> None:
    a = make_memory("a")
    make_memory("b")  # another folder in the same process is fine
    try:
        TieredMemory(tmp_path / "a", embedder=embedder)
    except StoreLockedError:
        pass
    else:
        raise AssertionError("a second TieredMemory on an open folder was allowed")
    a.close()
    with TieredMemory(tmp_path / "a", embedder=embedder) as again:
        assert again.stats().messages == 0


def test_the_guarantees_document_states_the_process_model() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "guarantees.md").read_text(encoding="utf-8")
    for phrase in ("StoreLockedError", "thread-safe", "PostgreSQL", "synchronous=FULL", "forget_user",
                   "not promised"):
        assert phrase.lower() in doc.lower(), phrase
