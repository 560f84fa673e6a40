"""Round two of the learned fusion (issue 20): new pool signals, a session-level step and
the regularisation, each fitted on the tuning split and read on the held-out columns.

    nice -n 19 python -m bench.fusion_pools               # once: the raw pools (~30 s)
    nice -n 19 python -m bench.fusion_round2 [--part P]   # prints numbers (a few minutes)

Rows are the core's own ``recall.fusion.signals`` over the raw pools (so the shipped table
gives bench.locomo's figures) plus the tried columns of ``bench/pool_signals.py``. Choices
among variants are made on the tuning split (in-sample, and leave-one-conversation-out
inside it: "LOCO", fit two tuning conversations of both sets, score the third); the
held-out columns only say whether a choice carries. Prints numbers, writes nothing but its
row cache.
"""

from __future__ import annotations

import argparse
import copy
import pickle
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import FEATURES, SELECTED, TUNE, Linear, Query, features, metrics, recall10  # noqa: E402
from bench.fusion_pools import DEFAULT_CACHE, load  # noqa: E402
from bench.pool_signals import EXTRA, extra_columns  # noqa: E402

NAMES = tuple(FEATURES) + EXTRA
INDEX = {n: i for i, n in enumerate(NAMES)}
ROWS = Path(tempfile.gettempdir()) / "fusion_round2_rows_wt20e.pkl"
SEL = [INDEX[n] for n in SELECTED]


def queries(refresh: bool, cache: Path = DEFAULT_CACHE) -> list[Query]:
    """The rows of the raw pools in ``cache``, kept beside them (computed again when the pools
    are newer)."""
    rows_path = ROWS if cache == DEFAULT_CACHE else cache.with_name(cache.stem + "_round2_rows.pkl")
    if rows_path.exists() and rows_path.stat().st_mtime >= cache.stat().st_mtime and not refresh:
        rows: list[Query] = pickle.loads(rows_path.read_bytes())
        if rows and rows[0].x.shape[1] == len(NAMES):
            return rows
    from tiered_memory.config import RetrievalConfig
    from tiered_memory.recall.scoring import base_scores
    from tiered_memory.recall.search import turn_weights

    w = turn_weights(RetrievalConfig())
    out = []
    for p in load(cache):
        x = features(p.candidates, p.previous, p.plan, w, p.places)
        extra = extra_columns(p.candidates, p.seq, p.previous, p.plan, base_scores(p.candidates, p.plan, w),
                              x[:, INDEX["similarity"]])
        out.append(pool_query(p, np.column_stack([x, extra])))
    rows_path.write_bytes(pickle.dumps(out))
    return out


def pool_query(p: Any, x: np.ndarray) -> Query:
    """A raw pool of bench/fusion_pools.py as a :class:`Query` with the columns ``x``."""
    codes: dict[str, int] = {}
    return Query(dataset=p.dataset, conversation=p.conversation, category=p.category, evidence=p.evidence,
                 x=x, dia=p.dia, ids=[c.id for c in p.candidates],
                 session=np.array([codes.setdefault(c.session_id, len(codes)) for c in p.candidates]),
                 label=np.array([1.0 if d in set(p.evidence) else 0.0 for d in p.dia]))


def table(weights: Mapping[str, float], width: int = len(NAMES)) -> Linear:
    """A weight table over the first ``width`` columns (the signals first, as :data:`NAMES`)."""
    w = np.zeros(width)
    for n, v in weights.items():
        w[INDEX[n]] = v
    return Linear(w, 0.0)


