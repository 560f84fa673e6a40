"""The learned fusion of turn recall: named signals per candidate, and a weight table fitted
to rank evidence turns first. Pure; :mod:`.search` scores by it (:func:`score_learned`) unless the hand weights are chosen.

:func:`signals` computes, for every candidate turn of a query's pool, the values below
(the parts :func:`.scoring.score_turns` adds by hand, and a few more read from the same
pool). A turn's score is ``sum(weight[name] x value[name])`` over the table's names, then
plus ``weight["session_share"]`` x its session's share of the best such scores
(:func:`.scoring.session_shares`).

``base`` is a turn's base score of :func:`.scoring.base_scores` (cosine + the config's
``keyword_score_weight`` x normalised BM25 + its ``date_boost``): it is what a turn passes
to its neighbours here, and what picks the turns whose neighbours are fetched.

:data:`LEARNED` was fitted by ``bench/fusion_fit.py`` (softmax over each question's pool,
L2-regularised, the cosine's weight fixed at 1) on the tuning split only: LoCoMo conv-26,
-30 and -41 and the same three in the real-chat rewrite. The figures are in
``bench/README.md``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..errors import ConfigurationError
from .coverage import coverage, exchange_coverage, session_coverage, stems, term_weights
from .query import QueryPlan, has_time_expression, question_share
from .scoring import (Candidate, Scored, TurnWeights, base_scores, in_date_ranges, names_speaker, recency_score,
                      session_shares)

SIGNALS = (
    "similarity",        # cosine to the query (the pool's lowest for a turn found otherwise)
    "keyword",           # BM25 / the query's best BM25
    "date",              # 1 if the query names a date and the turn is dated near it
    "previous_base",     # the base score of the turn before it (0 if not in the pool)
    "previous_question",  # ... times that turn's share of question sentences
    "question",          # the turn's own share of question sentences
    "speaker",           # 1 if the query names the turn's speaker
    "time",              # 1 if the query asks when and the turn holds a time expression
    "session_terms",     # the query terms' coverage by its session's candidates together
    "exchange_terms",    # their coverage by the turn and the one before it (that one at half)
    "own_terms",         # their coverage by the turn alone
    "session_best",      # its session's best base score / the best of all
    "session_best_similarity",  # its session's best cosine / the best cosine
    "vector_rank",       # 1 / log2(1 + its cosine's rank in the pool); 0 if not a vector hit
    "keyword_rank",      # 1 / log2(1 + its BM25 rank); 0 if not a keyword hit
    "next_similarity",   # the cosine of the turn after it (0 if not in the pool)
    "next_keyword",      # that turn's normalised BM25
    "previous_similarity",  # the cosine of the turn before it
    "previous_keyword",  # that turn's normalised BM25
    "length",            # -log(characters / the pool's median)
)
SESSION_SHARE = "session_share"  # applied after the sum: its session's share of the best sums

# fitted by bench/fusion_fit.py on the tuning split (see the module docstring)
LEARNED: Mapping[str, float] = {
    "similarity": 1.0, "keyword": 1.041, "date": 2.185, "previous_question": 0.281, "question": -0.308,
    "speaker": 1.497, "time": 0.608, "session_terms": 1.509, "session_best": 1.721,
    "next_similarity": 0.329, "next_keyword": 0.400, "previous_keyword": 1.054, "length": -0.274,
}


def check_weights(weights: Mapping[str, float]) -> None:
    """Raise :class:`~tiered_memory.errors.ConfigurationError` for a name that is not a
    signal or a weight that is not a finite number."""
    known = set(SIGNALS) | {SESSION_SHARE}
    for name, value in weights.items():
        if name not in known:
            raise ConfigurationError(
                f"unknown turn signal {name!r} in RetrievalConfig.fusion_weights; "
                f"use one of: {', '.join(sorted(known))}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigurationError(
                f"RetrievalConfig.fusion_weights[{name!r}] must be a finite number, got {value!r}")


def signals(candidates: Sequence[Any], previous: Mapping[str, str], plan: QueryPlan,
            base: Mapping[str, float], *, date_hit: Mapping[str, bool],
            speaker_hit: Mapping[str, bool]) -> dict[str, dict[str, float]]:
    """Per candidate id, the value of each of :data:`SIGNALS` (zeros left out).

    ``base`` is each candidate's base score, ``date_hit`` / ``speaker_hit`` whether it is
    dated near a date the query names / said by a person the query names (the caller
    reads those with its own window and name rules).
    """
    by_id = {c.id: c for c in candidates}
    sims = [c.similarity for c in candidates if c.similarity is not None]
    floor = min(sims) if sims else 0.0
    top_sim = max(sims) if sims else 0.0
    top_bm25 = max((c.bm25 for c in candidates if c.bm25 is not None and c.bm25 > 0), default=0.0)
    sim = {c.id: c.similarity if c.similarity is not None else floor for c in candidates}
    bm = {c.id: max(0.0, c.bm25) / top_bm25 if c.bm25 is not None and top_bm25 > 0 else 0.0
          for c in candidates}
    after = {p: i for i, p in previous.items() if i in by_id and p in by_id}
    texts = {c.id: c.text for c in candidates}
    sessions = {c.id: c.session_id for c in candidates}
    weights = term_weights(plan.terms, list(texts.values()))
    exchange = exchange_coverage(texts, previous, weights) if weights else {}
    session_terms = session_coverage(texts, sessions, weights) if weights else {}
    best_base: dict[str, float] = {}
    best_sim: dict[str, float] = {}
    for c in candidates:
        best_base[c.session_id] = max(best_base.get(c.session_id, 0.0), base[c.id])
        best_sim[c.session_id] = max(best_sim.get(c.session_id, 0.0), sim[c.id])
    peak_base = max(best_base.values(), default=0.0)
    lengths = sorted(len(c.text) for c in candidates)
    typical = max(1, lengths[len(lengths) // 2]) if lengths else 1
    out: dict[str, dict[str, float]] = {}
    for c in candidates:
        before = previous.get(c.id)
        prev = before if before is not None and before in by_id else None
        nxt = after.get(c.id)
        values = {
            "similarity": sim[c.id],
            "keyword": bm[c.id],
            "date": 1.0 if date_hit.get(c.id) else 0.0,
            "previous_base": base[prev] if prev else 0.0,
            "previous_question": base[prev] * question_share(by_id[prev].text) if prev else 0.0,
            "question": question_share(c.text),
            "speaker": 1.0 if speaker_hit.get(c.id) else 0.0,
            "time": 1.0 if plan.temporal and has_time_expression(c.text) else 0.0,
            "session_terms": session_terms.get(c.session_id, 0.0),
            "exchange_terms": exchange.get(c.id, 0.0),
            "own_terms": coverage(stems(c.text), weights) if weights else 0.0,
            "session_best": best_base[c.session_id] / peak_base if peak_base > 0 else 0.0,
            "session_best_similarity": best_sim[c.session_id] / top_sim if top_sim > 0 else 0.0,
            "vector_rank": 1.0 / math.log2(1 + c.vector_rank) if c.vector_rank else 0.0,
            "keyword_rank": 1.0 / math.log2(1 + c.keyword_rank) if c.keyword_rank else 0.0,
            "next_similarity": sim[nxt] if nxt else 0.0,
            "next_keyword": bm[nxt] if nxt else 0.0,
            "previous_similarity": sim[prev] if prev else 0.0,
            "previous_keyword": bm[prev] if prev else 0.0,
            "length": -math.log(max(1, len(c.text)) / typical),
        }
        out[c.id] = {k: v for k, v in values.items() if v}
    return out


def weighted_sum(values: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """``sum(weights[n] x values[n])`` over the names in both (a missing value is 0)."""
    return sum(w * values.get(n, 0.0) for n, w in weights.items() if n != SESSION_SHARE)


def score_learned(
    candidates: Sequence[Candidate], previous: Mapping[str, str], plan: QueryPlan, w: TurnWeights,
    fusion: Mapping[str, float], *, now: float,
) -> list[Scored]:
    """Score and order turn candidates by a weight table over :data:`.fusion.SIGNALS` (the
    base score, the date window and the speaker rule from ``w``), plus the table's
    ``session_share`` x the session's share of the ``w.session_top`` best sums, plus
    ``w.recency_boost`` x recency; best first, ties by id."""
    base = base_scores(candidates, plan, w)
    dated = {c.id: bool(plan.dates) and in_date_ranges(c.timestamp, plan.dates, w.date_before_days,
                                                        w.date_after_days) for c in candidates}
    named = {c.id: names_speaker(plan.names, c.speaker) for c in candidates}
    values = signals(candidates, previous, plan, base, date_hit=dated, speaker_hit=named)
    scores: dict[str, float] = {}
    parts: dict[str, dict[str, dict[str, float]]] = {}
    for c in candidates:
        v = values[c.id]
        p: dict[str, dict[str, float]] = {}
        if c.similarity is not None:
            p["vector"] = {"rank": float(c.vector_rank or 0), "value": c.similarity}
        if c.bm25 is not None:
            p["keyword"] = {"rank": float(c.keyword_rank or 0), "value": c.bm25}
        for name, weight in fusion.items():
            if name != SESSION_SHARE and v.get(name) and weight:
                p.setdefault(name, {"rank": 0.0})
                p[name].update({"value": v[name], "contribution": weight * v[name]})
        scores[c.id] = weighted_sum(v, fusion)
        if w.recency_boost:
            r = recency_score(c.timestamp, now, w.recency_half_life_days)
            scores[c.id] += w.recency_boost * r
            p["recency"] = {"rank": 0.0, "value": r, "contribution": w.recency_boost * r}
        parts[c.id] = p
    share_weight = fusion.get(SESSION_SHARE, 0.0)
    if share_weight:
        sessions = {c.id: c.session_id for c in candidates}
        shares = session_shares(scores, sessions, w.session_top)
        for c in candidates:
            share = shares.get(c.session_id, 0.0)
            if share:
                scores[c.id] += share_weight * share
                parts[c.id]["session"] = {"rank": 0.0, "value": share, "contribution": share_weight * share}
    ordered = sorted(scores, key=lambda i: (-scores[i], i))
    return [Scored(i, scores[i], parts[i]) for i in ordered]
