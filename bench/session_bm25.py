"""Does a session's whole text, scored by BM25, rank sessions better than their best turn?

Session recall@10 of the ten turns of ``search`` (issue 20: >= 0.93) needs the right sessions
among the first few a ranking names: ten turns hold about as many evidence sessions as the
five best sessions do. Here each dev question's first 40 turns (no spread) give the sessions
in the order of their best turn (what the library uses); BM25 over each session's whole text
(the library's light stems, no stopwords; k1 1.2, b 0.75) gives a second order; and the two
are mixed, by score (best turn + w x BM25 / the question's best BM25) and by reciprocal rank.
Prints session recall at 1, 2, 3, 5 and 10 sessions on all five conversations, the tuning
three and the held-out two.

    nice -n 19 python -m bench.session_bm25                     # LoCoMo
    nice -n 19 python -m bench.session_bm25 --dataset realchat  # the real-chat rewrite

About a minute for each set on a 2-core machine (the static default). Writes nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.locomo import DEFAULT_DATA  # noqa: E402
from bench.locomo_data import Conversation, load_conversations, session_of  # noqa: E402
from bench.spread_oracle import DEPTH, SPLITS, unspread  # noqa: E402
from tiered_memory.recall.coverage import stems  # noqa: E402

TUNE = SPLITS["tune"] or set()
AT = (1, 2, 3, 5, 10)


@dataclass
class Asked:
    conversation: str
    question: str
    sessions: set[str]  # the evidence's sessions
    ranked: list[tuple[str, float]]  # (session, score) of the first DEPTH turns, best first


def asked(convs: Sequence[Conversation], embedder: str) -> list[Asked]:
    return [Asked(conversation, q.question, {session_of(e) for e in q.evidence},
                  [(session_of(str(h.metadata.get("dia_id"))), h.score) for h in hits])
            for conversation, q, hits in unspread(convs, embedder, DEPTH)]


class SessionBM25:
    """BM25 over one conversation's sessions: a session is its turns' stemmed content words
    (the library's :func:`~tiered_memory.recall.coverage.stems`), so a term's frequency in a
    session is the number of its turns that hold it."""

    def __init__(self, conv: Conversation, k1: float = 1.2, b: float = 0.75) -> None:
        self.docs: dict[str, Counter[str]] = {}
        for t in conv.turns:
            self.docs.setdefault(session_of(t.dia_id), Counter()).update(stems(t.text))
        self.length = {s: sum(d.values()) for s, d in self.docs.items()}
        self.df: Counter[str] = Counter()
        for d in self.docs.values():
            self.df.update(d.keys())
        self.avg = statistics.fmean(self.length.values())
        self.k1, self.b = k1, b

    def scores(self, query: str) -> dict[str, float]:
        n, out = len(self.docs), {}
        terms = stems(query)
        for s, d in self.docs.items():
            norm = self.k1 * (1 - self.b + self.b * self.length[s] / self.avg)
            out[s] = sum(math.log(1 + (n - self.df[t] + 0.5) / (self.df[t] + 0.5)) * d[t] * (self.k1 + 1)
                         / (d[t] + norm) for t in terms if d[t])
        return out


def best_turn(a: Asked) -> list[str]:
    return list(dict.fromkeys(s for s, _ in a.ranked))


def mixed(a: Asked, bm25: dict[str, float], w: float, rrf: bool) -> list[str]:
    order = best_turn(a)
    if rrf:  # reciprocal ranks, 60 as usual; a session outside the 40 turns ranks 100th
        by_bm25 = {s: r for r, s in enumerate(sorted(bm25, key=lambda s: -bm25[s]))}
        mine = {s: r for r, s in enumerate(order)}
        value = {s: 1 / (60 + mine.get(s, 100)) + w / (60 + by_bm25[s]) for s in bm25}
    else:
        best: dict[str, float] = {}
        for s, score in a.ranked:
            best.setdefault(s, score)
        floor = min(best.values(), default=0.0) - 0.1
        top = max(bm25.values()) or 1.0
        value = {s: best.get(s, floor) + w * bm25[s] / top for s in bm25}
    return sorted(bm25, key=lambda s: -value[s])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("locomo", "realchat"), default="locomo")
    parser.add_argument("--embedder", default="static", help="static (the default), minilm or static:<folder>")
    args = parser.parse_args(argv)
    convs = load_conversations(DEFAULT_DATA)
    if args.dataset == "realchat":
        from bench.realchat import realchat

        convs = realchat(convs)
    questions = asked(convs, args.embedder)
    index = {c.id: SessionBM25(c) for c in convs}
    bm25 = [index[a.conversation].scores(a.question) for a in questions]
    rankings: dict[str, list[list[str]]] = {
        "best turn (shipped)": [best_turn(a) for a in questions],
        "BM25 of the session alone": [sorted(b, key=lambda s: -b[s]) for b in bm25],
    }
    for w in (0.05, 0.1, 0.2, 0.4):
        rankings[f"best turn + {w:g} x BM25 / best"] = [mixed(a, b, w, False) for a, b in zip(questions, bm25)]
    for w in (0.3, 0.6, 1.0):
        rankings[f"reciprocal ranks, BM25 x {w:g}"] = [mixed(a, b, w, True) for a, b in zip(questions, bm25)]
    splits = {"all": lambda c: True, "tune": lambda c: c in TUNE, "held out": lambda c: c not in TUNE}
    print(f"session recall at {' / '.join(map(str, AT))} sessions ({args.dataset}, {len(questions)} questions)")
    for name, orders in rankings.items():
        cells = []
        for split, keep in splits.items():
            part = [(a, o) for a, o in zip(questions, orders) if keep(a.conversation)]
            cells.append(f"{split} " + " ".join(
                f"{statistics.fmean(len(a.sessions & set(o[:k])) / len(a.sessions) for a, o in part):.3f}" for k in AT))
        print(f"{name:34s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
