"""Soak run: a mixed workload on one embedded TieredMemory for a bounded time.

Run it from the repository root::

    python -m bench.soak                 # 120 s, 4 worker threads, 40 users
    python -m bench.soak --seconds 30 --workers 2 --users 10
    python -m bench.soak --seconds 300 --read-seconds 180   # then reads only: is growth data or a leak?

Worker threads pick random operations (add_many, search, build_context, get_messages,
end_session, consolidate, add_fact, forget_user) for random users; everything runs
in-process on a temporary folder (no network at all, so loopback-only by construction).
Afterwards it checks the invariants the test suite proves (every acknowledged write of
a user not forgotten is stored and indexed, forgotten users leave no row or vector, no
read ever returned another user's text, SQLite integrity) and prints operations done,
errors, p50/p95 latency per operation and RSS memory growth. It prints numbers and
exits non-zero if an invariant fails; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from tiered_memory import TieredMemory, TieredMemoryError  # noqa: E402

TOPICS = ["moving to Lisbon", "a peanut allergy", "the Friday deadline", "a trip to Nairobi",
          "learning the violin", "the dog Biscuit", "a new job at the hospital", "tea over coffee"]


def rss_mb() -> float:
    """Current resident set size in MB (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def codeword(user: str) -> str:
    return "cw" + user.replace("-", "")


class Soak:
    def __init__(self, memory: TieredMemory, users: int, seed: int) -> None:
        self.m = memory
        self.users = [f"user-{i:03d}" for i in range(users)]
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.acked: dict[str, set[str]] = defaultdict(set)
        self.sessions: dict[str, int] = defaultdict(int)
        self.forgotten: set[str] = set()
        self.busy: set[str] = set()  # users with an operation in flight (forget_user waits for none)
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.leaks: list[str] = []

    # ---- operations ------------------------------------------------------------
    def add_many(self, user: str, rng: random.Random) -> None:
        session = f"s{self.sessions[user]}"
        msgs = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"{codeword(user)} talks about {rng.choice(TOPICS)} (turn {rng.randint(0, 10**9)})"}
                for i in range(rng.randint(1, 6))]
        ids = self.m.add_many(msgs, session_id=session, user_id=user)
        with self.lock:
            self.acked[user].update(ids)
            self.forgotten.discard(user)

    def search(self, user: str, rng: random.Random) -> None:
        other = rng.choice(self.users)
        for h in self.m.search(f"{rng.choice(TOPICS)} {codeword(other)}", user_id=user, k=10):
            self.check_text(user, h.text)

    def build_context(self, user: str, rng: random.Random) -> None:
        ctx = self.m.build_context(rng.choice(TOPICS), user_id=user, session_id=f"s{self.sessions[user]}")
        self.check_text(user, ctx.to_text())

    def get_messages(self, user: str, rng: random.Random) -> None:
        for msg in self.m.get_messages(f"s{self.sessions[user]}", user_id=user):
            self.check_text(user, msg.content)

    def end_session(self, user: str, rng: random.Random) -> None:
        session = f"s{self.sessions[user]}"
        if self.m.get_messages(session, user_id=user):
            self.m.end_session(session, user_id=user)
            with self.lock:
                self.sessions[user] += 1

    def consolidate(self, user: str, rng: random.Random) -> None:
        self.m.consolidate(user)

    def add_fact(self, user: str, rng: random.Random) -> None:
        self.m.add_fact(f"User ({codeword(user)}) mentioned {rng.choice(TOPICS)}", user_id=user)

    def forget_user(self, user: str, rng: random.Random) -> None:
        self.m.forget_user(user)
        with self.lock:
            self.acked.pop(user, None)
            self.forgotten.add(user)

    def check_text(self, user: str, text: str) -> None:
        for other in self.users:
            if other != user and codeword(other) in text:
                self.leaks.append(f"{user} saw {other}'s text")

    # ---- driver ----------------------------------------------------------------
    MIX: list[tuple[str, int]] = [("add_many", 40), ("search", 25), ("build_context", 12), ("get_messages", 8),
                                  ("end_session", 5), ("add_fact", 5), ("consolidate", 3), ("forget_user", 2)]

    READS: list[tuple[str, int]] = [("search", 60), ("build_context", 30), ("get_messages", 10)]

    def worker(self, seed: int, deadline: float, mix: list[tuple[str, int]] | None = None) -> None:
        rng = random.Random(seed)
        names = [n for n, _ in mix or self.MIX]
        weights = [w for _, w in mix or self.MIX]
        while time.monotonic() < deadline:
            op = rng.choices(names, weights)[0]
            with self.lock:
                free = [u for u in self.users if u not in self.busy]
                if not free:
                    continue
                user = rng.choice(free)
                self.busy.add(user)
            fn: Callable[[str, random.Random], None] = getattr(self, op)
            started = time.perf_counter()
            try:
                fn(user, rng)
            except TieredMemoryError as e:
                self.errors[op].append(f"{type(e).__name__}: {e}")
            except Exception as e:  # a non-library exception is a bug: reported, counted
                self.errors[op].append(f"UNTYPED {type(e).__name__}: {e}")
            finally:
                self.latency[op].append(time.perf_counter() - started)
                with self.lock:
                    self.busy.discard(user)

    # ---- invariants ------------------------------------------------------------
    def invariants(self) -> list[str]:
        problems: list[str] = list(self.leaks[:5])
        m = self.m
        stored: dict[str, set[str]] = defaultdict(set)
        for msg in m.store.iter_messages():
            stored[msg.user_id].add(msg.id)
        for user, ids in self.acked.items():
            lost = ids - stored[user]
            if lost:
                problems.append(f"{user}: {len(lost)} acknowledged messages missing")
        pending = m.store.query("SELECT count(*) FROM messages WHERE indexed=0")[0][0]  # type: ignore[attr-defined]
        if pending:
            problems.append(f"{pending} messages not indexed")
        unique = {r[0] for r in m.store.query(  # type: ignore[attr-defined]
            "SELECT id FROM messages WHERE duplicate_of IS NULL")}
        vectors = m.index.ids()
        if unique - vectors:
            problems.append(f"{len(unique - vectors)} stored messages without a vector")
        turn_vectors = {v for v in vectors if ":" not in v}
        all_ids = {r[0] for r in m.store.query("SELECT id FROM messages")}  # type: ignore[attr-defined]
        if turn_vectors - all_ids:
            problems.append(f"{len(turn_vectors - all_ids)} vectors without a record")
        con = m.store.conn  # type: ignore[attr-defined]
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for user in self.forgotten:
            if m.index.ids(user):
                problems.append(f"forgotten {user} still has vectors")
            for t in tables:
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
                if "user_id" in cols and con.execute(f'SELECT count(*) FROM "{t}" WHERE user_id=?', (user,)).fetchone()[0]:
                    problems.append(f"forgotten {user} still has rows in {t}")
        check = m.store.query("PRAGMA integrity_check")[0][0]  # type: ignore[attr-defined]
        if check != "ok":
            problems.append(f"integrity_check: {check}")
        return problems


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_phase(soak: Soak, workers: int, seconds: float, seed: int, mix: list[tuple[str, int]]) -> list[float]:
    """Run ``workers`` threads on ``mix`` for ``seconds``; returns RSS samples (MB) taken along the way."""
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=soak.worker, args=(seed * 1000 + w, deadline, mix)) for w in range(workers)]
    timeline: list[float] = []

    def sample() -> None:  # RSS at regular steps: a plateau is caches, a steady climb a leak
        while time.monotonic() < deadline:
            timeline.append(rss_mb())
            time.sleep(max(1.0, seconds / 8))

    threads.append(threading.Thread(target=sample, daemon=True))
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join()
    return timeline


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--users", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--path", help="folder to use (default: a temporary folder, deleted afterwards)")
    p.add_argument("--read-seconds", type=float, default=0.0,
                   help="then run reads only (search, build_context, get_messages) this long: the store "
                        "no longer grows, so RSS that still climbs is a leak, not data")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="tm-soak-") as tmp:
        folder = Path(args.path or Path(tmp) / "store")
        memory = TieredMemory(folder)
        memory.embedder.embed_query("warm up")  # type: ignore[union-attr]
        memory.add("user", "warm-up", session_id="warm", user_id="warm-up")
        memory.search("warm", user_id="warm-up")
        rss_start = rss_mb()
        soak = Soak(memory, args.users, args.seed)
        started = time.monotonic()
        timeline = run_phase(soak, args.workers, args.seconds, args.seed, Soak.MIX)
        rss_end = rss_mb()
        read_timeline = run_phase(soak, args.workers, args.read_seconds, args.seed + 1, Soak.READS) \
            if args.read_seconds > 0 else []
        rss_read_end = rss_mb()
        elapsed = time.monotonic() - started  # both phases: operations are counted over both
        problems = soak.invariants()
        stats = memory.stats()
        memory.close()
        # reopen: everything acknowledged must survive a close/open cycle too
        with TieredMemory(folder, embedder=memory.embedder) as again:
            stored = {m.id for m in again.store.iter_messages()}
            lost = sum(len(ids - stored) for ids in soak.acked.values())
            if lost:
                problems.append(f"{lost} acknowledged messages missing after reopen")

    ops = sum(len(v) for v in soak.latency.values())
    errors = sum(len(v) for v in soak.errors.values())
    print(f"soak: {elapsed:.0f} s, {args.workers} threads, {args.users} users: {ops} operations "
          f"({ops / elapsed:.1f}/s), {errors} errors")
    print(f"{'operation':<14}{'count':>7}{'errors':>8}{'p50 ms':>9}{'p95 ms':>9}")
    for name, _ in Soak.MIX:
        lat = soak.latency.get(name, [])
        print(f"{name:<14}{len(lat):>7}{len(soak.errors.get(name, [])):>8}"
              f"{pct(lat, 0.5) * 1000:>9.0f}{pct(lat, 0.95) * 1000:>9.0f}")
    for name, errs in soak.errors.items():
        for e in sorted(set(errs))[:3]:
            print(f"  error in {name}: {e[:200]}")
    print(f"final store: {stats.users} users, {stats.sessions} sessions, {stats.messages} messages, "
          f"{stats.vectors} vectors")
    print(f"RSS: {rss_start:.0f} MB after warm-up -> {rss_end:.0f} MB at the end "
          f"({rss_end - rss_start:+.0f} MB); timeline: {' '.join(f'{x:.0f}' for x in timeline)}")
    if read_timeline:
        print(f"RSS in the read-only phase ({args.read_seconds:.0f} s, store no longer growing): "
              f"{rss_end:.0f} -> {rss_read_end:.0f} MB ({rss_read_end - rss_end:+.0f} MB); "
              f"timeline: {' '.join(f'{x:.0f}' for x in read_timeline)}")
    print("invariants: " + ("all hold" if not problems else "FAILED"))
    for problem in problems:
        print("  " + problem)
    print(json.dumps({"seconds": round(elapsed, 1), "operations": ops, "errors": errors,
                      "rss_growth_mb": round(rss_end - rss_start, 1),
                      "rss_growth_read_only_mb": round(rss_read_end - rss_end, 1) if read_timeline else None,
                      "invariants_ok": not problems}))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
