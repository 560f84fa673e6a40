"""Learning to rank over the signals turn recall already computes (issue 20, a one-off).

Run it from the repository root (nice it: the machine is shared)::

    nice -n 19 python -m bench.fusion_fit                 # dump (cached), fit, report
    nice -n 19 python -m bench.fusion_fit --refresh       # ingest again

Each dev conversation is ingested once through ``add_many`` (``bench.locomo.ingest``), in
LoCoMo form and in the real-chat rewrite (``bench/realchat.py``). For every question the
candidate pool of a real search (``recall.search.gather_pool``) is turned into one feature
row per candidate (:func:`features`: the parts ``score_turns`` adds and a few cheap extras)
with a label (is it an evidence turn). Models are fitted on the tuning split only (the first
three conversations of both sets) and every model is scored on all splits, with today's score
reproduced from the same rows as the baseline of the same run. Prints numbers; writes nothing
but the cache (``--cache``).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.locomo_data import CATEGORIES, load_conversations, recall_at, session_recall_at  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo_dev.json"
TUNE = ("conv-26", "conv-30", "conv-41")

from tiered_memory.recall.fusion import SIGNALS as FEATURES  # noqa: E402

INDEX = {n: i for i, n in enumerate(FEATURES)}


def features(candidates: Sequence[Any], previous: Mapping[str, str], plan: Any, w: Any,
             places: Mapping[str, int] | None = None) -> np.ndarray:
    """The feature matrix of a pool (rows in ``candidates`` order, columns the core's
    ``recall.fusion.SIGNALS``, computed by the core's own ``signals``; ``places`` as the
    search's ``Pool.places``)."""
    from tiered_memory.recall.fusion import signals
    from tiered_memory.recall.scoring import base_scores, in_date_ranges, names_speaker

    base = base_scores(candidates, plan, w)
    dated = {c.id: bool(plan.dates) and in_date_ranges(c.timestamp, plan.dates, w.date_before_days,
                                                        w.date_after_days) for c in candidates}
    named = {c.id: names_speaker(plan.names, c.speaker) for c in candidates}
    values = signals(candidates, previous, plan, base, date_hit=dated, speaker_hit=named, places=places)
    return np.array([[values[c.id].get(f, 0.0) for f in FEATURES] for c in candidates])


@dataclass
class Query:
    dataset: str
    conversation: str
    category: int
    evidence: tuple[str, ...]
    x: np.ndarray  # candidates x FEATURES
    dia: list[str]  # each candidate's dialogue id
    ids: list[str]  # each candidate's record id (ties break by id, as score_turns does)
    session: np.ndarray  # each candidate's session, as small integers
    label: np.ndarray  # 1.0 for an evidence turn


def each_pool(data: Path, dataset: str, embedder: Any = None) -> Iterator[tuple[Any, Any, Any, Any]]:
    """Ingest each conversation of ``data`` once (``dataset`` "realchat": its rewrite) through
    ``add_many`` with ``embedder`` (None: the static one), and yield ``(conversation, question,
    pool, retrieval config)`` for each question: the pool a real search would score."""
    from bench.locomo import ingest
    from bench.realchat import realchat
    from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
    from tiered_memory.recall.search import gather_pool

    convs = load_conversations(data)
    if dataset == "realchat":
        convs = realchat(convs)
    embedder = StaticEmbedder() if embedder is None else embedder
    with tempfile.TemporaryDirectory(prefix="fusion-pools-") as tmp:
        for c in convs:
            user = f"locomo-{c.id}"
            with TieredMemory(Path(tmp) / c.id, embedder=embedder, config=MemoryConfig()) as memory:
                ingest(memory, c, user_id=user)
                config = memory.config.retrieval
                for q in c.questions:
                    pool = gather_pool(store=memory.store, index=memory.index, embedder=memory.embedder,
                                       config=config, query=q.question, user_id=user, k=10)
                    assert pool is not None
                    yield c, q, pool, config
            print(f"  {dataset} {c.id}: {len(c.questions)} questions", flush=True)


def dump(data: Path, dataset: str) -> list[Query]:
    """Each question's pool as a :class:`Query` (features and labels)."""
    from tiered_memory.recall.search import turn_weights

    out: list[Query] = []
    for c, q, pool, config in each_pool(data, dataset):
        cands = pool.candidates
        dia = [str(pool.records[cd.id].metadata.get("dia_id")) for cd in cands]
        codes: dict[str, int] = {}
        out.append(Query(
            dataset=dataset, conversation=c.id, category=q.category, evidence=q.evidence,
            x=features(cands, pool.previous, pool.plan, turn_weights(config), pool.places), dia=dia, ids=[cd.id for cd in cands],
            session=np.array([codes.setdefault(cd.session_id, len(codes)) for cd in cands]),
            label=np.array([1.0 if d in set(q.evidence) else 0.0 for d in dia])))
    return out


# ---- scoring from the rows ---------------------------------------------------
def with_session_share(q: Query, partial: np.ndarray, weight: float, top: int = 20) -> np.ndarray:
    """``partial`` plus ``weight`` x its session's share of the ``top`` best partial scores
    (``scoring.session_shares``, vectorised)."""
    if not weight:
        return partial
    order = np.lexsort((q.ids, -partial))[:top]
    sums = np.zeros(q.session.max() + 1)
    np.add.at(sums, q.session[order], np.maximum(partial[order], 0.0))
    peak = sums.max()
    return partial + (weight * sums[q.session] / peak if peak > 0 else 0.0)


@dataclass(frozen=True)
class Linear:
    """``x @ weights`` plus ``share`` x the session share of that score (as score_turns)."""

    weights: np.ndarray
    share: float = 0.1

    def score(self, q: Query) -> np.ndarray:
        return with_session_share(q, q.x @ self.weights, self.share)


def today() -> Linear:
    """Today's defaults written over the rows (checks the rows: it must give bench.locomo's figures)."""
    w = np.zeros(len(FEATURES))
    for name, value in {"similarity": 1.0, "keyword_score": 0.5, "date": 0.2, "previous_base": 0.3,
                        "previous_question": 0.3, "question": -0.15, "speaker": 0.1, "time": 0.1,
                        "session_terms": 0.3}.items():
        w[INDEX[name]] = value
    return Linear(w, 0.1)


def ranked_dia(q: Query, score: np.ndarray, k: int = 10) -> list[str]:
    order = np.lexsort((q.ids, -score))[:k]
    return [q.dia[i] for i in order]


def metrics(qs: Sequence[Query], score: Callable[[Query], np.ndarray]) -> dict[str, float]:
    if not qs:
        return {}
    r10 = r5 = s10 = 0.0
    for q in qs:
        top = ranked_dia(q, score(q))
        r10 += recall_at(top, q.evidence, 10)
        r5 += recall_at(top, q.evidence, 5)
        s10 += session_recall_at(top, q.evidence, 10)
    n = len(qs)
    return {"r10": r10 / n, "r5": r5 / n, "s10": s10 / n, "n": n}


def recall10(qs: Sequence[Query], score: Callable[[Query], np.ndarray]) -> float:
    return sum(recall_at(ranked_dia(q, score(q)), q.evidence, 10) for q in qs) / len(qs)


# ---- fitting -----------------------------------------------------------------
def fit_listwise(qs: Sequence[Query], cols: Sequence[int], l2: float) -> np.ndarray:
    """Softmax (ListNet-style) over each question's pool, the evidence rows as the target
    distribution, L2 on the weights; weights for ``cols`` (the others 0)."""
    from scipy.optimize import minimize

    data = [(q.x[:, cols], q.label / q.label.sum()) for q in qs if q.label.sum() > 0]

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        total, grad = 0.0, np.zeros_like(w)
        for x, t in data:
            s = x @ w * 10.0  # temperature: cosine-scale scores are close together
            s -= s.max()
            p = np.exp(s)
            p /= p.sum()
            total -= float(t @ np.log(p + 1e-12))
            grad -= 10.0 * (x.T @ (t - p))
        n = len(data)
        return total / n + l2 * float(w @ w), grad / n + 2 * l2 * w

    w0 = np.zeros(len(cols))
    w0[list(cols).index(INDEX["similarity"])] = 1.0
    res = minimize(loss, w0, jac=True, method="L-BFGS-B")
    out = np.zeros(len(FEATURES))
    out[list(cols)] = res.x / max(1e-9, res.x[list(cols).index(INDEX["similarity"])])  # cosine weight 1.0
    return out


def coordinate_ascent(qs: Sequence[Query], start: Linear, cols: Sequence[int], rounds: int = 3,
                      steps: Sequence[float] = (-0.2, -0.1, -0.05, -0.02, 0.02, 0.05, 0.1, 0.2),
                      l2: float = 0.0) -> Linear:
    """Recall@10 on ``qs`` directly, one weight at a time (the cosine's stays 1.0), minus
    ``l2`` x the squared distance from ``start`` (a gain must pay for moving)."""
    best = start
    origin = start.weights.copy()

    def objective(m: Linear) -> float:
        return recall10(qs, m.score) - l2 * float(((m.weights - origin) ** 2).sum())

    value = objective(best)
    for _ in range(rounds):
        moved = False
        for c in list(cols) + [-1]:
            if c == INDEX["similarity"]:
                continue
            for step in steps:
                if c == -1:
                    trial = Linear(best.weights, max(0.0, best.share + step))
                else:
                    w = best.weights.copy()
                    w[c] += step
                    trial = Linear(w, best.share)
                v = objective(trial)
                if v > value + 1e-9:
                    best, value, moved = trial, v, True
        if not moved:
            break
    return best


# ---- report ------------------------------------------------------------------
def report(name: str, qs: Sequence[Query], model: Linear) -> None:
    def cell(sel: Sequence[Query]) -> str:
        m = metrics(sel, model.score)
        return f"{m['r10']:.3f} ({m['r5']:.3f}, {m['s10']:.3f})" if m else "-"

    rows = []
    for ds in ("locomo", "realchat"):
        d = [q for q in qs if q.dataset == ds]
        rows.append(f"{ds}: all {cell(d)} | tune {cell([q for q in d if q.conversation in TUNE])} | "
                    f"held out {cell([q for q in d if q.conversation not in TUNE])}")
        cats = " / ".join(f"{metrics([q for q in d if q.category == c], model.score)['r10']:.3f}"
                          for c in CATEGORIES)
        held = " / ".join(f"{metrics([q for q in d if q.category == c and q.conversation not in TUNE], model.score)['r10']:.3f}"
                          for c in CATEGORIES)
        rows.append(f"   per category (multi-hop / temporal / open-domain / single-hop) all {cats}; held out {held}")
    print(f"\n== {name}")
    for r in rows:
        print("  " + r)


def describe(model: Linear) -> str:
    parts = [f"{n} {model.weights[i]:+.3f}" for i, n in enumerate(FEATURES) if abs(model.weights[i]) > 1e-9]
    return ", ".join(parts) + f", session share {model.share:.3f}"


AGAINST = ("hand", "no-spread", "session-table", "window-table")


def latency(data: Path, rounds: int = 3, against: str = "hand") -> None:
    """Search time of the shipped settings against ``against`` ("hand": the hand fusion;
    "no-spread": no session spread for listing questions; "session-table" / "window-table": the
    learned table before the topic window / before the answer type, ``bench.fusion_window.SESSION_TABLE``
    / ``bench.fusion_answer.WINDOW_TABLE``), interleaved in one process on one memory (every LoCoMo
    dev turn under one user), query vectors given."""
    import time
    from dataclasses import replace

    from bench.fusion_answer import WINDOW_TABLE
    from bench.fusion_window import SESSION_TABLE
    from bench.locomo import ingest
    from bench.locomo_data import percentile
    from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
    from tiered_memory.embedding import embed_query
    from tiered_memory.recall.search import search_turns

    convs = load_conversations(data)
    embedder = StaticEmbedder()
    with tempfile.TemporaryDirectory(prefix="fusion-latency-") as tmp, \
            TieredMemory(Path(tmp) / "m", embedder=embedder) as memory:
        for c in convs:
            ingest(memory, c, user_id="scale", session_prefix=f"{c.id}/")
        questions = [q.question for c in convs for q in c.questions]
        vectors = {q: embed_query(embedder, q) for q in questions}
        shipped = MemoryConfig().retrieval
        other = {"hand": replace(shipped, turn_fusion="hand"), "no-spread": replace(shipped, listing_spread=0.0),
                 "session-table": replace(shipped, fusion_weights=SESSION_TABLE),
                 "window-table": replace(shipped, fusion_weights=WINDOW_TABLE)}[against]
        configs = {against: other, "shipped": shipped}
        ms: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(rounds):
            for q in questions:
                for name, config in configs.items():
                    start = time.perf_counter()
                    search_turns(store=memory.store, index=memory.index, embedder=embedder, config=config,
                                 query=q, user_id="scale", k=10, vector=vectors[q])
                    ms[name].append((time.perf_counter() - start) * 1000)
    for name, values in ms.items():
        print(f"  {name}: {len(values)} searches, p50 {percentile(values, 50):.2f} ms, "
              f"p95 {percentile(values, 95):.2f} ms")
    for p in (50, 95):
        print(f"  shipped / {against} p{p}: {percentile(ms['shipped'], p) / percentile(ms[against], p):.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fusion_fit", description=__doc__.split("\n")[0])
    p.add_argument("file", nargs="?", default=str(DEFAULT_DATA))
    p.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "fusion_fit_rows.pkl"))
    p.add_argument("--refresh", action="store_true", help="ingest and dump again")
    p.add_argument("--ablate", action="store_true", help="backward feature elimination (tuning split)")
    p.add_argument("--latency", nargs="?", const="hand", choices=AGAINST,
                   help="search p50/p95 of the shipped settings against the hand fusion (default), "
                        "no session spread, or the learned table before the topic window / the answer type")
    args = p.parse_args(argv)
    if args.latency:
        latency(Path(args.file), against=args.latency)
        return 0
    cache = Path(args.cache)
    if cache.exists() and not args.refresh:
        qs: list[Query] = pickle.loads(cache.read_bytes())
    else:
        qs = dump(Path(args.file), "locomo") + dump(Path(args.file), "realchat")
        cache.write_bytes(pickle.dumps(qs))
    tune = [q for q in qs if q.conversation in TUNE]
    print(f"{len(qs)} questions, {sum(len(q.dia) for q in qs)} candidate rows, "
          f"{sum(q.label.sum() for q in qs):.0f} evidence rows; tuning on {len(tune)}")
    base = today()
    report("today's score (from the rows)", qs, base)
    if args.ablate:
        ablate(qs, tune, 1e-2)
        return 0
    run_fits(qs, tune, base)
    return 0


