"""Working memory shared by worker processes on PostgreSQL.

Several OS processes, each with its own TieredMemory and connection pool, write to one
user's session at once. The session never holds more than ``capacity`` items (not even
for a moment another worker could see), each item that left it has exactly one audit
entry (``evict``, or ``prune`` when a worker's consolidation pruned it first), and no
worker's scratchpad key is lost to another's write of the pad.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.config import ConsolidationConfig, WorkingConfig

pytestmark = pytest.mark.servers

WORKERS = 6
ADDS = 25
USER, SESSION = "u", "shared"
MIXED = [0.9, 0.2, 0.6, 0.01, 0.4, 0.8, 0.03, 0.3, 0.7, 0.5, 0.02]
HALF_PRUNABLE = [0.01, 0.9, 0.02, 0.6, 0.03, 0.8, 0.04]  # < 0.05: below ConsolidationConfig.prune_below
PRELOAD = ["numpy", "psycopg", "psycopg_pool", "tiered_memory"]


def open_memory(folder: Path, url: str, capacity: int) -> TieredMemory:
    # an item is pruned once as old as session_idle_hours: at 0, the pruners race the writers
    return TieredMemory(folder, record_store=url, vector_store="pgvector",
                        config=MemoryConfig(working=WorkingConfig(capacity=capacity),
                                            consolidation=ConsolidationConfig(session_idle_hours=0.0)))


def worker_main(worker: int, folder: Path, url: str, capacity: int, importance: list[float], pruner: bool,
                gates: tuple[Any, Any], done: Any, results: Any) -> None:
    """Remember ``ADDS`` items in the shared session (the last one at the same moment as the
    other writers), or, as a pruner, consolidate the user until the writers are done."""
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        memory = open_memory(folder, url, capacity)
        memory.embedder.embed_query("warm up")  # load the table before the race starts
        wm = memory.working_memory(SESSION, user_id=USER)
        added: list[str] = []
        most = 0
        start, last = gates
        start.wait(timeout=120)
        while pruner and not done.is_set():
            memory.consolidate(USER)
            most = max(most, len(wm.items()))
        for i in range(0 if pruner else ADDS):
            if i == ADDS - 1:
                last.wait(timeout=120)
            note = wm.remember(f"w{worker} note {i}", importance=importance[(worker * 7 + i) % len(importance)])
            added.append(note.id)
            wm.scratchpad[f"w{worker}"] = i
            most = max(most, len(wm.items()))
        memory.close()
        results.put((worker, "ok", added, most))
    except BaseException:
        results.put((worker, "error", traceback.format_exc(), 0))


def run_workers(tmp_path: Path, url: str, capacity: int, importance: list[float], pruners: int,
                ) -> list[tuple[int, str, Any, int]]:
    """Reports of ``WORKERS`` processes, the first ``pruners`` of them pruners."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    writers = WORKERS - pruners
    gates, done, results = (ctx.Barrier(WORKERS), ctx.Barrier(writers)), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=worker_main, args=(w, tmp_path / f"w{w}", url, capacity, importance,
                                                   w < pruners, gates, done, results)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    reports: list[tuple[int, str, Any, int]] = []
    try:
        while len(reports) < WORKERS:
            reports.append(results.get(timeout=300))
            if sum(1 for r in reports if r[2]) >= writers or any(r[1] != "ok" for r in reports):
                done.set()  # the writers are done (or one failed): the pruner stops
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {WORKERS} workers reported")
    finally:
        done.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return reports


@pytest.mark.parametrize("capacity, importance, pruners", [
    (4, MIXED, 0),  # full at once: nearly every add evicts
    (12, HALF_PRUNABLE, 2),  # the pruners race the writers' evictions and each other
], ids=["writers", "writers-and-pruners"])
def test_workers_writing_one_session_keep_its_capacity_and_audit_each_removal_once(
        make_pgvector_url: Callable[[], str], tmp_path: Path, capacity: int, importance: list[float],
        pruners: int) -> None:
    url = make_pgvector_url()
    open_memory(tmp_path / "setup", url, capacity).close()  # the schema, once, before the workers race
    reports = run_workers(tmp_path, url, capacity, importance, pruners)
    errors = [r[2] for r in reports if r[1] != "ok"]
    assert errors == [], "\n".join(errors)
    assert max(r[3] for r in reports) <= capacity  # what any worker saw after its own write

    added = [i for r in reports for i in r[2]]
    writers = [r[0] for r in reports if r[2]]
    assert len(writers) == WORKERS - pruners and len(added) == len(set(added)) == len(writers) * ADDS
    with open_memory(tmp_path / "check", url, capacity) as memory:
        wm = memory.working_memory(SESSION, user_id=USER)
        live = {i.id for i in wm.items()}
        assert len(live) <= capacity and live <= set(added)
        audit = memory.audit_log(USER, layer="working")
        removals = Counter(e.item_id for e in audit)
        assert {e.action for e in audit} == ({"evict", "prune"} if pruners else {"evict"})  # both raced
        assert [i for i, n in removals.items() if n > 1] == []  # each removal recorded once
        assert set(removals) == set(added) - live  # and every item that left has its record
        assert wm.scratchpad.to_dict() == {f"w{w}": ADDS - 1 for w in writers}
