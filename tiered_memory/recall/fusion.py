"""The learned fusion of turn recall: named signals per candidate, and a weight table fitted
to rank evidence turns first. Pure; :mod:`.search` scores by it (:func:`score_learned`)
unless ``RetrievalConfig.turn_fusion`` chooses the hand weights (:func:`.scoring.score_turns`).

:func:`signals` computes, for every candidate turn of a query's pool, the values below
(the parts :func:`.scoring.score_turns` adds by hand, and a few more read from the same
pool). A turn's score is ``sum(weight[name] x value[name])`` over the table's names, then
plus ``weight["session_share"]`` x its session's share of the best such scores
(:func:`.scoring.session_shares`).

``base`` is a turn's base score of :func:`.scoring.base_scores` (cosine + the config's
``keyword_score_weight`` x normalised BM25 + its ``date_boost``): it is what a turn passes
to its neighbours here, and what picks the turns whose neighbours are fetched.

:data:`LEARNED` was fitted (softmax over each question's pool, L2-regularised, the cosine's
weight fixed at 1; ``bench/fusion_fit.py``, today's table by ``python -m bench.fusion_answer``)
on the tuning split only: LoCoMo conv-26, -30 and -41 and the same three in the real-chat
rewrite. It reads a turn's topic window (``window_terms``, ``window_best``) where an earlier
table read its whole session, and whether the turn holds the kind of answer the query asks for
(``answer_type``, :mod:`.answers`). The figures are in ``bench/README.md``.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Sequence

import numpy as np

from ..errors import ConfigurationError
from .answers import holds_answer
from .coverage import TermsHeld, coverage, exchange_coverage, session_coverage, stem, stems, term_weights
from .query import QueryPlan, has_time_expression, question_share
from .scoring import (Candidate, Scored, TurnWeights, base_scores, best_first, in_date_ranges, names_speaker,
                      recency_score, session_shares)

SIGNALS = (
    "similarity",        # cosine to the query (the pool's lowest for a turn found otherwise)
    "keyword_score",     # BM25 / the query's best BM25
    "date",              # 1 if the query names a date and the turn is dated near it
    "previous_base",     # the base score of the turn before it, past reactions (0 if not in the pool)
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
    "window_terms",      # the query terms' coverage by the candidates within TOPIC_WINDOW turns of it
    "window_best",       # the best base score within TOPIC_WINDOW turns of it / the best of all
    "answer_type",       # 1 if the query asks for a number, place, person or name and the turn holds one
)
# A topic's turns lie near each other: the window signals read the candidates of the turn's
# session within this many turns of it (by the places a search counts), not its whole
# session, which in a day of real chat may hold several topics. Chosen by bench/fusion_window.py.
TOPIC_WINDOW = 5
WINDOW_SIGNALS = ("window_terms", "window_best")  # the signals that need each candidate's place
SESSION_SHARE = "session_share"  # applied after the sum: its session's share of the best sums

# fitted by bench/fusion_fit.py on the tuning split (see the module docstring)
LEARNED: Mapping[str, float] = {
    "similarity": 1.0, "keyword_score": 0.957, "date": 2.605, "previous_question": 0.271, "question": -0.375,
    "speaker": 1.792, "time": 0.675, "next_similarity": 0.172, "next_keyword": 0.343, "previous_keyword": 0.970,
    "length": -0.267, "window_terms": 2.397, "window_best": 2.101, "answer_type": 0.672,
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
            base: Mapping[str, float], *, date_hit: Mapping[str, bool], speaker_hit: Mapping[str, bool],
            wanted: Collection[str] = SIGNALS, places: Mapping[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Per candidate id, the value of each of the ``wanted`` :data:`SIGNALS` (zeros left out),
    in the order of :data:`SIGNALS`: :func:`signal_columns` by candidate."""
    columns = signal_columns(candidates, previous, plan, base, date_hit=date_hit, speaker_hit=speaker_hit,
                             wanted=wanted, places=places)
    out: dict[str, dict[str, float]] = {c.id: {} for c in candidates}
    for name in SIGNALS:
        for i, v in columns.get(name, {}).items():
            out[i][name] = v
    return out


