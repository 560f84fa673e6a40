"""The LangGraph store under LangGraph's concurrent-batch workload: ``TieredMemoryStore``
against LangGraph's own ``AsyncSqliteStore`` (``langgraph-checkpoint-sqlite``, in the
``test`` extra), in the same run.

The workload is the shape of ``test_large_batches_async`` in LangGraph's SQLite store
tests: ``M`` rounds of ``N`` keys, each key getting six async operations (put, get,
list namespaces, search, put, delete) started together and awaited with one
``asyncio.gather``: 6,000 operations at the defaults. LangGraph's fixture store has no
vector index, so neither side embeds there (every key's last operation is a delete, so
the puts coalesce away on both sides).

``--workload distinct`` is the harder case for us: every put has its own key and stays,
and our store indexes the value's ``text`` (the bundled static embedder), so its puts
embed and write and its searches are semantic. LangGraph's store runs it without a
vector index (its sqlite-vec extension needs a ``sqlite3`` that can load extensions,
which this Python's cannot), so it only writes and filters: the ratio is an upper bound
on what we add.

Times are wall-clock medians of ``--repeats`` runs, each on a fresh store in a
temporary folder; read the ratio, which comes from one run on one machine::

    python -m bench.langgraph_store
    python -m bench.langgraph_store --workload distinct --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

Store = Any  # a LangGraph BaseStore (ours or theirs)


def langgraph_ops(store: Store, rounds: int, keys: int) -> list[Awaitable[Any]]:
    """The operations of LangGraph's ``test_large_batches_async``, in its order."""
    ops: list[Awaitable[Any]] = []
    for m in range(rounds):
        ns = ("test", "foo", "bar", "baz", str(m % 2))
        for i in range(keys):
            ops.append(store.aput(ns, f"key{i}", value={"foo": "bar" + str(i)}))
            ops.append(asyncio.ensure_future(store.aget(ns, f"key{i}")))
            ops.append(asyncio.ensure_future(store.alist_namespaces(prefix=None, max_depth=m + 1)))
            ops.append(asyncio.ensure_future(store.asearch(("test",))))
            ops.append(store.aput(ns, f"key{i}", value={"foo": "bar" + str(i)}))
            ops.append(store.adelete(ns, f"key{i}"))
    return ops


TOPICS = ["green tea", "jazz records", "mountain bikes", "sourdough bread", "chess openings"]


def distinct_ops(store: Store, rounds: int, keys: int) -> list[Awaitable[Any]]:
    """Six operations a key, as above, but every put has its own key and stays, and the
    searches have a query."""
    ops: list[Awaitable[Any]] = []
    for m in range(rounds):
        ns = ("test", f"user{m % 2}", "notes")
        for i in range(keys):
            text = f"note {m}-{i} about {TOPICS[i % len(TOPICS)]}"
            ops.append(store.aput(ns, f"k{m}-{i}", {"text": text}))
            ops.append(asyncio.ensure_future(store.aget(ns, f"k{m}-{i}")))
            ops.append(asyncio.ensure_future(store.alist_namespaces(prefix=("test",), max_depth=3)))
            ops.append(asyncio.ensure_future(store.asearch(("test", f"user{m % 2}"), query=TOPICS[i % 5], limit=5)))
            ops.append(store.aput(ns, f"k{m}-{i}b", {"text": text + " (again)"}))
            ops.append(store.adelete(ns, f"k{m}-{i}b"))
    return ops


async def timed(make: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await make()
    return time.perf_counter() - start


async def run_ours(folder: Path, workload: str, rounds: int, keys: int) -> tuple[float, int]:
    from langchain_tiered_memory import TieredMemoryStore
    from tiered_memory import TieredMemory

    memory = TieredMemory(folder / "tiered")
    try:
        store = TieredMemoryStore(memory, fields=["text"] if workload == "distinct" else None)
        make = distinct_ops if workload == "distinct" else langgraph_ops
        ops = make(store, rounds, keys)
        seconds = await timed(lambda: asyncio.gather(*ops))
        return seconds, len(ops)
    finally:
        memory.close()


async def run_langgraph(folder: Path, workload: str, rounds: int, keys: int) -> tuple[float, int]:
    from langgraph.store.sqlite import AsyncSqliteStore

    # no vector index: its sqlite-vec extension needs a Python whose sqlite3 can load
    # extensions, which this one (like many distribution builds) cannot
    async with AsyncSqliteStore.from_conn_string(str(folder / "langgraph.sqlite")) as store:
        await store.setup()
        make = distinct_ops if workload == "distinct" else langgraph_ops
        ops = make(store, rounds, keys)
        seconds = await timed(lambda: asyncio.gather(*ops))
        return seconds, len(ops)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=["langgraph", "distinct"], default="langgraph")
    ap.add_argument("--rounds", type=int, default=10, help="M in LangGraph's test (default 10)")
    ap.add_argument("--keys", type=int, default=100, help="N in LangGraph's test (default 100)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    ours: list[float] = []
    theirs: list[float] = []
    count = 0
    for _ in range(args.repeats):  # alternate, so load on a shared machine hits both alike
        with tempfile.TemporaryDirectory() as tmp:
            s, count = asyncio.run(run_langgraph(Path(tmp), args.workload, args.rounds, args.keys))
            theirs.append(s)
        with tempfile.TemporaryDirectory() as tmp:
            s, count = asyncio.run(run_ours(Path(tmp), args.workload, args.rounds, args.keys))
            ours.append(s)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"workload {args.workload}: {count:,} async operations, median of {args.repeats} runs")
    print(f"  AsyncSqliteStore (LangGraph) {b:8.3f} s")
    print(f"  TieredMemoryStore            {a:8.3f} s   ({a / b:.2f}x LangGraph's)")
    if args.json:
        args.json.write_text(json.dumps({"workload": args.workload, "operations": count, "ours_s": ours,
                                         "langgraph_s": theirs, "ratio": a / b}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
