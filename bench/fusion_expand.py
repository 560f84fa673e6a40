"""The query's words widened by their neighbours in the static table (issue 20, tried), on
the raw pools of bench/fusion_pools.py, against the shipped ranking in the same run.

    nice -n 19 python -m bench.fusion_pools        # once (~30 s)
    nice -n 19 python -m bench.fusion_expand       # prints numbers (a few minutes)

A listing question names a kind ("What instruments does Melanie play?") and its evidence
names the things ("violin", "clarinet"): keyword search misses them and a mean vector
dilutes them. Each content word of the query that is a whole token of the static table's
vocabulary is widened by its ``m`` nearest whole-word tokens (cosine of their rows at least
``floor``, stopwords and the query's own words left out), and every pool turn gets the
idf-weighted, cosine-weighted share of those neighbours among its stemmed words
(``expanded_terms``), as one more column refitted with the 13 shipped signals (listwise, L2
0.01; LOCO on the tuning split), and added to the shipped score with a fixed weight.
Prints numbers; writes nothing.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_pools import load  # noqa: E402
from bench.fusion_prf import compare_columns  # noqa: E402
from bench.fusion_round2 import NAMES, queries, table  # noqa: E402

VARIANTS = ((5, 0.5), (10, 0.5), (10, 0.4))


def main(argv: Sequence[str] | None = None) -> int:
    from tiered_memory.embedding import default_embedder
    from tiered_memory.recall.coverage import stem, stems
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import STOPWORDS, is_listing_question

    static = default_embedder().table  # type: ignore[attr-defined]
    vocab: dict[str, int] = static.tokenizer.get_vocab()
    words = sorted((t, i) for t, i in vocab.items() if t.isalpha() and t.isascii() and len(t) > 2
                   and t not in STOPWORDS)
    ids = np.array([i for _, i in words])
    unit = static.rows[ids] / np.maximum(1e-9, np.linalg.norm(static.rows[ids], axis=1, keepdims=True))
    row_of = {t: n for n, (t, _) in enumerate(words)}
    pools, qs = load(), queries(False)
    width = len(NAMES)
    cache: dict[tuple[str, int, float], list[tuple[str, float]]] = {}

    def neighbours(term: str, m: int, floor: float) -> list[tuple[str, float]]:
        key = (term, m, floor)
        if key not in cache:
            n = row_of.get(term.lower())
            got: list[tuple[str, float]] = []
            if n is not None:
                sims = unit @ unit[n]
                for j in np.argsort(-sims)[1:m + 1]:
                    if sims[j] >= floor:
                        got.append((stem(words[j][0]), float(sims[j])))
            cache[key] = got
        return cache[key]

    shown = 0
    for q, p in zip(qs, pools):
        own = [stems(c.text) for c in p.candidates]
        query_stems = {stem(t) for t in p.plan.terms}
        cols = []
        for m, floor in VARIANTS:
            wanted: dict[str, float] = {}
            for t in p.plan.terms:
                for s, sim in neighbours(t, m, floor):
                    if s not in query_stems:
                        wanted[s] = max(wanted.get(s, 0.0), sim)
            df = {s: sum(1 for o in own if s in o) for s in wanted}
            weight = {s: sim * math.log(1.0 + len(own) / (1.0 + df[s])) for s, sim in wanted.items()}
            total = sum(weight.values()) or 1.0
            cols.append(np.array([sum(w for s, w in weight.items() if s in o) / total for o in own]))
            if shown < 4 and m == 10 and floor == 0.5 and wanted:
                print(f"  {p.plan.text!r}: {sorted(wanted, key=lambda s: -wanted[s])[:12]}")
                shown += 1
        q.x = np.column_stack([q.x[:, :width]] + cols)
    shipped = table(LEARNED, width + len(VARIANTS))
    listing = {id(q): 2 if is_listing_question(p.plan.text) else 0 for q, p in zip(qs, pools)}
    lst = lambda q: listing[id(q)]  # noqa: E731
    compare_columns(qs, shipped, lst, {f"expanded m{m} floor{floor:g}": width + j
                                       for j, (m, floor) in enumerate(VARIANTS)}, (0.2, 0.5))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
