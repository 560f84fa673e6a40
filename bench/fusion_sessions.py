"""Session-level dense score from the WHOLE session (all its turns, not only the pool's), on the
raw pools of bench/fusion_pools.py, measured against the shipped ranking in the same run.

    nice -n 19 python -m bench.fusion_pools                   # once (~30 s)
    nice -n 19 python -m bench.fusion_sessions [--part a|b|c|all]   # ~1 min a part

Three session scores (per question, per session of the user):
  centroid : cosine of the query to the normalised mean of the static vectors of all the session's turns
  concat   : cosine of the query to the static embedding of the session's turns joined as one text
  top3     : mean of the session's three best turn cosines to the query, over all its turns
(a) the score as one more column (raw cosine, and 1/log2(1+rank) among the user's sessions),
    refitted with the 13 shipped signals (listwise, L2 0.01), LOCO on the tuning split;
(b) only to choose which unseen sessions get the spread's places (the best pool turn of each
    chosen session is placed), listing questions (2 places, depth 40 as shipped) and every
    question with 1 / 2 / 3 places (listing questions at least 2, as RetrievalConfig.spread);
(c) session recall@10 if the ten hits were the best turn of each of the ten sessions ranked by it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import DEFAULT_DATA, TUNE, Linear, Query, ranked_dia  # noqa: E402
from bench.fusion_pools import load  # noqa: E402
from bench.fusion_round2 import INDEX, NAMES, SEL, Slots, fit, line, queries  # noqa: E402
from bench.locomo_data import load_conversations, recall_at, session_of, session_recall_at  # noqa: E402
from bench.realchat import realchat  # noqa: E402

FORMS = ("centroid", "concat", "top3")
CONTEXT = ("top1",)  # context only (max turn cosine over all the session's turns): (b), (c), not (a)
DEPTH = 40
MIX = tuple((f, lam) for f in ("centroid", "top3") for lam in (0.5, 1.0))


def session_tables(embedder) -> dict[tuple[str, str], dict[str, dict]]:
    """(dataset, conversation) -> session_id ("session_{s}", as bench.locomo.ingest names it) ->
    {"vecs": turn vectors, "dia": dia ids, "centroid": unit mean, "concat": unit vector of the text}."""
    base = load_conversations(DEFAULT_DATA)
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for ds, convs in (("locomo", base), ("realchat", realchat(base))):
        for c in convs:
            by: dict[str, list] = {}
            for t in c.turns:
                assert session_of(t.dia_id) == f"D{t.session}", (t.dia_id, t.session)
                by.setdefault(f"session_{t.session}", []).append(t)
            sess = {}
            for sid, turns in by.items():
                vecs = embedder.embed_array([t.text for t in turns])
                m = vecs.mean(0)
                sess[sid] = {"vecs": vecs, "dia": [t.dia_id for t in turns],
                             "centroid": m / np.linalg.norm(m),
                             "concat": embedder.embed_array([" ".join(t.text for t in turns)])[0]}
            out[(ds, c.id)] = sess
    return out


class Info:
    """Per question: the user's sessions, their three scores, the pool's session codes."""

    def __init__(self, q: Query, p, sess: dict[str, dict], qv: np.ndarray) -> None:
        self.sids = sorted(sess, key=lambda s: int(s.split("_")[1]))
        codes: dict[str, int] = {}
        for c in p.candidates:
            codes.setdefault(c.session_id, len(codes))
        assert all(s in sess for s in codes), set(codes) - set(sess)
        self.code_sid = {v: k for k, v in codes.items()}
        self.scores: dict[str, dict[str, float]] = {f: {} for f in FORMS + CONTEXT}
        self.best_dia: dict[str, str] = {}
        for sid in self.sids:
            d = sess[sid]
            cos = d["vecs"] @ qv
            self.scores["centroid"][sid] = float(d["centroid"] @ qv)
            self.scores["concat"][sid] = float(d["concat"] @ qv)
            self.scores["top3"][sid] = float(np.sort(cos)[::-1][:3].mean())
            self.scores["top1"][sid] = float(cos.max())
            self.best_dia[sid] = d["dia"][int(np.argmax(cos))]
        # per pool row, each form's value (raw cosine, and the rank transform among the user's sessions)
        self.cols = []
        for f in FORMS:
            raw = np.array([self.scores[f][self.code_sid[int(s)]] for s in q.session])
            order = sorted(self.sids, key=lambda s: -self.scores[f][s])
            rank = {s: r for r, s in enumerate(order)}
            rk = np.array([1.0 / np.log2(2 + rank[self.code_sid[int(s)]]) for s in q.session])
            self.cols += [raw, rk]


def spread(model: Linear, n: Callable[[Query], int], form: str | tuple[str, float] | None,
           info: dict[int, Info], depth: int = DEPTH) -> Slots:
    """The spread's last ``n`` places to unseen sessions (fusion_round2.Slots), the sessions
    ordered by their best turn (``form`` None, as shipped), by the session score ``form``, or by
    their best turn's score + lam x the session score (``form`` = (score, lam))."""
    if form is None:
        return Slots(model, n, depth)
    f, lam = (form, None) if isinstance(form, str) else form

    def order(q: Query, s: np.ndarray, i: int) -> float:
        inf = info[id(q)]
        value = inf.scores[f][inf.code_sid[int(q.session[i])]]
        return -value if lam is None else -(s[i] + lam * value)
    return Slots(model, n, depth, order=order)