def fit(train: Sequence[Query], cols: Sequence[int], l2: float = 1e-2, *, loss: str = "listwise",
        head: int = 0, guide: Linear | None = None,
        weigh: Callable[[Query], float] = lambda q: 1.0) -> Linear:
    """A weight table over ``cols`` (cosine weight 1). ``listwise``: softmax over the pool (or
    over the ``head`` best by ``guide`` plus the evidence) against the evidence rows, each
    question weighted by ``weigh``; ``pair``: logistic loss of every evidence row against the
    ``head`` best other rows by ``guide``."""
    from scipy.optimize import minimize

    cols = list(cols)
    data = []
    for q in train:
        if q.label.sum() == 0:
            continue
        x = q.x[:, cols]
        if loss == "pair":
            assert guide is not None
            s = np.where(q.label > 0, -np.inf, guide.score(q))
            data.append((x[q.label > 0], x[np.argsort(-s)[:head]], weigh(q)))
            continue
        keep = np.ones(len(x), bool)
        if head:
            assert guide is not None
            keep[:] = False
            keep[np.argsort(-guide.score(q))[:head]] = True
            keep |= q.label > 0
        data.append((x[keep], q.label[keep] / q.label.sum(), weigh(q)))
    total_weight = sum(a for *_, a in data)

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = 0.0, np.zeros_like(w)
        for a, b, weight in data:
            if loss == "pair":
                z = -((a @ w)[:, None] - (b @ w)[None, :]) * 10.0
                value += weight * float(np.logaddexp(0, z).mean())
                g = weight * -10.0 / (1 + np.exp(-z)) / z.size
                grad += a.T @ g.sum(1) - b.T @ g.sum(0)
            else:
                s = a @ w * 10.0  # temperature, as bench/fusion_fit.py
                s -= s.max()
                p = np.exp(s)
                p /= p.sum()
                value -= weight * float(b @ np.log(p + 1e-12))
                grad -= weight * 10.0 * (a.T @ (b - p))
        return value / total_weight + l2 * float(w @ w), grad / total_weight + 2 * l2 * w

    w0 = np.zeros(len(cols))
    w0[cols.index(INDEX["similarity"])] = 1.0
    res = minimize(objective, w0, jac=True, method="L-BFGS-B")
    out = np.zeros(train[0].x.shape[1])
    out[cols] = res.x / max(1e-9, res.x[cols.index(INDEX["similarity"])])
    return Linear(out, 0.0)


def loco(tune: Sequence[Query], make: Callable[[Sequence[Query]], object]) -> float:
    """Mean recall@10 of each tuning conversation (both sets) under a model fitted on the other two."""
    return float(np.mean([recall10([q for q in tune if q.conversation == c],
                                   make([q for q in tune if q.conversation != c]).score)  # type: ignore[attr-defined]
                          for c in TUNE]))


def line(name: str, qs: Sequence[Query], model: object, note: str = "",
         keep: Callable[[Query], bool] = lambda q: True) -> None:
    """One printed row: recall@10 (recall@5, session recall@10) of ``model`` (a ``.score``
    object or a score function) over the questions ``keep`` passes, by set and split."""
    score = getattr(model, "score", model)
    cells = []
    for ds in ("locomo", "realchat"):
        d = [q for q in qs if q.dataset == ds and keep(q)]
        a, t = metrics(d, score), metrics([q for q in d if q.conversation in TUNE], score)
        h = metrics([q for q in d if q.conversation not in TUNE], score)
        cells.append(f"{ds[:2]} all {a['r10']:.3f} ({a['r5']:.3f}, {a['s10']:.3f}) tune {t['r10']:.3f} "
                     f"({t['s10']:.3f}) held {h['r10']:.3f} ({h['r5']:.3f}, {h['s10']:.3f})")
    print(f"{name:40s}{note:>14s} | " + " | ".join(cells), flush=True)


class Capped:
    """At most ``cap`` turns of one session in the first ten; the rest move below, in order."""

    def __init__(self, model: Linear, cap: int) -> None:
        self.model, self.cap = model, cap

    def score(self, q: Query) -> np.ndarray:
        s = self.model.score(q)
        seen: dict[int, int] = {}
        out = s.copy()
        for n, i in enumerate(np.lexsort((q.ids, -s))):
            seen[int(q.session[i])] = seen.get(int(q.session[i]), 0) + 1
            if seen[int(q.session[i])] > self.cap:
                out[i] = s.min() - 1.0 - n * 1e-6
        return out


