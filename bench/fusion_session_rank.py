"""How a session search should score a session (issue 20): sessions ranked by an aggregate
of their pool turns' shipped scores, on the raw pools of bench/fusion_pools.py.

    nice -n 19 python -m bench.fusion_pools            # once (~30 s)
    nice -n 19 python -m bench.fusion_session_rank     # prints numbers (about a minute)

Every session with a turn in a question's pool is ranked (the whole pool, as
``TieredMemory.search_sessions`` does) by: its best turn (``best``, shipped); a soft maximum
of its turns (``lse T``: T log sum exp(score / T)); its best turn + w x its second best
(``top2 w``); its best turn + w x the query terms its pool turns hold together
(``terms w``, the ``session_terms`` signal). Session recall@10 / @5 of the first ten / five
sessions, by set and split. Prints numbers; writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fusion_fit import TUNE, Linear, Query  # noqa: E402
from bench.fusion_round2 import INDEX, table, queries  # noqa: E402
from bench.locomo_data import session_of, session_recall_at  # noqa: E402

Aggregate = Callable[[np.ndarray, float], float]  # a session's turn scores (best first), its session_terms
AGGREGATES: dict[str, Aggregate] = {"best": lambda v, t: float(v[0])}
for _t in (0.05, 0.1, 0.2, 0.5):
    AGGREGATES[f"lse {_t:g}"] = lambda v, t, T=_t: float(T * np.log(np.exp((v - v[0]) / T).sum()) + v[0])
for _w in (0.2, 0.5):
    AGGREGATES[f"top2 {_w:g}"] = lambda v, t, w=_w: float(v[0] + w * (v[1] if len(v) > 1 else v[0] - 1.0))
for _w in (0.2, 0.5, 1.0):
    AGGREGATES[f"terms {_w:g}"] = lambda v, t, w=_w: float(v[0] + w * t)


def ranked_sessions(q: Query, score: np.ndarray, aggregate: Aggregate) -> list[str]:
    """The pool's sessions best first, each as the dialogue id of its best turn."""
    out: list[tuple[float, str]] = []
    for code in np.unique(q.session):
        rows = np.flatnonzero(q.session == code)
        order = rows[np.argsort(-score[rows], kind="stable")]
        out.append((aggregate(score[order], float(q.x[rows[0], INDEX["session_terms"]])), q.dia[order[0]]))
    return [d for _, d in sorted(out, key=lambda p: -p[0])]


def main(argv: Sequence[str] | None = None) -> int:
    from tiered_memory.recall.fusion import LEARNED

    qs = queries(False)
    shipped: Linear = table(dict(LEARNED))
    scores = {id(q): shipped.score(q) for q in qs}
    assert all(session_of(d) for q in qs for d in q.dia)
    print("session recall@10 / @5 of a session ranking over the pool's sessions")
    for name, aggregate in AGGREGATES.items():
        ranked = {id(q): ranked_sessions(q, scores[id(q)], aggregate) for q in qs}
        cells = []
        for ds in ("locomo", "realchat"):
            for split, keep in (("all", lambda q: True), ("tune", lambda q: q.conversation in TUNE),
                                ("held", lambda q: q.conversation not in TUNE)):
                sel = [q for q in qs if q.dataset == ds and keep(q)]
                r10 = np.mean([session_recall_at(ranked[id(q)], q.evidence, 10) for q in sel])
                r5 = np.mean([session_recall_at(ranked[id(q)], q.evidence, 5) for q in sel])
                cells.append(f"{ds[:2]} {split} {r10:.3f}/{r5:.3f}")
        print(f"{name:10s} | " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
