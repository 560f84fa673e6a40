"""Answer-type matching as a signal of the learned table (issue 20; shipped as
``answer_type``), on the raw pools of bench/fusion_pools.py.

    nice -n 19 python -m bench.fusion_pools          # once (~30 s)
    nice -n 19 python -m bench.fusion_answer         # prints numbers (about a minute)

A *how many* question is answered by a number, a *where* question by a place, a *who* question
by a person, *what is the name of* / *what book* by a name or a title
(``recall.query.answer_kind`` reads the question, ``recall.answers.holds_answer`` the turn).
The core's own ``answer_type`` column is added to the table before it, refitted (listwise, L2
0.01, tuning split; LOCO as in round two); beside it, one column per kind, and the kind held
by the turn after it (the reply); and, tried beside it, the cosine of a turn's exchange as one
key (the length-weighted mean of the static vectors of the turn and the one before it, or the
ones before and after). The last line prints the fitted table as ``LEARNED``. Prints numbers;
writes nothing.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import FEATURES, TUNE  # noqa: E402
from bench.fusion_pools import load  # noqa: E402
from bench.fusion_round2 import INDEX, Slots, fit, line, queries, table  # noqa: E402
from bench.fusion_sessions import fold_loco  # noqa: E402

# the table before this signal (the topic window's)
WINDOW_TABLE = {
    "similarity": 1.0, "keyword_score": 0.979, "date": 2.639, "previous_question": 0.322, "question": -0.403,
    "speaker": 1.816, "time": 0.711, "next_similarity": 0.174, "next_keyword": 0.343, "previous_keyword": 0.992,
    "length": -0.267, "window_terms": 2.430, "window_best": 2.130,
}


def exchange_cosines(p: Any, embedder: Any, vectors: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate: the query's cosine to the length-weighted mean of the vectors of the turn
    and the turn before it, and of the turns before and after it (those in the pool)."""
    from tiered_memory.embedding import embed_query

    qv = embed_query(embedder, p.plan.text)
    at = {c.id: c for c in p.candidates}
    after = {b: i for i, b in p.previous.items() if i in at and b in at}

    def cosine(texts: list[str]) -> float:
        mean = sum(vectors[t] * max(1, len(t)) for t in texts)
        norm = float(np.linalg.norm(mean))
        return float(mean @ qv / norm) if norm else 0.0

    two, three = [], []
    for c in p.candidates:
        before = [at[p.previous[c.id]].text] if p.previous.get(c.id) in at else []
        nxt = [at[after[c.id]].text] if c.id in after else []
        two.append(cosine(before + [c.text]))
        three.append(cosine(before + [c.text] + nxt))
    return np.array(two), np.array(three)


def main(argv: Sequence[str] | None = None) -> int:
    from tiered_memory.embedding import default_embedder
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import KINDS, is_listing_question

    pools, qs = load(), queries(False)
    assert len(pools) == len(qs)
    width = qs[0].x.shape[1]
    answer = INDEX["answer_type"]
    kinds = Counter((p.dataset, p.plan.answer) for p in pools)
    print("questions by the kind of answer asked:",
          ", ".join(f"{k or 'none'} {kinds[('locomo', k)]}" for k in (*KINDS, None)), "(each set)", flush=True)
    embedder = default_embedder()
    texts = sorted({c.text for p in pools for c in p.candidates})
    vectors = dict(zip(texts, embedder.embed_array(texts)))
    for q, p in zip(qs, pools):
        held = q.x[:, answer]
        at = {c.id: k for k, c in enumerate(p.candidates)}
        after = {at[b]: at[i] for i, b in p.previous.items() if i in at and b in at}
        reply = np.array([held[after[k]] if k in after else 0.0 for k in range(len(held))])
        q.x = np.column_stack([q.x[:, :width], *(held * (p.plan.answer == k) for k in KINDS), reply,
                               *exchange_cosines(p, embedder, vectors)])
    listing = {id(q): 2 if is_listing_question(p.plan.text) else 0 for q, p in zip(qs, pools)}
    lst: Callable[[Any], int] = lambda q: listing[id(q)]  # noqa: E731
    tune = [q for q in qs if q.conversation in TUNE]
    before = [INDEX[n] for n in WINDOW_TABLE]

    def row(name: str, cols: list[int]) -> Any:
        folds = {c: fit([q for q in tune if q.conversation != c], cols) for c in TUNE}
        m = fit(tune, cols)
        line(name, qs, Slots(m, lst, 40), f"LOCO {fold_loco(tune, folds, lambda x: Slots(x, lst, 40)):.4f}")
        return m

    print("recall@10 (recall@5, session recall@10); listing spread throughout", flush=True)
    full = qs[0].x.shape[1]
    line("the table before (topic window)", qs, Slots(table(WINDOW_TABLE, full), lst, 40))
    line("table in the core today", qs, Slots(table(dict(LEARNED), full), lst, 40))
    row("the 13 refitted", before)
    shipped = row("+ answer type (shipped)", before + [answer])
    row("+ one column per kind", before + [width + k for k in range(len(KINDS))])
    row("+ answer type, and the reply's", before + [answer, width + len(KINDS)])
    row("+ the exchange's cosine (turn before)", before + [width + len(KINDS) + 1])
    row("+ the exchange's cosine (before and after)", before + [width + len(KINDS) + 2])
    cols = before + [answer]
    print("LEARNED = {" + ", ".join(f'"{FEATURES[i]}": {shipped.weights[i]:.3f}' for i in cols) + "}", flush=True)
    rounded = np.zeros(full)
    rounded[cols] = np.round(shipped.weights[cols], 3)
    line("the same, rounded", qs, Slots(table({FEATURES[i]: rounded[i] for i in cols}, full), lst, 40))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
