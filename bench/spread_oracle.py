"""How far can a per-question spread go? The bound on session recall@10 of the ten turns
of ``search`` (issue 20's last open target, >= 0.93 with turn recall@10 >= 0.80).

The spread (:mod:`tiered_memory.recall.spread`) gives the last ``j`` of the ten places to
the best turn of each session not yet among the hits. The library gives ``j`` = 2 to a
listing question and 0 to any other. Here each dev question's first 40 turns are read
once, with no spread, and every ``j`` from 0 to 10 is applied to them. That yields:

- the fixed choices (``j`` the same for every question) and the shipped rule;
- an **oracle** that knows each question's evidence and picks, question by question, the
  ``j`` that maximises ``session recall + lam x turn recall``, for several ``lam``. No rule
  that decides without the evidence can do better within this family, so where the oracle
  misses both targets together, a smarter choice of ``j`` cannot meet them.

    nice -n 19 python -m bench.spread_oracle                     # LoCoMo, five conversations
    nice -n 19 python -m bench.spread_oracle --dataset realchat  # the real-chat rewrite

About four minutes for each set on a 2-core machine (the static default). Prints numbers;
writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.locomo import DEFAULT_DATA, ingest, make_embedder  # noqa: E402
from bench.locomo_data import Conversation, load_conversations, recall_at, session_of, session_recall_at  # noqa: E402

DEPTH = 40  # the spread picks within the first 4 x 10 hits
SPLITS = {"all": None, "tune": {"conv-26", "conv-30", "conv-41"}}


@dataclass
class Question:
    conversation: str
    listing: bool
    turn: list[float]  # turn recall@10 for j = 0 .. 10
    session: list[float]  # session recall@10 for j = 0 .. 10


def unspread(convs: Sequence[Conversation], embedder: str, depth: int = DEPTH) -> Iterator[tuple[str, Any, list[Any]]]:
    """(conversation id, question, its first ``depth`` hits) for every question of ``convs``,
    each conversation in a memory of its own, searched with no spread."""
    from tiered_memory import MemoryConfig, TieredMemory

    emb = make_embedder(embedder)
    base = MemoryConfig()
    config = replace(base, retrieval=replace(base.retrieval, spread=0.0, listing_spread=0.0))
    with tempfile.TemporaryDirectory() as tmp:
        for c in convs:
            with TieredMemory(Path(tmp) / c.id, embedder=emb, config=config) as m:
                ingest(m, c, user_id="u")
                for q in c.questions:
                    yield c.id, q, m.search(q.question, user_id="u", k=depth)


def measure(dataset: str, embedder: str) -> list[Question]:
    """Each question's recall for every j, from one search of depth 40 without a spread."""
    from tiered_memory.recall.query import plan_query
    from tiered_memory.recall.spread import spread_sessions

    convs = load_conversations(DEFAULT_DATA)
    if dataset == "realchat":
        from bench.realchat import realchat

        convs = realchat(convs)
    out: list[Question] = []
    for conversation, q, hits in unspread(convs, embedder):
        ids = [str(h.metadata.get("dia_id")) for h in hits]
        sessions = [session_of(i) for i in ids]
        picked = [[ids[p] for p in spread_sessions(sessions, 10, j)] for j in range(11)]
        out.append(Question(conversation, plan_query(q.question).listing,
                            [recall_at(p, q.evidence, 10) for p in picked],
                            [session_recall_at(p, q.evidence, 10) for p in picked]))
    return out


def mean_at(qs: Sequence[Question], choice: Sequence[int]) -> tuple[float, float]:
    return (statistics.fmean(q.turn[j] for q, j in zip(qs, choice)),
            statistics.fmean(q.session[j] for q, j in zip(qs, choice)))


def report(qs: list[Question]) -> None:
    splits = {name: [q for q in qs if keep is None or q.conversation in keep] for name, keep in SPLITS.items()}
    splits["held out"] = [q for q in qs if q.conversation not in (SPLITS["tune"] or set())]

    def row(label: str, choose: Callable[[Question], int]) -> None:
        cells = []
        for name, part in splits.items():
            choice = [choose(q) for q in part]
            t, s = mean_at(part, choice)
            cells.append(f"{name} {t:.3f} / {s:.3f}")
        print(f"{label:34s} " + "   ".join(cells))

    def fixed(j: int) -> Callable[[Question], int]:
        return lambda q: j

    def oracle(lam: float) -> Callable[[Question], int]:
        return lambda q: max(range(11), key=lambda j: (q.session[j] + lam * q.turn[j], -j))

    print("turn recall@10 / session recall@10 of the ten turns, by split")
    for j in (0, 1, 2, 3, 5, 10):
        row(f"every question j = {j}", fixed(j))
    row("shipped (listing j = 2, else 0)", lambda q: 2 if q.listing else 0)
    for lam in (100.0, 2.0, 1.0, 0.5):
        row(f"oracle, lam {lam:g}", oracle(lam))
    free = sum(1 for q in qs if max(q.session[j] for j in range(11) if q.turn[j] >= q.turn[0]) > q.session[0])
    print(f"questions where some j adds an evidence session and loses no evidence turn: {free} of {len(qs)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("locomo", "realchat"), default="locomo")
    parser.add_argument("--embedder", default="static", help="static (the default), minilm or static:<folder>")
    args = parser.parse_args(argv)
    report(measure(args.dataset, args.embedder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