class Slots:
    """The first ``10 - n`` by the table; the last ``n`` go to the best turn of each session
    not yet among them found within ``depth`` ranks and, with ``margin``, scoring at least the
    tenth score less ``margin``. The sessions come in the order of their best turn, or sorted
    by ``order(q, scores, row)`` of their best turn (stable, so ties keep rank order). ``n``
    may be a function of the question."""

    def __init__(self, model: Linear, n: int | Callable[[Query], int], depth: int, margin: float | None = None,
                 order: Callable[[Query, np.ndarray, int], float] | None = None) -> None:
        self.model, self.n, self.depth, self.margin, self.order = model, n, depth, margin, order

    def score(self, q: Query) -> np.ndarray:
        s = self.model.score(q)
        n = self.n(q) if callable(self.n) else self.n
        ranked = [int(i) for i in np.lexsort((q.ids, -s))]
        chosen = ranked[:10 - n]
        seen = {int(q.session[i]) for i in chosen}
        floor = s[ranked[min(9, len(ranked) - 1)]] - self.margin if self.margin is not None else -np.inf
        found: list[int] = []
        for i in ranked[10 - n:self.depth]:
            if self.order is None and len(found) == n:
                break
            if int(q.session[i]) not in seen and s[i] >= floor:
                found.append(i)
                seen.add(int(q.session[i]))
        order = self.order
        if order is not None:
            found.sort(key=lambda i: order(q, s, i))
        chosen += found[:n]
        rest = [i for i in ranked if i not in set(chosen)]
        out = np.empty(len(ranked))
        out[chosen + rest] = -np.arange(len(ranked), dtype=float)
        return out


SESSION_COLS = ("session_terms", "session_best", "session_best_similarity", "session_top3", "session_size",
                "names_session")
SESSION_MAX = ("own_terms", "similarity", "keyword_score", "speaker", "date")


def session_rows(q: Query) -> tuple[np.ndarray, np.ndarray]:
    """One row per session of the pool: its constant columns and the max of a few turn
    columns; label 1 if it holds an evidence turn."""
    n = int(q.session.max()) + 1
    first: dict[int, int] = {}
    for i, s in enumerate(q.session):
        first.setdefault(int(s), i)
    rows = np.zeros((n, len(SESSION_COLS) + len(SESSION_MAX)))
    for s, i in first.items():
        rows[s, :len(SESSION_COLS)] = [q.x[i, INDEX[c]] for c in SESSION_COLS]
    for j, c in enumerate(SESSION_MAX):
        m = np.full(n, -np.inf)
        np.maximum.at(m, q.session, q.x[:, INDEX[c]])
        rows[:, len(SESSION_COLS) + j] = m
    label = np.zeros(n)
    np.maximum.at(label, q.session, q.label)
    return rows, label