def fold_loco(tune: Sequence[Query], folds: dict[str, Linear], wrap: Callable[[Linear], object]) -> float:
    """LOCO as fusion_round2.loco, each fold's table (fitted without its conversation) wrapped."""
    return float(np.mean([
        sum(recall_at(ranked_dia(q, wrap(folds[c]).score(q)), q.evidence, 10)  # type: ignore[attr-defined]
            for q in tune if q.conversation == c) / sum(1 for q in tune if q.conversation == c) for c in TUNE]))


def cells_dia(qs: Sequence[Query], top: Callable[[Query], list[str]]) -> str:
    """The same cells as fusion_round2.line, from a function giving each question's top-10 dia ids."""
    def m(sel):
        r10 = r5 = s10 = 0.0
        for q in sel:
            t = top(q)
            r10 += recall_at(t, q.evidence, 10)
            r5 += recall_at(t, q.evidence, 5)
            s10 += session_recall_at(t, q.evidence, 10)
        n = len(sel)
        return {"r10": r10 / n, "r5": r5 / n, "s10": s10 / n}

    cells = []
    for ds in ("locomo", "realchat"):
        d = [q for q in qs if q.dataset == ds]
        a, t = m(d), m([q for q in d if q.conversation in TUNE])
        h = m([q for q in d if q.conversation not in TUNE])
        cells.append(f"{ds[:2]} all {a['r10']:.3f} ({a['r5']:.3f}, {a['s10']:.3f}) tune {t['r10']:.3f} "
                     f"({t['s10']:.3f}) held {h['r10']:.3f} ({h['r5']:.3f}, {h['s10']:.3f})")
    return " | ".join(cells)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", choices=("all", "a", "b", "c"))
    args = ap.parse_args(argv)
    from tiered_memory.embedding import default_embedder, embed_query
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question

    embedder = default_embedder()
    print(f"embedder {type(embedder).__name__}", flush=True)
    pools, qs = load(), queries(False)
    assert len(pools) == len(qs)
    tables = session_tables(embedder)
    info: dict[int, Info] = {}
    width = qs[0].x.shape[1]
    assert width == len(NAMES)
    worst = 0.0
    for q, p in zip(qs, pools):
        assert p.dia == q.dia and p.conversation == q.conversation and p.dataset == q.dataset
        qv = embed_query(embedder, p.plan.text)
        sess = tables[(q.dataset, q.conversation)]
        # check: the pool's cosine is this query vector against this turn text's vector
        for c in p.candidates[:5]:
            if c.similarity is not None:
                worst = max(worst, abs(float(embedder.embed_array([c.text])[0] @ qv) - c.similarity))
        inf = info[id(q)] = Info(q, p, sess, qv)
        q.x = np.column_stack([q.x[:, :width]] + inf.cols)
    print(f"max |recomputed cosine - pool cosine| over checked rows: {worst:.2e}")
    col = {f"{f} {k}": width + 2 * j + (k == "rank") for j, f in enumerate(FORMS) for k in ("raw", "rank")}
    listing = {id(q): is_listing_question(p.plan.text) for q, p in zip(qs, pools)}
    tune = [q for q in qs if q.conversation in TUNE]
    w = np.zeros(qs[0].x.shape[1])
    for n_, v in dict(LEARNED).items():
        w[INDEX[n_]] = v
    shipped = Linear(w, 0.0)
    print(f"{len(qs)} questions; recall@10 (recall@5, session recall@10); tuning {len(tune)} questions")
    folds = {c: fit([q for q in tune if q.conversation != c], SEL) for c in TUNE}
    refit_loco = lambda wrap: fold_loco(tune, folds, wrap)  # noqa: E731
    lst = lambda q: 2 if listing[id(q)] else 0  # noqa: E731

    print("== shipped", flush=True)
    line("shipped table, no spread", qs, shipped, f"LOCO {refit_loco(lambda m: m):.4f}")
    line("shipped: table + listing spread", qs, spread(shipped, lst, None, info),
         f"LOCO {refit_loco(lambda m: spread(m, lst, None, info)):.4f}")

    if args.part in ("all", "a"):
        print("== (a) the session score as one more column, refitted (13 + it, listwise, L2 0.01)", flush=True)
        for name, j in col.items():
            cols = SEL + [j]
            m = fit(tune, cols)
            fm = {c: fit([q for q in tune if q.conversation != c], cols) for c in TUNE}
            lo = lambda wrap, fm=fm: fold_loco(tune, fm, wrap)  # noqa: E731
            line(f"13 + {name}", qs, m, f"w {m.weights[j]:+.2f} LOCO {lo(lambda x: x):.4f}")
            line(f"13 + {name}, + listing spread", qs, spread(m, lst, None, info),
                 f"LOCO {lo(lambda x: spread(x, lst, None, info)):.4f}")

    if args.part in ("all", "b"):
        print("== (b) the session score picks the unseen sessions of the spread (shipped table)", flush=True)
        gates: list[tuple[str, Callable[[Query], int]]] = [("listing 2 (shipped gate)", lst)]
        for n in (1, 2, 3):
            gates.append((f"every query {n} (listing >= 2)", lambda q, n=n: max(n, lst(q))))
        for gname, g in gates:
            for form in (None,) + FORMS + CONTEXT + MIX:
                label = "best turn (shipped order)" if form is None else form if isinstance(form, str) \
                    else f"best turn + {form[1]:g} x {form[0]}"
                line(f"{gname}: {label}", qs, spread(shipped, g, form, info),
                     f"LOCO {refit_loco(lambda m, g=g, form=form: spread(m, g, form, info)):.4f}")
        for form in (None,) + FORMS:
            label = "best turn" if form is None else form
            line(f"listing 2, whole pool depth: {label}", qs, spread(shipped, lst, form, info, depth=10 ** 6),
                 f"LOCO {refit_loco(lambda m, form=form: spread(m, lst, form, info, depth=10 ** 6)):.4f}")

    if args.part in ("all", "c"):
        print("== (c) ceiling: ten hits = the best turn of each of the ten sessions ranked by a score", flush=True)
        line("ten sessions by best turn, within 40 (Slots 10)", qs, spread(shipped, lambda q: 10, None, info))
        line("ten sessions by best turn, whole pool", qs, spread(shipped, lambda q: 10, None, info, depth=10 ** 6))
        for form in MIX:
            line(f"ten pool sessions by best turn + {form[1]:g} x {form[0]}", qs,
                 spread(shipped, lambda q: 10, form, info, depth=10 ** 6))
        for form in FORMS + CONTEXT:
            line(f"ten pool sessions by {form}, whole pool", qs, spread(shipped, lambda q: 10, form, info, depth=10 ** 6))

            def top(q: Query, form: str = form) -> list[str]:
                inf = info[id(q)]
                s = shipped.score(q)
                best: dict[str, str] = {}
                for i in np.lexsort((q.ids, -s)):
                    best.setdefault(inf.code_sid[int(q.session[i])], q.dia[i])
                order = sorted(inf.sids, key=lambda sid: -inf.scores[form][sid])[:10]
                return [best.get(sid, inf.best_dia[sid]) for sid in order]
            print(f"{'ten of ALL user sessions by ' + form:54s} | " + cells_dia(qs, top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