def signal_columns(candidates: Sequence[Any], previous: Mapping[str, str], plan: QueryPlan,
                   base: Mapping[str, float], *, date_hit: Mapping[str, bool], speaker_hit: Mapping[str, bool],
                   wanted: Collection[str] = SIGNALS,
                   places: Mapping[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Per signal of ``wanted`` (a search asks only for those its table weighs, since each
    costs time), the candidates' non-zero values by id.

    ``base`` is each candidate's base score, ``date_hit`` / ``speaker_hit`` whether it is
    dated near a date the query names / said by a person the query names (the caller
    reads those with its own window and name rules). ``places``: each candidate's place in its
    session (:func:`.search.session_positions`); a candidate without one is its own topic window.
    """
    by_id = {c.id: c for c in candidates}
    sims = [c.similarity for c in candidates if c.similarity is not None]
    floor = min(sims) if sims else 0.0
    top_sim = max(sims) if sims else 0.0
    top_bm25 = max((c.bm25 for c in candidates if c.bm25 is not None and c.bm25 > 0), default=0.0)
    sim = {c.id: c.similarity if c.similarity is not None else floor for c in candidates}
    bm = {c.id: max(0.0, c.bm25) / top_bm25 if c.bm25 is not None and top_bm25 > 0 else 0.0
          for c in candidates}
    prev = {i: p for i, p in previous.items() if i in by_id and p in by_id}
    after = {p: i for i, p in prev.items()}
    columns: dict[str, dict[str, float]] = {}

    def column(name: str, values: Mapping[str, float]) -> None:
        if name in wanted:
            columns[name] = {i: v for i, v in values.items() if v}

    if "similarity" in wanted:
        column("similarity", sim)
    if "keyword_score" in wanted:
        column("keyword_score", bm)
    column("date", {i: 1.0 for i, hit in date_hit.items() if hit})
    column("speaker", {i: 1.0 for i, hit in speaker_hit.items() if hit})
    if "previous_base" in wanted:
        column("previous_base", {i: base[p] for i, p in prev.items()})
    if "previous_question" in wanted:
        column("previous_question", {i: base[p] * question_share(by_id[p].text) for i, p in prev.items()})
    if "question" in wanted:
        column("question", {c.id: question_share(c.text) for c in candidates})
    if "time" in wanted and plan.temporal:
        column("time", {c.id: 1.0 for c in candidates if has_time_expression(c.text)})
    weights: dict[str, float] = {}
    found: dict[str, frozenset[str]] = {}  # each candidate's query terms
    if wanted_any(wanted, "session_terms", "exchange_terms", "own_terms", "window_terms"):
        holds = TermsHeld(stem(t) for t in plan.terms)
        each = [holds(c.text) for c in candidates]
        found = {c.id: terms for c, terms in zip(candidates, each)}
        weights = term_weights(plan.terms, [c.text for c in candidates], each)
    if wanted_any(wanted, "session_terms", "exchange_terms", "own_terms"):
        texts = {c.id: c.text for c in candidates}
        if weights and "session_terms" in wanted:
            per_session = session_coverage(texts, {c.id: c.session_id for c in candidates}, weights)
            column("session_terms", {c.id: per_session[c.session_id] for c in candidates})
        if weights and "exchange_terms" in wanted:
            column("exchange_terms", exchange_coverage(texts, previous, weights))
        if weights and "own_terms" in wanted:
            column("own_terms", {c.id: coverage(stems(c.text), weights) for c in candidates})
    if "session_best" in wanted:
        best: dict[str, float] = {}
        for c in candidates:
            best[c.session_id] = max(best.get(c.session_id, 0.0), base[c.id])
        peak = max(best.values(), default=0.0)
        if peak > 0:
            column("session_best", {c.id: best[c.session_id] / peak for c in candidates})
    if "session_best_similarity" in wanted and top_sim > 0:
        best_sim: dict[str, float] = {}
        for c in candidates:
            best_sim[c.session_id] = max(best_sim.get(c.session_id, 0.0), sim[c.id])
        column("session_best_similarity", {c.id: best_sim[c.session_id] / top_sim for c in candidates})
    if "vector_rank" in wanted:
        column("vector_rank", {c.id: 1.0 / math.log2(1 + c.vector_rank) for c in candidates if c.vector_rank})
    if "keyword_rank" in wanted:
        column("keyword_rank", {c.id: 1.0 / math.log2(1 + c.keyword_rank) for c in candidates if c.keyword_rank})
    column("next_similarity", {p: sim[i] for p, i in after.items()})
    column("next_keyword", {p: bm[i] for p, i in after.items()})
    column("previous_similarity", {i: sim[p] for i, p in prev.items()})
    column("previous_keyword", {i: bm[p] for i, p in prev.items()})
    if wanted_any(wanted, "window_terms", "window_best"):
        # each candidate's query terms as bits: a window's terms are their OR, scored once per set
        bit = {t: 1 << n for n, t in enumerate(weights)}
        held = {i: sum(map(bit.__getitem__, terms)) for i, terms in found.items()} \
            if "window_terms" in wanted and weights else {}
        near = topic_windows(candidates, TOPIC_WINDOW, places or {}, base, held)
        if held:
            share: dict[int, float] = {}  # each set of terms that occurs, scored once
            for i, (_, mask) in near.items():
                if mask not in share:
                    share[mask] = coverage(frozenset(t for t in weights if mask & bit[t]), weights)
            column("window_terms", {i: share[mask] for i, (_, mask) in near.items()})
        peak = max(base.values(), default=0.0)
        if "window_best" in wanted and peak > 0:
            column("window_best", {i: best / peak for i, (best, _) in near.items()})
    if "answer_type" in wanted and plan.answer:
        # the chat's own people are greeted and addressed all the time: they answer no *who*
        participants = set(plan.names)
        for c in candidates:
            if c.speaker and c.speaker not in participants:
                participants.add(c.speaker)
                participants.update(c.speaker.split())
        column("answer_type", {c.id: 1.0 for c in candidates if holds_answer(plan.answer, c.text, participants)})
    if "length" in wanted and candidates:
        lengths = sorted(len(c.text) for c in candidates)
        typical = max(1, lengths[len(lengths) // 2])
        column("length", {c.id: -math.log(max(1, len(c.text)) / typical) for c in candidates})
    return columns


def topic_windows(candidates: Sequence[Candidate], window: int, places: Mapping[str, int],
                  base: Mapping[str, float], bits: Mapping[str, int]) -> dict[str, tuple[float, int]]:
    """Per candidate id, over the candidates of its session whose ``places`` lie within
    ``window`` of its own (itself included): the best ``base`` and the OR of ``bits`` (0 for an
    id without). A candidate without a place is its own window.

    Places are distinct, so a window holds at most ``2 x window + 1`` candidates: in (session,
    place) order, each candidate meets the others of its window among its ``2 x window``
    neighbours on either side, which numpy compares all at once."""
    placed = sorted((c.session_id, places[c.id], c.id) for c in candidates if c.id in places)
    out = {c.id: (base[c.id], bits.get(c.id, 0)) for c in candidates}
    if not placed:
        return out
    codes: dict[str, int] = {}
    session = np.array([codes.setdefault(s, len(codes)) for s, _, _ in placed])
    at = np.array([p for _, p, _ in placed], dtype=np.int64)
    score = np.array([base[i] for _, _, i in placed], dtype=np.float64)
    wide = any(b >> 62 for b in bits.values())  # a query of over 62 terms: Python ints hold the bits
    mask = np.array([bits.get(i, 0) for _, _, i in placed], dtype=object if wide else np.int64)
    best, held = score.copy(), mask.copy()
    n = len(placed)
    for shift in range(1, min(2 * window, n - 1) + 1):
        near = (session[shift:] == session[:-shift]) & (at[shift:] - at[:-shift] <= window)
        # the later one of each near pair takes the earlier's, and the earlier the later's
        best[shift:] = np.where(near, np.maximum(best[shift:], score[:-shift]), best[shift:])
        held[shift:] = np.where(near, held[shift:] | mask[:-shift], held[shift:])
        best[:-shift] = np.where(near, np.maximum(best[:-shift], score[shift:]), best[:-shift])
        held[:-shift] = np.where(near, held[:-shift] | mask[shift:], held[:-shift])
    for (_, _, i), b, h in zip(placed, best.tolist(), held.tolist()):
        out[i] = (b, h)
    return out


def wanted_any(wanted: Collection[str], *names: str) -> bool:
    return any(n in wanted for n in names)


def score_learned(
    candidates: Sequence[Candidate], previous: Mapping[str, str], plan: QueryPlan, w: TurnWeights,
    fusion: Mapping[str, float], *, now: float, explain: int | None = None, places: Mapping[str, int] | None = None,
) -> list[Scored]:
    """Score and order turn candidates by a weight table over :data:`.fusion.SIGNALS` (the
    base score, the date window and the speaker rule from ``w``), plus the table's
    ``session_share`` x the session's share of the ``w.session_top`` best sums, plus
    ``w.recency_boost`` x recency; best first, ties by id. Only the best ``explain``
    (None: all) carry their parts: explaining every candidate costs more than scoring it.
    ``places``: each candidate's place in its session, for the topic window."""
    base = base_scores(candidates, plan, w)
    dated = {c.id: True for c in candidates if in_date_ranges(c.timestamp, plan.dates, w.date_before_days,
                                                               w.date_after_days)} if plan.dates else {}
    named: dict[str, bool] = {}
    if plan.names:  # a pool has a few speakers: each is asked once
        speaks = {s: names_speaker(plan.names, s) for s in {c.speaker for c in candidates}}
        named = {c.id: True for c in candidates if speaks[c.speaker]}
    columns = signal_columns(candidates, previous, plan, base, date_hit=dated, speaker_hit=named,
                             wanted={n for n, weight in fusion.items() if weight}, places=places)
    table = {n: weight for n, weight in fusion.items() if weight and n != SESSION_SHARE}
    scores = dict.fromkeys((c.id for c in candidates), 0.0)
    for name, column in columns.items():
        weight = table[name]
        for i, value in column.items():
            scores[i] += weight * value
    if w.recency_boost:
        for c in candidates:
            scores[c.id] += w.recency_boost * recency_score(c.timestamp, now, w.recency_half_life_days)
    share_weight = fusion.get(SESSION_SHARE, 0.0)
    shares: dict[str, float] = {}
    if share_weight:
        sessions = {c.id: c.session_id for c in candidates}
        shares = session_shares(scores, sessions, w.session_top)
        for c in candidates:
            scores[c.id] += share_weight * shares.get(c.session_id, 0.0)
    ordered = best_first(scores)
    by_id = {c.id: c for c in candidates}
    shown = len(ordered) if explain is None else explain
    return [Scored(i, scores[i], explained(by_id[i], {name: col[i] for name, col in columns.items() if i in col},
                                           table, w, now=now, share=shares.get(by_id[i].session_id, 0.0),
                                           share_weight=share_weight) if n < shown else {})
            for n, i in enumerate(ordered)]


def explained(c: Candidate, values: Mapping[str, float], table: Mapping[str, float], w: TurnWeights, *,
              now: float, share: float, share_weight: float) -> dict[str, dict[str, float]]:
    """A candidate's explanation: its raw cosine and BM25 with their ranks, and each signal's
    value and contribution (the session share's, and recency's when asked)."""
    p: dict[str, dict[str, float]] = {}
    if c.similarity is not None:
        p["vector"] = {"rank": float(c.vector_rank or 0), "value": c.similarity}
    if c.bm25 is not None:
        p["keyword"] = {"rank": float(c.keyword_rank or 0), "value": c.bm25}
    for name, value in values.items():
        p[name] = {"rank": 0.0, "value": value, "contribution": table[name] * value}
    if w.recency_boost:
        r = recency_score(c.timestamp, now, w.recency_half_life_days)
        p["recency"] = {"rank": 0.0, "value": r, "contribution": w.recency_boost * r}
    if share and share_weight:
        p["session"] = {"rank": 0.0, "value": share, "contribution": share_weight * share}
    return p