def learned_session(tune: Sequence[Query], qs: Sequence[Query], kind: str) -> list[Query]:
    """A session score fitted listwise over each tuning question's sessions, added to every
    row as one more column: ``rank`` 1/log2(1 + the session's rank), ``prob`` its softmax."""
    from scipy.optimize import minimize

    data = [(x, t / t.sum()) for x, t in map(session_rows, tune) if t.sum() > 0]

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = 0.0, np.zeros_like(w)
        for x, t in data:
            s = x @ w * 10.0
            p = np.exp(s - s.max())
            p /= p.sum()
            value -= float(t @ np.log(p + 1e-12))
            grad -= 10.0 * (x.T @ (t - p))
        return value / len(data) + 1e-2 * float(w @ w), grad / len(data) + 2e-2 * w

    w = minimize(objective, np.zeros(len(SESSION_COLS) + len(SESSION_MAX)), jac=True, method="L-BFGS-B").x
    out = []
    for q in qs:
        score = session_rows(q)[0] @ w
        if kind == "rank":
            rank = np.empty(len(score), int)
            rank[np.argsort(-score, kind="stable")] = np.arange(len(score))
            value = 1.0 / np.log2(2 + rank)
        else:
            value = np.exp((score - score.max()) * 10.0)
            value /= value.sum()
        q2 = copy.copy(q)
        q2.x = np.column_stack([q.x, value[q.session]])
        out.append(q2)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fusion_round2", description=__doc__.split("\n")[0])
    p.add_argument("--refresh", action="store_true", help="recompute the rows from the raw pools")
    p.add_argument("--part", default="all", choices=("all", "signals", "l2", "loss", "session"))
    args = p.parse_args(argv)
    qs = queries(args.refresh)
    tune = [q for q in qs if q.conversation in TUNE]
    print(f"{len(qs)} questions, {sum(len(q.dia) for q in qs)} rows; tuning on {len(tune)}; "
          "recall@10 (recall@5, session recall@10)")
    from tiered_memory.recall.fusion import LEARNED

    shipped = table(dict(LEARNED))
    line("shipped table (fusion.LEARNED)", qs, shipped, f"LOCO {loco(tune, lambda t: fit(t, SEL)):.4f}")
    if args.part in ("all", "signals"):
        for name in EXTRA:
            cols = SEL + [INDEX[name]]
            line(f"13 + {name}", qs, fit(tune, cols), f"LOCO {loco(tune, lambda t: fit(t, cols)):.4f}")
        every = SEL + [INDEX[n] for n in EXTRA]
        line("13 + all 13 tried", qs, fit(tune, every), f"LOCO {loco(tune, lambda t: fit(t, every)):.4f}")
    if args.part in ("all", "l2"):
        for l2 in (0.003, 0.03, 0.1, 0.3):
            line(f"13, l2 {l2:g}", qs, fit(tune, SEL, l2), f"LOCO {loco(tune, lambda t: fit(t, SEL, l2)):.4f}")
    if args.part in ("all", "loss"):
        count: dict[tuple[str, str], int] = {}
        for q in tune:
            count[(q.dataset, q.conversation)] = count.get((q.dataset, q.conversation), 0) + 1
        variants: dict[str, Callable[[Sequence[Query]], Linear]] = {
            "softmax over the 30 best + evidence": lambda t: fit(t, SEL, head=30, guide=shipped),
            "softmax over the 60 best + evidence": lambda t: fit(t, SEL, head=60, guide=shipped),
            "pairwise, evidence vs the 30 best": lambda t: fit(t, SEL, loss="pair", head=30, guide=shipped),
            "each conversation weighed equally": lambda t: fit(t, SEL, weigh=lambda q: 1 / count[(q.dataset, q.conversation)]),
            "questions weighed 1 / evidence turns": lambda t: fit(t, SEL, weigh=lambda q: 1 / max(1, len(q.evidence))),
            "questions weighed by evidence turns": lambda t: fit(t, SEL, weigh=lambda q: float(len(q.evidence))),
        }
        for name, make in variants.items():
            line(name, qs, make(tune), f"LOCO {loco(tune, make):.4f}")
        folds = [fit([q for q in tune if q.conversation != c], SEL).weights for c in TUNE]
        line("mean of the three LOCO fold tables", qs, Linear(np.mean(folds, axis=0), 0.0))
    if args.part in ("all", "session"):
        for cap in (3, 4, 5):
            line(f"shipped, at most {cap} turns a session", qs, Capped(shipped, cap))
        for share in (0.1, 0.2, 0.4):
            line(f"shipped + session share {share}", qs, Linear(shipped.weights, share))
        for n in (1, 2, 3):
            for depth in (20, 40):
                line(f"last {n} slot(s) to new sessions, depth {depth}", qs, Slots(shipped, n, depth))
        for margin in (0.05, 0.1, 0.2):
            line(f"last 2 slots to new sessions, margin {margin}", qs, Slots(shipped, 2, 40, margin))
        for kind in ("rank", "prob"):
            rows = learned_session(tune, qs, kind)
            m = fit([q for q in rows if q.conversation in TUNE], SEL + [len(NAMES)])
            line(f"13 + learned session score ({kind})", rows, m, f"weight {m.weights[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
