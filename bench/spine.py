"""What one read costs inside the library: record-store round trips, write transactions,
query embeddings and latency of ``search`` and ``build_context``, before and after a change.

The embedding model is taken out of the figure (a deterministic 384-d hash embedder), so
only what the library adds is measured. One user holds ``--memories`` turns (LoCoMo dev
conversations, repeated with a suffix when there are not enough), a few sessions are
closed into episodes and facts, and the current session has working-memory items; then
``--queries`` LoCoMo questions are asked through ``search(k=10)`` and
``build_context(max_tokens=2000)``.

Round trips are calls into the record store object (nested calls inside one store
method are not counted again); write transactions are SQLite ``COMMIT`` statements seen
by the connection's trace callback during the call. Access counts that reads note are
written later in batches by a background thread (``MemoryConfig.access_flush_size``);
the run sets that threshold above the number of reads, so the batch is reported on its
own line and not inside a read.

``--before REF`` measures a git ref of this repository in the same run (a temporary
worktree, this script run there with that tree first on ``PYTHONPATH``), so the two
columns come from one machine in one sitting::

    python -m bench.spine --before eb79938~1 --memories 3000
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo_dev.json"
_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Signed feature hashing of lower-cased words into ``dim`` buckets (deterministic,
    no model); counts the calls it gets."""

    name = "hash-384 (bench)"

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.query_calls = 0
        self.document_calls = 0

    def _vector(self, text: str) -> list[float]:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 40) & 1 else -1.0
        n = float(np.linalg.norm(v))
        return (v / n if n else v).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.document_calls += 1
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        self.query_calls += 1
        return self._vector(text)


def load_turns_and_questions(path: Path) -> tuple[list[list[str]], list[str]]:
    data = json.loads(path.read_text())
    sessions: list[list[str]] = []
    questions: list[str] = []
    for conv in data:
        c = conv["conversation"]
        n = 1
        while f"session_{n}" in c:
            sessions.append([f"{t['speaker']}: {t['text']}" for t in c[f"session_{n}"]])
            n += 1
        questions += [q["question"] for q in conv["qa"] if q.get("evidence")]
    return sessions, questions


class StoreCounter:
    """Counts top-level calls into a record store object, by method."""

    def __init__(self, store: Any) -> None:
        self.calls: dict[str, int] = {}
        self._depth = threading.local()
        for name in dir(store):
            if name.startswith("_"):
                continue
            attr = getattr(store, name)
            if inspect.ismethod(attr):
                setattr(store, name, self._wrap(name, attr))

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            if depth == 0 and threading.current_thread() is threading.main_thread():
                self.calls[name] = self.calls.get(name, 0) + 1
            self._depth.n = depth + 1
            try:
                return method(*args, **kwargs)
            finally:
                self._depth.n = depth
        return counted

    def total(self) -> int:
        return sum(self.calls.values())


