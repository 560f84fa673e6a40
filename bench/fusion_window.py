"""A topic's turns near each other, not its session (issue 20, shipped as the learned table's
topic window), on the raw pools of bench/fusion_pools.py.

    nice -n 19 python -m bench.fusion_pools          # once (~30 s)
    nice -n 19 python -m bench.fusion_window         # prints numbers (a few minutes)

Two of the shipped table's heaviest signals read a turn's whole session: ``session_terms``
(the query terms its session's candidates hold together) and ``session_best`` (its session's
best base score). LoCoMo's sessions each keep to a few topics; a day of real chat may not, so
a session-level key may carry less there. The windowed forms read only the candidates of the
same session within ``w`` positions of the turn: ``window_terms`` and ``window_best``. Each
pair replaces the session pair in the 13 signals of the table before, refitted (listwise,
L2 0.01, tuning split; LOCO), and is also added beside them (``window_columns`` is the
experiment's own form; ``--fit`` refits from the core's ``recall.fusion.topic_windows`` and
gives the same rows). ``--days`` runs both tables on sessions merged two by two. Prints
numbers; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import FEATURES, SELECTED, TUNE, features  # noqa: E402
from bench.fusion_pools import RawPool, load  # noqa: E402
from bench.fusion_round2 import INDEX, SEL, Slots, fit, line, pool_query, queries, table  # noqa: E402
from bench.fusion_sessions import fold_loco  # noqa: E402

WINDOWS = (2, 4, 8, 16)
# the learned table before the topic window (session_terms and session_best read the whole session)
SESSION_TABLE = {
    "similarity": 1.0, "keyword_score": 1.041, "date": 2.185, "previous_question": 0.281, "question": -0.308,
    "speaker": 1.497, "time": 0.608, "session_terms": 1.509, "session_best": 1.721,
    "next_similarity": 0.329, "next_keyword": 0.400, "previous_keyword": 1.054, "length": -0.274,
}


def by_seq(p: RawPool) -> dict[str, int]:
    """Each candidate placed by its ``seq``: the dev sessions were written one after another."""
    return {c.id: s for c, s in zip(p.candidates, p.seq)}


def window_columns(p: Any, base: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    from tiered_memory.recall.coverage import coverage, stems, term_weights

    cands = p.candidates
    weights = term_weights(p.plan.terms, [c.text for c in cands])
    bags = [stems(c.text) for c in cands]
    by_session: dict[str, list[int]] = {}
    for i, c in enumerate(cands):
        by_session.setdefault(c.session_id, []).append(i)
    terms, best = np.zeros(len(cands)), np.zeros(len(cands))
    peak = float(base.max()) if len(base) else 0.0
    for members in by_session.values():
        for i in members:
            near = [j for j in members if abs(p.seq[j] - p.seq[i]) <= w]
            if weights:
                terms[i] = coverage(frozenset().union(*(bags[j] for j in near)), weights)
            best[i] = max(base[j] for j in near) / peak if peak > 0 else 0.0
    return terms, best


def fit_core() -> int:
    """The table over the core's :data:`recall.fusion.SIGNALS` with ``window_terms`` and
    ``window_best`` in place of ``session_terms`` and ``session_best`` (:func:`by_seq`),
    fitted on the tuning split as the shipped one was; prints it as ``LEARNED``, then its rows
    beside the table in the core today."""
    from tiered_memory.config import RetrievalConfig
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question
    from tiered_memory.recall.search import turn_weights

    from bench.fusion_fit import Linear

    w = turn_weights(RetrievalConfig())
    pools = load()
    qs = [pool_query(p, features(p.candidates, p.previous, p.plan, w, by_seq(p))) for p in pools]
    listing = {id(q): 2 if is_listing_question(p.plan.text) else 0 for q, p in zip(qs, pools)}
    lst: Callable[[Any], int] = lambda q: listing[id(q)]  # noqa: E731
    chosen = [n for n in SELECTED if n not in ("session_terms", "session_best")] + ["window_terms", "window_best"]
    cols = [INDEX[n] for n in chosen]
    tune = [q for q in qs if q.conversation in TUNE]
    m = fit(tune, cols)
    folds = {c: fit([q for q in tune if q.conversation != c], cols) for c in TUNE}
    print("LEARNED = {" + ", ".join(f'"{FEATURES[i]}": {m.weights[i]:.3f}' for i in cols) + "}", flush=True)
    for name, weights in (("the table before (whole sessions)", SESSION_TABLE), ("table in the core today", LEARNED)):
        line(name, qs, Slots(table(weights, len(FEATURES)), lst, 40))
    rounded = np.zeros(len(FEATURES))
    rounded[cols] = np.round(m.weights[cols], 3)
    line("window table (rounded)", qs, Slots(Linear(rounded, 0.0), lst, 40),
         f"LOCO {fold_loco(tune, folds, lambda x: Slots(x, lst, 40)):.4f}")
    return 0


def two_topic_days() -> int:
    """The table before (whole sessions) and the shipped one (topic window), unchanged, on the
    pools as they are and with sessions 1+2, 3+4, ... merged into one (a day of real chat holds
    several topics; the dev sessions were written one after another, so ``seq`` places a turn
    in the merged session too). Turn recall only: the merged sessions are not the evidence's."""
    import re
    from dataclasses import replace

    from tiered_memory.config import RetrievalConfig
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question
    from tiered_memory.recall.search import turn_weights

    def day(session_id: str) -> str:
        m = re.fullmatch(r"session_(\d+)", session_id)
        return f"day_{(int(m[1]) + 1) // 2}" if m else session_id

    w = turn_weights(RetrievalConfig())
    pools = load()
    tables = {"whole sessions": table(SESSION_TABLE, len(FEATURES)), "topic window": table(LEARNED, len(FEATURES))}
    print("recall@10 (recall@5, -); listing spread throughout; tables as fitted, not refitted", flush=True)
    for merged in (False, True):
        qs, listing = [], {}
        for p in pools:
            placed = [replace(c, session_id=day(c.session_id) if merged else c.session_id) for c in p.candidates]
            q = pool_query(p, features(placed, p.previous, p.plan, w, by_seq(p)))
            if merged:
                q.session = np.array([int(day(c.session_id)[4:]) for c in p.candidates])
            listing[id(q)] = 2 if is_listing_question(p.plan.text) else 0
            qs.append(q)
        for name, model in tables.items():
            line(f"{'two sessions a day' if merged else 'sessions as they are'}: {name}", qs,
                 Slots(model, lambda q: listing[id(q)], 40))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, nargs="*", default=list(WINDOWS))
    ap.add_argument("--mixed", action="store_true", help="also every (terms window, best window) pair, in place")
    ap.add_argument("--fit", action="store_true",
                    help="fit the shipped table: the core's own window signals in place of the session pair")
    ap.add_argument("--days", action="store_true",
                    help="both tables on the pools with each two sessions merged into one (a day of two topics)")
    args = ap.parse_args(argv)
    if args.fit:
        return fit_core()
    if args.days:
        return two_topic_days()
    windows = tuple(args.windows)
    from tiered_memory.config import RetrievalConfig
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question
    from tiered_memory.recall.scoring import base_scores
    from tiered_memory.recall.search import turn_weights

    wts = turn_weights(RetrievalConfig())
    pools, qs = load(), queries(False)
    assert len(pools) == len(qs)
    width = qs[0].x.shape[1]
    for q, p in zip(qs, pools):
        assert p.dia == q.dia
        b = base_scores(p.candidates, p.plan, wts)
        base = np.array([b[c.id] for c in p.candidates])
        cols = []
        for w in windows:
            cols.extend(window_columns(p, base, w))
        q.x = np.column_stack([q.x[:, :width], *cols])
    listing = {id(q): 2 if is_listing_question(p.plan.text) else 0 for q, p in zip(qs, pools)}
    lst: Callable[[Any], int] = lambda q: listing[id(q)]  # noqa: E731
    tune = [q for q in qs if q.conversation in TUNE]

    def row(name: str, cols: list[int]) -> None:
        folds = {c: fit([q for q in tune if q.conversation != c], cols) for c in TUNE}
        m = fit(tune, cols)
        line(name, qs, Slots(m, lst, 40), f"LOCO {fold_loco(tune, folds, lambda x: Slots(x, lst, 40)):.4f}")

    print("recall@10 (recall@5, session recall@10); listing spread throughout", flush=True)
    line("the table before (whole sessions)", qs, Slots(table(SESSION_TABLE, qs[0].x.shape[1]), lst, 40))
    line("shipped table (topic window)", qs, Slots(table(LEARNED, qs[0].x.shape[1]), lst, 40))
    row("13 refitted", list(SEL))
    session = {INDEX["session_terms"], INDEX["session_best"]}
    rest = [c for c in SEL if c not in session]
    for j, w in enumerate(windows):
        t, b = width + 2 * j, width + 2 * j + 1
        row(f"window {w} in place of the session", rest + [t, b])
        if not args.mixed:
            row(f"window {w} beside the session", list(SEL) + [t, b])
    if args.mixed:
        for j, wt in enumerate(windows):
            for k, wb in enumerate(windows):
                if j != k:
                    row(f"terms window {wt}, best window {wb}", rest + [width + 2 * j, width + 2 * k + 1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