def ablate(qs: Sequence[Query], tune: Sequence[Query], l2: float) -> None:
    """Backward elimination on the tuning split only: drop, one at a time, the feature whose
    removal costs least tuning recall@10 (both sets), down to ``sim`` alone."""
    cols = list(range(len(FEATURES)))
    while len(cols) > 1:
        trials = []
        for c in cols:
            if c == INDEX["similarity"]:
                continue
            rest = [k for k in cols if k != c]
            m = Linear(fit_listwise(tune, rest, l2), 0.0)
            trials.append((recall10(tune, m.score), c, m))
        value, worst, m = max(trials)
        cols.remove(worst)
        held = [q for q in qs if q.conversation not in TUNE]
        print(f"  without {FEATURES[worst]:17s} ({len(cols):2d} left): tune {value:.4f}, "
              f"held out {recall10(held, m.score):.4f}", flush=True)


# the set backward elimination (--ablate) keeps at its best tuning recall@10: 13 signals
SELECTED = ("similarity", "keyword_score", "date", "previous_question", "question", "speaker", "time",
            "session_terms", "session_best", "next_similarity", "next_keyword", "previous_keyword", "length")


def boosted(tune: Sequence[Query], cols: Sequence[int]) -> Callable[[Query], np.ndarray]:
    """A small non-linear model: sklearn's HistGradientBoostingClassifier, pointwise."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    x = np.vstack([q.x[:, cols] for q in tune])
    y = np.concatenate([q.label for q in tune])
    model = HistGradientBoostingClassifier(max_iter=150, learning_rate=0.1, max_leaf_nodes=15,
                                           l2_regularization=1.0, random_state=0).fit(x, y)
    return lambda q: np.asarray(model.predict_proba(q.x[:, cols])[:, 1])


def run_fits(qs: Sequence[Query], tune: Sequence[Query], base: Linear) -> None:
    today_cols = [INDEX[n] for n in FEATURES[:9]]
    selected = [INDEX[n] for n in SELECTED]
    no_speaker = [c for c in selected if c != INDEX["speaker"]]
    fits = (("today's 9 signals", today_cols), ("all 20 signals", list(range(len(FEATURES)))),
            ("the 13 selected", selected), ("the 13 selected less speaker", no_speaker))
    for label, cols in fits:
        m = Linear(fit_listwise(tune, cols, 1e-2), 0.0)
        print(f"\nlistwise, {label}, l2 0.01: {describe(m)}")
        report(f"listwise logistic, {label}", qs, m)
        if cols is selected:
            chosen = m
            print("LEARNED = {" + ", ".join(f'"{FEATURES[i]}": {m.weights[i]:.3f}' for i in cols) + "}")
    m = coordinate_ascent(tune, chosen, selected, rounds=2, l2=0.02)
    print(f"\ncoordinate ascent on recall@10 from the 13-signal fit: {describe(m)}")
    report("listwise + coordinate ascent, 13 selected", qs, m)
    score = boosted(tune, selected)
    report("gradient-boosted trees (sklearn HistGradientBoosting, pointwise), 13 selected",
           qs, type("Boosted", (), {"score": staticmethod(score)})())  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