def measure(memories: int, queries: int) -> dict[str, Any]:
    """Build the store and time the reads in this process (the tree on sys.path)."""
    from tiered_memory import MemoryConfig, TieredMemory

    sessions, questions = load_turns_and_questions(DATA)
    embedder = HashEmbedder()
    folder = Path(tempfile.mkdtemp(prefix="tm-spine-"))
    config = MemoryConfig()
    if hasattr(config, "access_flush_size"):
        config = MemoryConfig(access_flush_size=10 * queries * 60, access_flush_seconds=3600.0)
    memory = TieredMemory(folder, embedder=embedder, config=config)
    try:
        t0 = time.perf_counter()
        stored, round_ = 0, 0
        sid = 0
        while stored < memories:
            for turns in sessions:
                part = turns[: memories - stored]
                if not part:
                    break
                suffix = f" (round {round_})" if round_ else ""
                memory.add_many([{"role": "user" if i % 2 == 0 else "assistant", "content": t + suffix}
                                 for i, t in enumerate(part)], session_id=f"s{sid}", user_id="big")
                stored += len(part)
                sid += 1
        for s in range(3):  # episodes and facts, by the extractive fallback
            memory.end_session(f"s{s}", user_id="big")
        memory.add_many([{"role": "user", "content": "I moved to Porto last spring and I love hiking."},
                         {"role": "assistant", "content": "Porto has lovely trails nearby."}],
                        session_id="now", user_id="big")
        wm = memory.working_memory("now", user_id="big")
        wm.remember("user is planning a hiking trip", importance=0.8, type="goal")
        wm.remember("budget is tight this month", importance=0.5)
        ingest_s = time.perf_counter() - t0
        counter = StoreCounter(memory.store)
        commits = {"n": 0}

        def trace(sql: str) -> None:
            if threading.current_thread() is threading.main_thread() and sql.strip().upper().startswith("COMMIT"):
                commits["n"] += 1

        memory.store.conn.set_trace_callback(trace)
        asked = questions[:queries]
        out: dict[str, Any] = {"tree": str(Path(sys.modules["tiered_memory"].__file__).parent.parent),
                               "memories": stored, "queries": len(asked), "ingest_s": round(ingest_s, 1)}
        for name, call in (("search", lambda q: memory.search(q, user_id="big", k=10)),
                           ("build_context", lambda q: memory.build_context(q, user_id="big", session_id="now",
                                                                            max_tokens=2000))):
            call(asked[0])  # warm caches
            latencies, trips, writes, embeds = [], [], [], []
            for q in asked:
                before = (counter.total(), commits["n"], embedder.query_calls + embedder.document_calls)
                t = time.perf_counter()
                call(q)
                latencies.append((time.perf_counter() - t) * 1000)
                trips.append(counter.total() - before[0])
                writes.append(commits["n"] - before[1])
                embeds.append(embedder.query_calls + embedder.document_calls - before[2])
            lat = sorted(latencies)
            out[name] = {"p50_ms": round(statistics.median(lat), 2), "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 2),
                         "store_round_trips": round(statistics.mean(trips), 2),
                         "write_transactions": round(statistics.mean(writes), 3),
                         "query_embeddings": round(statistics.mean(embeds), 2)}
        access = getattr(getattr(memory, "parts", None), "access", None)
        if access is not None:
            pending = access.pending
            c0 = commits["n"]
            access.flush()
            out["access_batch"] = {"accesses": pending, "write_transactions": commits["n"] - c0}
        return out
    finally:
        memory.close()
        shutil.rmtree(folder, ignore_errors=True)


def run_tree(tree: Path, memories: int, queries: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", "--memories", str(memories),
                           "--queries", str(queries)], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def table(columns: dict[str, dict[str, Any]]) -> str:
    names = list(columns)
    rows = [("", *names)]
    for call in ("search", "build_context"):
        for key, label in (("store_round_trips", "store round trips"), ("write_transactions", "write transactions"),
                           ("query_embeddings", "query embeddings"), ("p50_ms", "p50 ms"), ("p95_ms", "p95 ms")):
            rows.append((f"{call}: {label}", *(str(columns[n][call][key]) for n in names)))
    for n in names:
        batch = columns[n].get("access_batch")
        if batch:
            rows.append((f"access counts ({n})", f"{batch['accesses']} accesses in "
                         f"{batch['write_transactions']} write transaction(s)"))
    width = [max(len(r[i]) for r in rows if i < len(r)) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(c.ljust(width[i]) for i, c in enumerate(r)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--memories", type=int, default=3000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--before", metavar="REF", help="also measure this git ref, in the same run")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.memories, args.queries)))
        return 0
    root = Path(__file__).resolve().parents[1]
    columns: dict[str, dict[str, Any]] = {}
    if args.before:
        tmp = Path(tempfile.mkdtemp(prefix="tm-before-"))
        subprocess.run(["git", "-C", str(root), "worktree", "add", "-q", "--detach", str(tmp / "tree"), args.before],
                       check=True)
        try:
            columns[f"before ({args.before})"] = run_tree(tmp / "tree", args.memories, args.queries)
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tmp / "tree")], check=False)
            shutil.rmtree(tmp, ignore_errors=True)
    columns["this tree"] = run_tree(root, args.memories, args.queries)
    print(f"{args.memories} memories of one user, {args.queries} LoCoMo questions, hash embedder (model excluded)")
    print(table(columns))
    if args.json:
        Path(args.json).write_text(json.dumps(columns, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
