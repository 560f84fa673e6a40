"""Pseudo-relevance feedback in the vector space (issue 20), on the raw pools of
bench/fusion_pools.py, against the shipped ranking in the same run.

    nice -n 19 python -m bench.fusion_pools      # once (~30 s)
    nice -n 19 python -m bench.fusion_prf        # prints numbers (a few minutes)

The words of the first hits as a second query lost (bench/README, "pseudo-relevance
feedback inside the pool"); this is the vector form, which no round had tried: rank the
pool by the shipped table, take the mean of the static vectors of its ``k`` best turns
(the query's own vector added with weight ``beta``), and score every pool turn by its
cosine to that mixture. The new cosine is (a) added to the shipped score with a fixed
weight, no refit, and (b) one more column refitted with the 13 shipped signals
(listwise, L2 0.01), LOCO on the tuning split. The listing spread is applied throughout,
as shipped. Prints numbers; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import TUNE, Linear, Query  # noqa: E402
from bench.fusion_pools import load  # noqa: E402
from bench.fusion_round2 import NAMES, SEL, Slots, fit, line, queries, table  # noqa: E402
from bench.fusion_sessions import fold_loco  # noqa: E402

VARIANTS = ((3, 0.0), (5, 0.0), (3, 1.0), (5, 1.0), (10, 1.0))


class Added:
    """The base model's score plus ``weight`` x the column ``j``."""

    def __init__(self, model: Linear, j: int, weight: float) -> None:
        self.model, self.j, self.weight = model, j, weight

    def score(self, q: Query) -> np.ndarray:
        return self.model.score(q) + self.weight * q.x[:, self.j]


def compare_columns(qs: Sequence[Query], shipped: Linear, listing: Callable[[Query], int],
                    columns: Mapping[str, int], weights: Sequence[float], sel: Sequence[int] = SEL) -> None:
    """Print the shipped row, then for each new column (name -> index into ``q.x``): the
    shipped score + each of ``weights`` x it (no refit), and the ``sel`` signals + it refitted
    (listwise, L2 0.01) with its LOCO on the tuning split; the listing spread throughout."""
    tune = [q for q in qs if q.conversation in TUNE]
    folds = {c: fit([q for q in tune if q.conversation != c], sel) for c in TUNE}
    print("recall@10 (recall@5, session recall@10); listing spread throughout", flush=True)
    line("shipped: table + listing spread", qs, Slots(shipped, listing, 40),
         f"LOCO {fold_loco(tune, folds, lambda m: Slots(m, listing, 40)):.4f}")
    for name, col in columns.items():
        for weight in weights:
            line(f"+ {weight:g} x {name}", qs, Slots(Added(shipped, col, weight), listing, 40))
        cols = [*sel, col]
        m = fit(tune, cols)
        fm = {c: fit([q for q in tune if q.conversation != c], cols) for c in TUNE}
        line(f"13 + {name}", qs, Slots(m, listing, 40),
             f"w {m.weights[col]:+.2f} LOCO {fold_loco(tune, fm, lambda x: Slots(x, listing, 40)):.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=float, nargs="*", default=[0.1, 0.2, 0.3, 0.5])
    args = ap.parse_args(argv)
    from tiered_memory.embedding import default_embedder, embed_query
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question

    embedder = default_embedder()
    pools, qs = load(), queries(False)
    assert len(pools) == len(qs)
    width = len(NAMES)
    shipped = table(LEARNED)
    texts = sorted({c.text for p in pools for c in p.candidates})
    vec = dict(zip(texts, embedder.embed_array(texts)))
    print(f"{len(qs)} questions, {len(texts)} distinct turn texts", flush=True)
    for q, p in zip(qs, pools):
        assert p.dia == q.dia
        qv = embed_query(embedder, p.plan.text)
        m = np.stack([vec[c.text] for c in p.candidates])
        order = np.lexsort((q.ids, -shipped.score(q)))
        cols = []
        for k, beta in VARIANTS:
            c = m[order[:k]].mean(0) + beta * qv
            c /= max(1e-9, float(np.linalg.norm(c)))
            cols.append(m @ c)
        q.x = np.column_stack([q.x[:, :width]] + cols)
    shipped = table(LEARNED, width + len(VARIANTS))
    listing = {id(q): is_listing_question(p.plan.text) for q, p in zip(qs, pools)}
    lst = lambda q: 2 if listing[id(q)] else 0  # noqa: E731
    compare_columns(qs, shipped, lst, {f"prf k{k} beta{beta:g}": width + j for j, (k, beta) in enumerate(VARIANTS)},
                    args.weights)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
