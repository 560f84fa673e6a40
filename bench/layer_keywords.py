"""What a user's keyword query of their facts costs in a SQLite store of many users, and what
writing the facts costs, with whatever scheme the checked-out code uses (run it on two
commits to compare them).

``--users`` users hold ``--facts`` facts each, and two measured users more: ``big`` with
``--big`` facts and ``small`` with 20. A fact is six words drawn from a Zipf-like
vocabulary of 5,000 made-up words (so common words are common in every user's facts); a
query is three such words, asked as ``search_facts`` asks them (best 40). Facts go in by
plain inserts in one transaction, as another writer would: the table's triggers index them.

Prints the write time and p50 / p95 of the two users' keyword queries (no assertions: a
measurement)::

    python -m bench.layer_keywords --users 500 --facts 100 --big 2000
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from tiered_memory.backends import open_layer_store
from tiered_memory.store.sqlite import SQLiteRecordStore

INSERT = ("INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
          " VALUES (?, ?, 'fact', ?, 1, 0, 0, 0)")
VOCABULARY = 5000


def words(rng: random.Random, n: int) -> list[str]:
    """``n`` made-up words, the w-th drawn with weight 1 / (w + 1)."""
    picks = rng.choices(range(VOCABULARY), weights=[1 / (w + 1) for w in range(VOCABULARY)], k=n)
    return [f"zu{w:04d}x" for w in picks]


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=500)
    ap.add_argument("--facts", type=int, default=100)
    ap.add_argument("--big", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    rng = random.Random(7)
    owners = [f"user{u}" for u in range(args.users) for _ in range(args.facts)]
    owners += ["big"] * args.big + ["small"] * 20
    rng.shuffle(owners)
    rows = [(f"f{n}", user, "User " + " ".join(words(rng, 6))) for n, user in enumerate(owners)]
    queries = [words(rng, 3) for _ in range(args.queries)]
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteRecordStore(Path(folder) / "s.sqlite3")
        layers = open_layer_store(store)
        start = time.perf_counter()
        with store.transaction() as c:
            c.executemany(INSERT, rows)
        written = time.perf_counter() - start
        print(f"{len(rows)} facts of {args.users + 2} users written in {written:.2f} s")
        for user in ("big", "small"):
            times, found = [], 0
            for terms in queries:
                start = time.perf_counter()
                found += len(layers.keyword_facts(user, terms, 40))
                times.append((time.perf_counter() - start) * 1000)
            print(f"{user}: keyword_facts p50 {p(times, 0.5):.2f} ms, p95 {p(times, 0.95):.2f} ms,"
                  f" {found / len(queries):.1f} hits a query")
        store.close()


if __name__ == "__main__":
    main()
