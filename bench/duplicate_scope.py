"""What a scoped search pays for the duplicates it reads: a user with many repeated turns.

A scoped search (``search(session_id=...)``, ``search(filters=...)``) and ``search_sessions``
ask the store for the duplicates in scope (turns stored without a vector of their own,
pointing at an earlier turn with the same text), so that a duplicate in scope is found by its
original's vector (:func:`tiered_memory.recall.search.stand_ins`). One user holds ``--turns``
turns (20 a session), ``--duplicates`` of them repeats of ``--phrases`` short texts ("thanks",
"ok", ...; each phrase's first turn is the original, the rest its duplicates), a quarter of
the turns with the metadata a filtered search asks for. In the same run, on the same store,
each kind of search is timed with the duplicates read as the library reads them, without the
read (the store then not offered as a :class:`~tiered_memory.store.base.DuplicateScope`), and,
for a filtered search, with every duplicate in scope read (the store asked without the
filter: the read before a filtered search passed its filter to the store); p50/p95 and the
ratios to the search without the read. The store's duplicates query alone is timed too. The hash embedder of :mod:`bench.scale` keeps
the model out of the figure.

    nice -n 10 python -m bench.duplicate_scope --turns 100000 --duplicates 20000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from .locomo_data import load_conversations, percentile
from .scale import MemoEmbedder, corpus, timed
from .spine import DATA

PHRASES = ["thanks", "ok", "sounds good", "haha", "yes", "no worries", "cool", "great, thank you", "sure",
           "got it", "lol", "nice", "see you", "good night", "okay thanks", "will do", "perfect", "awesome",
           "wow", "right"]


def turns_of(distinct: Sequence[str], n: int, duplicates: int, phrases: int, seed: int) -> list[str]:
    """``n`` turns, ``duplicates`` of them repeats of ``phrases`` texts at random places (each
    phrase also once more, as its original), the rest distinct."""
    rng = np.random.default_rng(seed)
    texts = [PHRASES[p] if p < len(PHRASES) else f"{PHRASES[p % len(PHRASES)]} #{p}" for p in range(phrases)]
    repeated = [texts[i % phrases] for i in range(phrases + duplicates)]
    places = set(rng.choice(n, len(repeated), replace=False).tolist())
    others = iter(distinct)
    rep = iter(repeated[i] for i in rng.permutation(len(repeated)))
    return [next(rep) if i in places else next(others) for i in range(n)]


def fill(memory: Any, user: str, texts: Sequence[str]) -> None:
    """``texts`` through ``add_many``, 20 turns a session; every fourth session's turns carry
    ``{"kind": "note"}`` (the filtered search's scope)."""
    for s in range(0, len(texts), 20):
        meta = {"kind": "note"} if (s // 20) % 4 == 0 else {"kind": "chat"}
        memory.add_many([{"role": "user" if j % 2 else "assistant", "content": t, "timestamp": 1.6e9 + (s + j) * 60,
                          "metadata": meta} for j, t in enumerate(texts[s:s + 20])], session_id=f"s{s // 20}",
                        user_id=user)


@runtime_checkable
class _Nothing(Protocol):
    def no_store_has_this(self) -> None: ...


@contextmanager
def without_duplicates_read() -> Iterator[None]:
    """The search as it was before it read duplicates: no store counts as a DuplicateScope."""
    from tiered_memory.recall import search

    kept = search.DuplicateScope
    search.DuplicateScope = _Nothing  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        search.DuplicateScope = kept  # type: ignore[misc]


@contextmanager
def every_duplicate_read(store: Any) -> Iterator[None]:
    """The store asked for every duplicate in scope, whatever the search's filters."""
    real = store.duplicates

    def every(user_id: str, session_id: str | None = None, *, originals: Sequence[str] | None = None,
              filters: Any = None) -> Any:
        return real(user_id, session_id, originals=originals)

    store.duplicates = every
    try:
        yield
    finally:
        del store.duplicates


def ms(values: Sequence[float]) -> str:
    return f"{percentile(values, 50) * 1000:7.2f} / {percentile(values, 95) * 1000:7.2f} ms"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=100_000)
    p.add_argument("--duplicates", type=int, default=20_000)
    p.add_argument("--phrases", type=int, default=20, help="distinct repeated texts (their first turns: originals)")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2, help="the read, every duplicate read and no read, in turn")
    p.add_argument("--record-store", default=None, help="a PostgreSQL URL (default: SQLite in the folder)")
    p.add_argument("--data", default=str(DATA))
    args = p.parse_args(argv)
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    from tiered_memory import TieredMemory
    from tiered_memory.store.base import DuplicateScope

    convs = load_conversations(args.data)
    turns = [t.text for c in convs for t in c.turns]
    questions = [q.question for c in convs for q in c.questions][: args.queries]
    emb = MemoEmbedder()
    root = Path(tempfile.mkdtemp(prefix="tm-dupscope-"))
    try:
        extra = {"record_store": args.record_store} if args.record_store else {}
        with TieredMemory(root / "m", embedder=emb, **extra) as memory:
            texts = turns_of(corpus(turns, args.turns, seed=0), args.turns, args.duplicates, args.phrases, seed=5)
            t = time.perf_counter()
            fill(memory, "me", texts)
            memory.flush()
            print(f"bench.duplicate_scope: {args.turns:,} turns of one user, {memory.stats().duplicates:,} duplicates "
                  f"of {args.phrases} phrases ({time.perf_counter() - t:.0f} s to load); {len(questions)} questions; "
                  f"{type(memory.store).__name__}, {type(memory.index).__name__}; load {os.getloadavg()[0]:.1f} on "
                  f"{os.cpu_count()} cores", flush=True)
            held = getattr(memory.index, "scans_exactly", None)
            if held is not None:
                held("me", wait=True)
            store = memory.store
            assert isinstance(store, DuplicateScope)
            sessions = [f"s{(i * 37) % (args.turns // 20)}" for i in range(len(questions))]
            kinds: dict[str, Callable[[int], Any]] = {
                "search (unscoped)": lambda i: memory.search(questions[i], user_id="me", k=10),
                "search(session_id)": lambda i: memory.search(questions[i], user_id="me", k=10,
                                                              session_id=sessions[i]),
                "search(filters)": lambda i: memory.search(questions[i], user_id="me", k=10,
                                                           filters={"kind": "note"}),
                "search(session, filters)": lambda i: memory.search(questions[i], user_id="me", k=10,
                                                                    session_id=sessions[i], filters={"role": "user"}),
                "search_sessions": lambda i: memory.search_sessions(questions[i], user_id="me", k=5),
                "search_sessions(filters)": lambda i: memory.search_sessions(questions[i], user_id="me", k=5,
                                                                             filters={"kind": "note"}),
            }
            reads = {"duplicates(user)": lambda i: store.duplicates("me"),
                     "duplicates(user, session)": lambda i: store.duplicates("me", sessions[i]),
                     "duplicates(user, filters)": lambda i: store.duplicates("me", filters={"kind": "note"})}
            items = range(len(questions))
            for fn in kinds.values():  # warm
                fn(0)
            modes: dict[str, Callable[[], Any]] = {"read": nullcontext, "every": lambda: every_duplicate_read(store),
                                                   "none": without_duplicates_read}
            got: dict[str, dict[str, list[float]]] = {name: {m: [] for m in modes} for name in kinds}
            for r in range(args.rounds):  # the modes in turn, query by query, which first rotating
                for name, fn in kinds.items():
                    ran = [m for m in modes if m != "every" or "filters" in name]
                    for i in items:
                        for m in ran[(i + r) % len(ran):] + ran[:(i + r) % len(ran)]:
                            with modes[m]():
                                got[name][m] += timed(fn, [i])
            print(f"  {'':26} {'as read p50 / p95':>22} {'every dup. read':>22} {'without the read':>22}"
                  f"  p50 ratio (every)  p95 ratio (every)")
            for name, by in got.items():
                w, e, wo = by["read"], by["every"], by["none"]

                def ratio(q: float) -> str:
                    every = f"({percentile(e, q) / percentile(wo, q):.2f}x)" if e else ""
                    return f"{percentile(w, q) / percentile(wo, q):7.2f}x {every:>9}"
                print(f"  {name:26} {ms(w):>22} {ms(e) if e else '-':>22} {ms(wo):>22}  {ratio(50)}  {ratio(95)}",
                      flush=True)
            for name, fn in reads.items():
                print(f"  store.{name:20} {ms(timed(fn, items)):>26} ({len(fn(0)):,} rows)", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
