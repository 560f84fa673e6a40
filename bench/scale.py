"""Speed at scale: what the library adds to the engines as one user's memory grows.

The embedding model is out of the figure (the deterministic 384-d hash embedder of
:mod:`bench.spine`, memoised, so a text is hashed once), so only the library is timed.
One store holds ``--others`` memories of 50 other users and one user grown to each of
``--sizes``; at each size, in the same run and on the same vectors:

- ``search(k=10)`` p50/p95 for 200 LoCoMo questions, against a plain Chroma collection
  queried with a metadata filter on the user (k=10), and an exact numpy scan of that
  user's vectors (the floor), as ratios;
- ``build_context`` p50/p95 (``max_tokens=2000``) against search p95;
- ingest: ``add_many`` of 50 new turns, ``--batches`` times (then ``flush()``), against plain Chroma
  ``add`` of the same 50 vectors (same batches), as throughput and a ratio;
- 4 reader threads against 1 (the same questions; do reads run in parallel?);
- RSS of this process and the store's size on disk.

Then ``--small-users`` users of 20 turns each in a second store: a small user's search,
before and after one user with ``--big-user`` turns joins them; a cold open of the
main store (open plus the first search, the largest size); and the bulk path: ``--bulk``
messages in one ``add_many`` call (with a progress callback, until ``flush()``) and the
same messages through ``import_jsonl`` of their export, each into a fresh store, against
plain Chroma ``add`` of the same vectors in batches of 2,000 (``--bulk-rounds``: in turn, the
median ratio).

Default sizes run in some minutes on a busy 2-core box. The full measurement::

    nice -n 10 python -m bench.scale --sizes 3000 30000 100000 --big-user 100000 --bulk 100000 --out bench/results/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .locomo_data import load_conversations, percentile
from .spine import DATA, HashEmbedder

K = 10


class MemoEmbedder(HashEmbedder):
    """The hash embedder with every vector kept: the bench hashes each text once, so the
    library and plain Chroma get the same vectors and neither pays for them. It hands the
    library unit float32 arrays (``embed_array``), as the bundled embedders do, so no list of
    floats is built and parsed again on the way either."""

    name = "hash-384 (bench, memoised)"

    def __init__(self) -> None:
        super().__init__(384)
        self.memo: dict[str, np.ndarray] = {}  # float32 arrays: lists of floats would swell the RSS figure 6x

    def _array(self, text: str) -> np.ndarray:
        v = self.memo.get(text)
        if v is None:
            v = self.memo[text] = np.asarray(super()._vector(text), dtype=np.float32)
        return v

    def _vector(self, text: str) -> list[float]:
        return self._array(text).tolist()  # type: ignore[no-any-return]

    def matrix(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self._array(t) for t in texts]) if texts else np.zeros((0, 384), dtype=np.float32)

    def embed_array(self, texts: list[str]) -> np.ndarray:
        self.document_calls += 1
        return self.matrix(texts)

    def query_array(self, text: str) -> np.ndarray:
        self.query_calls += 1
        return self._array(text)


def corpus(turns: Sequence[str], n: int, seed: int) -> list[str]:
    """``n`` distinct turn texts: the LoCoMo turns, then pairs of them (a repeat with a
    suffix would be a near-duplicate, which the library rightly refuses to index twice)."""
    rng = np.random.default_rng(seed)
    out = list(turns[:n])
    while len(out) < n:
        a, b = rng.integers(0, len(turns), 2)
        out.append(f"{turns[a]} {turns[b]}")
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def disk_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def pct(values: Sequence[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50) * 1000, 2), "p95": round(percentile(values, 95) * 1000, 2)}


def timed(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[float]:
    out = []
    for item in items:
        t = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - t)
    return out


class Bar:
    """A progress bar on stderr (tqdm), off when stderr is not a terminal and ``--quiet``."""

    def __init__(self, total: int, desc: str, quiet: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="msg", file=sys.stderr, disable=True if quiet else None,
                        leave=False)

    def __call__(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


class Plain:
    """The baseline: one plain Chroma collection, the same vectors, ``user_id`` metadata."""

    def __init__(self, folder: Path) -> None:
        import chromadb
        from chromadb.config import Settings

        self.client = chromadb.PersistentClient(path=str(folder), settings=Settings(anonymized_telemetry=False))
        self.col = self.client.get_or_create_collection("plain", embedding_function=None,
                                                        configuration={"hnsw": {"space": "cosine"}})
        self.n = 0

    def add(self, user: str, vectors: np.ndarray) -> None:
        for start in range(0, len(vectors), 2000):
            part = vectors[start:start + 2000]
            ids = [f"p{self.n + i}" for i in range(len(part))]
            self.col.add(ids=ids, embeddings=part, metadatas=[{"user_id": user}] * len(part))
            self.n += len(part)

    def query(self, user: str, vector: np.ndarray) -> Any:
        return self.col.query(query_embeddings=vector[None, :], n_results=K, where={"user_id": user},
                              include=["distances"])


def exact_scan(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """The floor: cosine of every vector of the user, best ``K``. In blocks of 1,024 rows, the
    fastest numpy way here (above that OpenBLAS threads the product, which on a loaded box
    costs 10-50x)."""
    sims = np.empty(len(matrix), dtype=np.float32)
    for s in range(0, len(matrix), 1024):
        np.dot(matrix[s:s + 1024], vector, out=sims[s:s + 1024])
    top = np.argpartition(-sims, K)[:K] if len(sims) > K else np.arange(len(sims))
    return top[np.argsort(-sims[top])]


def fill(memory: Any, user: str, texts: Sequence[str], start: int, bar: Bar, chunk: int = 1000) -> None:
    """Bulk-load ``texts`` for ``user`` through ``add_many``, 20 turns a session."""
    for i in range(0, len(texts), chunk):
        part = texts[i:i + chunk]
        by_session: dict[int, list[dict[str, Any]]] = {}
        for j, text in enumerate(part, start=start + i):
            by_session.setdefault(j // 20, []).append(
                {"role": "user" if j % 2 else "assistant", "content": text, "timestamp": 1.6e9 + j * 60})
        for s, msgs in by_session.items():
            memory.add_many(msgs, session_id=f"s{s}", user_id=user)
        bar(len(part))


def threads_ratio(search: Callable[[str], Any], questions: Sequence[str]) -> dict[str, float]:
    t = time.perf_counter()
    for q in questions:
        search(q)
    one = time.perf_counter() - t
    chunks = [questions[i::4] for i in range(4)]
    workers = [threading.Thread(target=lambda qs=qs: [search(q) for q in qs]) for qs in chunks]
    t = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    four = time.perf_counter() - t
    return {"one_thread_s": round(one, 3), "four_threads_s": round(four, 3), "speedup": round(one / four, 2)}


def measure_size(memory: Any, plain: Plain, emb: MemoEmbedder, user: str, texts: Sequence[str],
                 questions: Sequence[str], args: argparse.Namespace, folder: Path, fresh: list[str]) -> dict[str, Any]:
    qvecs = emb.matrix(questions)
    for q in questions[:5]:  # warm: the steady state is timed here, the first search by the cold open
        memory.search(q, user_id=user, k=K)
    held = getattr(memory.index, "scans_exactly", None)  # this tree's exact scan: wait until it holds the user
    if held is not None:
        held(user, wait=True)
    lib = timed(lambda q: memory.search(q, user_id=user, k=K), questions)
    pl = timed(lambda i: plain.query(user, qvecs[i]), range(len(questions)))
    matrix = emb.matrix(texts)
    floor = timed(lambda i: exact_scan(matrix, qvecs[i]), range(len(questions)))
    session = f"s{(len(texts) - 1) // 20}"
    ctx = timed(lambda q: memory.build_context(q, user_id=user, session_id=session, max_tokens=2000), questions)
    batches = [fresh[b * 50:(b + 1) * 50] for b in range(args.batches)]
    vectors = [emb.matrix(batch) for batch in batches]  # hashed beforehand: the model is out of the figure
    t = time.perf_counter()  # the library's whole run, until its vectors are written (flush)
    for b, batch in enumerate(batches):
        memory.add_many([{"role": "user", "content": text, "timestamp": 1.7e9 + b} for text in batch],
                        session_id=f"ingest{len(texts)}-{b}", user_id=user)
    memory.flush()
    lib_seconds = time.perf_counter() - t
    t = time.perf_counter()
    for vecs in vectors:
        plain.add(user + "-ingest", vecs)
    plain_seconds = time.perf_counter() - t
    del fresh[: args.batches * 50]
    lib_rate, plain_rate = 50 * len(batches) / lib_seconds, 50 * len(batches) / plain_seconds
    out = {
        "memories": len(texts), "store": memory.stats().messages,
        "search_ms": pct(lib), "plain_chroma_ms": pct(pl), "exact_scan_ms": pct(floor),
        "search_p95_vs_plain": round(percentile(lib, 95) / percentile(pl, 95), 2),
        "search_p95_vs_exact": round(percentile(lib, 95) / percentile(floor, 95), 2),
        "build_context_ms": pct(ctx), "context_p95_vs_search_p95": round(percentile(ctx, 95) / percentile(lib, 95), 2),
        "ingest_per_s": round(lib_rate, 1), "plain_add_per_s": round(plain_rate, 1),
        "ingest_vs_plain": round(lib_rate / plain_rate, 2),
        "threads": threads_ratio(lambda q: memory.search(q, user_id=user, k=K), questions),
        "rss_mb": round(rss_mb(), 1), "disk_mb": round(disk_mb(folder), 1),
    }
    print(f"  {len(texts):>7,} of {out['store']:>7,} | search {out['search_ms']['p50']:.1f} / "
          f"{out['search_ms']['p95']:.1f} ms | plain Chroma {out['plain_chroma_ms']['p50']:.1f} / "
          f"{out['plain_chroma_ms']['p95']:.1f} ms ({out['search_p95_vs_plain']}x) | exact scan "
          f"{out['exact_scan_ms']['p50']:.2f} / {out['exact_scan_ms']['p95']:.2f} ms ({out['search_p95_vs_exact']}x) | "
          f"context {out['build_context_ms']['p50']:.1f} / {out['build_context_ms']['p95']:.1f} ms "
          f"({out['context_p95_vs_search_p95']}x search) | ingest {out['ingest_per_s']:.0f}/s vs "
          f"{out['plain_add_per_s']:.0f}/s ({out['ingest_vs_plain']}x) | 4 threads "
          f"{out['threads']['speedup']}x | RSS {out['rss_mb']:.0f} MB, disk {out['disk_mb']:.0f} MB", flush=True)
    return out


def small_users(args: argparse.Namespace, turns: Sequence[str], questions: Sequence[str], root: Path,
                emb: MemoEmbedder) -> dict[str, Any]:
    from tiered_memory import TieredMemory

    folder = root / "small"
    texts = corpus(turns, args.small_users * 20, seed=2)
    with TieredMemory(folder, embedder=emb) as memory:
        bar = Bar(len(texts) + args.big_user, "small users", args.quiet)
        for u in range(args.small_users):
            fill(memory, f"small{u}", texts[u * 20:(u + 1) * 20], 0, bar)
        probe = [f"small{u}" for u in range(0, args.small_users, max(1, args.small_users // 20))]
        qs = [(probe[i % len(probe)], q) for i, q in enumerate(questions)]
        before = timed(lambda uq: memory.search(uq[1], user_id=uq[0], k=K), qs)
        fill(memory, "big", corpus(turns, args.big_user, seed=3), 0, bar)
        after = timed(lambda uq: memory.search(uq[1], user_id=uq[0], k=K), qs)
        bar.close()
    out = {"small_users": args.small_users, "big_user": args.big_user, "before_ms": pct(before),
           "after_ms": pct(after), "p95_after_vs_before": round(percentile(after, 95) / percentile(before, 95), 2)}
    print(f"  {args.small_users:,} small users: a small user's search {out['before_ms']['p50']:.1f} / "
          f"{out['before_ms']['p95']:.1f} ms; with one {args.big_user:,}-memory user "
          f"{out['after_ms']['p50']:.1f} / {out['after_ms']['p95']:.1f} ms ({out['p95_after_vs_before']}x)", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return out


def bulk(args: argparse.Namespace, turns: Sequence[str], root: Path, emb: MemoEmbedder) -> dict[str, Any]:
    """One ``add_many`` call and one ``import_jsonl`` of ``--bulk`` messages, each into a fresh
    store, against plain Chroma ``add`` of the same vectors (hashed beforehand). ``--bulk-rounds``
    repeats the three in turn (plain first) and reports each round's ratios and their median:
    on this 2-core box one engine's own time for the same write moves by a quarter between runs."""
    from tiered_memory import TieredMemory

    texts = corpus(turns, args.bulk, seed=7)
    messages = [{"role": "user" if j % 2 else "assistant", "content": t, "timestamp": 1.6e9 + j * 60}
                for j, t in enumerate(texts)]
    vectors = emb.matrix(texts)
    n = len(texts)
    rounds: list[dict[str, float]] = []
    dump = root / "bulk.jsonl"
    for r in range(args.bulk_rounds):
        t = time.perf_counter()
        Plain(root / f"bulk-plain-{r}").add("bulk", vectors)  # a new folder: Chroma caches a client per path
        plain = time.perf_counter() - t
        bar = Bar(2 * n, f"bulk {r + 1}/{args.bulk_rounds}", args.quiet)
        with TieredMemory(root / f"bulk-call-{r}", embedder=emb) as memory:
            t = time.perf_counter()
            memory.add_many(messages, session_id="import", user_id="bulk", progress=bar)
            memory.flush()
            call = time.perf_counter() - t
            memory.export_jsonl(dump)
        with TieredMemory(root / f"bulk-import-{r}", embedder=emb) as memory:
            t = time.perf_counter()
            imported = memory.import_jsonl(dump, progress=bar).imported
            memory.flush()
            load = time.perf_counter() - t
        bar.close()
        rounds.append({"imported": imported, "plain_s": round(plain, 2), "add_many_s": round(call, 2), "import_jsonl_s": round(load, 2),
                       "add_many_vs_plain": round(plain / call, 3), "import_jsonl_vs_plain": round(plain / load, 3)})
        for name in ("bulk-call", "bulk-import", "bulk-plain"):
            shutil.rmtree(root / f"{name}-{r}", ignore_errors=True)
        print(f"  bulk round {r + 1}: plain Chroma add {n / plain:.0f}/s, add_many {n / call:.0f}/s "
              f"({plain / call:.2f}x), import_jsonl {n / load:.0f}/s ({plain / load:.2f}x)", flush=True)
    out = {"messages": n, "imported": rounds[-1]["imported"], "rounds": rounds,
           "add_many_vs_plain": round(statistics.median(x["add_many_vs_plain"] for x in rounds), 2),
           "import_jsonl_vs_plain": round(statistics.median(x["import_jsonl_vs_plain"] for x in rounds), 2),
           "plain_add_per_s": round(n / statistics.median(x["plain_s"] for x in rounds), 1)}
    print(f"  bulk, {n:,} messages in one call, median of {len(rounds)} round(s): add_many "
          f"{out['add_many_vs_plain']}x, import_jsonl {out['import_jsonl_vs_plain']}x plain Chroma add", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[3000, 30000], help="the user's memories, growing")
    p.add_argument("--others", type=int, default=20000, help="memories of 50 other users in the same store")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--batches", type=int, default=20, help="add_many batches of 50 timed at each size")
    p.add_argument("--small-users", type=int, default=1000)
    p.add_argument("--big-user", type=int, default=30000, help="the big user beside the small ones (0: skip)")
    p.add_argument("--bulk", type=int, default=20000, help="messages in one add_many / import_jsonl (0: skip)")
    p.add_argument("--bulk-rounds", type=int, default=1, help="rounds of plain, add_many, import_jsonl (median ratio)")
    p.add_argument("--data", default=str(DATA), help="LoCoMo-format JSON (questions and turns)")
    p.add_argument("--out", help="JSON output")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    from tiered_memory import TieredMemory

    convs = load_conversations(args.data)
    turns = [t.text for c in convs for t in c.turns]
    questions = [q.question for c in convs for q in c.questions][: args.queries]
    sizes = sorted(args.sizes)
    emb = MemoEmbedder()
    root = Path(tempfile.mkdtemp(prefix="tm-scale-"))
    print(f"bench.scale: {len(questions)} questions, {args.others:,} memories of 50 other users, sizes "
          f"{', '.join(f'{s:,}' for s in sizes)}; hash-384 embedder (model out of the figure); "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict[str, Any] = {"sizes": [], "others": args.others, "queries": len(questions),
                               "load_average": os.getloadavg()[0], "cpus": os.cpu_count()}
    try:
        texts = corpus(turns, sizes[-1], seed=0)
        fresh = corpus(turns, sizes[-1] + args.batches * 50 * (len(sizes) + 1), seed=1)[sizes[-1]:]
        folder = root / "main"
        memory = TieredMemory(folder, embedder=emb)
        plain = Plain(root / "plain")
        others = corpus(turns, args.others, seed=4)
        bar = Bar(args.others + sizes[-1], "ingesting", args.quiet)
        per = max(1, args.others // 50)
        for u in range(50):
            part = others[u * per:(u + 1) * per]
            fill(memory, f"other{u}", part, 0, bar)
            plain.add(f"other{u}", emb.matrix(part))
        done = 0
        for size in sizes:
            fill(memory, "me", texts[done:size], done, bar)
            plain.add("me", emb.matrix(texts[done:size]))
            done = size
            bar.bar.clear()
            results["sizes"].append(measure_size(memory, plain, emb, "me", texts[:size], questions, args, folder, fresh))
        bar.close()
        memory.close()
        t = time.perf_counter()
        with TieredMemory(folder, embedder=emb) as cold:
            opened = time.perf_counter() - t
            cold.search(questions[0], user_id="me", k=K)
            first = time.perf_counter() - t
            held = getattr(cold.index, "scans_exactly", None)
            exact = None
            if held is not None and held("me", wait=True):
                exact = round(time.perf_counter() - t, 2)
        results["cold_open"] = {"memories": sizes[-1], "open_s": round(opened, 2), "first_search_s": round(first, 2),
                                "exact_scan_ready_s": exact}
        print(f"  cold open of the store with {sizes[-1]:,} memories of one user: open {opened:.2f} s, "
              f"first search {first:.2f} s after the open began"
              + (f", exact scan holding the user {exact:.2f} s" if exact is not None else ""), flush=True)
        if args.small_users:
            results["small_users"] = small_users(args, turns, questions, root, emb)
        if args.bulk:
            results["bulk"] = bulk(args, turns, root, emb)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
