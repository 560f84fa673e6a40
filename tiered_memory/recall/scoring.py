"""Pure retrieval decisions: rank fusion, recency, filters, and the scoring of turn
candidates. Query analysis and keyword query building are in :mod:`.query` (its names
are re-exported here).

Nothing here does I/O; :mod:`.search` fetches candidates and calls these.

The hand-weighted turn score (:func:`score_turns`, ``RetrievalConfig.turn_fusion="hand"``;
the default is the learned table of :mod:`.fusion`, over the same signals and a few more)
adds, per candidate turn:

- the cosine similarity of its vector to the query's, plus the BM25 score of its
  text divided by the best BM25 score of the query (``keyword_score_weight``), plus
  ``date_boost`` if the query names a date and the turn is dated near it: the
  turn's *base* score;
- ``neighbor_weight`` times the base score of the turn before it in its session
  (a reply's meaning often lives in the question it answers), raised by
  ``reply_weight`` times that turn's share of question sentences (a question passes
  most of its match on to its reply);
- minus ``question_penalty`` times its own share of question sentences
  (:func:`~.query.question_share`): a question echoes the words of the query that
  asks about it, but the fact is in the answer;
- ``speaker_boost`` if the query names the turn's speaker;
- ``time_boost`` if the query asks *when* and the turn holds a time expression;
- ``exchange_weight`` times the query terms' coverage by the turn and the one before
  it, and ``session_coverage_weight`` times their coverage by all the session's
  candidates together (:mod:`.coverage`: a session-level keyword key, so a session that
  holds the query's words across several short messages lifts them);
- ``session_best_weight`` times its session's best turn score over the best of all;
- ``session_weight`` times its session's share of the best-scoring turns
  (multi-granularity: a session that answers much of the query lifts its turns);
- ``recency_boost`` times its recency (1.0 now, 0.5 after a half-life).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .coverage import exchange_coverage, session_coverage, term_weights
from .query import QueryPlan, has_time_expression, is_reaction, question_share



def recency_score(timestamp: float, now: float, half_life_days: float) -> float:
    """1.0 for now, 0.5 after one half-life; future timestamps count as now."""
    age_days = max(0.0, now - timestamp) / 86400.0
    return math.pow(0.5, age_days / half_life_days) if half_life_days > 0 else 1.0


@dataclass(frozen=True)
class Fused:
    id: str
    score: float
    parts: dict[str, dict[str, float]] = field(default_factory=dict)


def rrf_fuse(
    rankings: Mapping[str, Sequence[str]],
    weights: Mapping[str, float],
    *,
    k: int = 60,
    extras: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Fused]:
    """Weighted reciprocal-rank fusion: ``score(d) = sum_s w_s / (k + rank_s(d))``.

    ``rankings`` maps a signal name to ids best-first; ``extras`` carries raw
    per-signal values (similarity, bm25) into the explanation. Ties break by id
    so results are deterministic.
    """
    scores: dict[str, float] = {}
    parts: dict[str, dict[str, dict[str, float]]] = {}
    for signal, ids in rankings.items():
        w = weights.get(signal, 0.0)
        if w == 0:
            continue
        for rank, mid in enumerate(ids, start=1):
            contribution = w / (k + rank)
            scores[mid] = scores.get(mid, 0.0) + contribution
            detail = {"rank": float(rank), "contribution": contribution}
            raw = (extras or {}).get(signal, {}).get(mid)
            if raw is not None:
                detail["value"] = raw
            parts.setdefault(mid, {})[signal] = detail
    ordered = sorted(scores, key=lambda m: (-scores[m], m))
    return [Fused(m, scores[m], parts[m]) for m in ordered]


def matches_filters(
    metadata: Mapping[str, object], role: str, timestamp: float, filters: Mapping[str, object] | None
) -> bool:
    """``filters``: metadata key equality, plus ``role``, ``since`` and ``until`` (epoch seconds)."""
    if not filters:
        return True
    for key, want in filters.items():
        if key == "role":
            if role != want:
                return False
        elif key == "since":
            if timestamp < float(want):  # type: ignore[arg-type]
                return False
        elif key == "until":
            if timestamp > float(want):  # type: ignore[arg-type]
                return False
        elif metadata.get(key) != want:
            return False
    return True


# ---- matching a turn against the query ---------------------------------------
_SPEAKER_PREFIX = re.compile(r"^\s*([A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2})\s*:\s")


def speaker_of(content: str, metadata: Mapping[str, Any] | None = None) -> str | None:
    """Who said a turn: ``metadata["speaker"]`` / ``["name"]``, else a leading ``"Name: "``."""
    if metadata:  # most turns carry none
        for key in ("speaker", "name"):
            value = metadata.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
    m = _SPEAKER_PREFIX.match(content)
    return m[1] if m else None


def without_speaker(content: str) -> str:
    """``content`` without a leading ``"Name: "`` (the way chats are often written down)."""
    m = _SPEAKER_PREFIX.match(content)
    return content[m.end():] if m else content


def names_speaker(names: frozenset[str], speaker: str | None) -> bool:
    """Whether a query's ``names`` include ``speaker`` (whole name or any of its words)."""
    if not speaker or not names:
        return False
    return speaker in names or any(part in names for part in speaker.split())


def in_date_ranges(timestamp: float, ranges: Sequence[tuple[float, float]],
                   before_days: float, after_days: float) -> bool:
    """Is ``timestamp`` within a named date, widened by ``before_days`` / ``after_days``?

    Conversations report events after they happen ("last week ..."), so the window
    reaches further after the date than before it.
    """
    return any(start - before_days * 86400 <= timestamp < end + after_days * 86400
               for start, end in ranges)


# ---- turn scoring ------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class Candidate:
    """A turn that recall may return, with what the fetch found about it. Not changed once
    built; not frozen, since a search builds some hundreds and a frozen one costs 3x to build."""

    id: str
    session_id: str
    timestamp: float
    text: str
    speaker: str | None = None
    similarity: float | None = None  # cosine to the query, if a vector candidate
    bm25: float | None = None  # keyword score (higher is better), if a keyword candidate
    vector_rank: int | None = None
    keyword_rank: int | None = None


@dataclass(frozen=True, kw_only=True)
class TurnWeights:
    """The weights of :func:`score_turns` (``RetrievalConfig`` carries the defaults)."""

    keyword_score_weight: float = 0.5
    neighbor_weight: float = 0.3
    reply_weight: float = 0.3
    question_penalty: float = 0.15
    speaker_boost: float = 0.1
    time_boost: float = 0.1
    date_boost: float = 0.2
    date_before_days: float = 7.0
    date_after_days: float = 30.0
    session_weight: float = 0.1
    session_top: int = 20
    session_best_weight: float = 0.0
    exchange_weight: float = 0.0
    session_coverage_weight: float = 0.3
    recency_boost: float = 0.0
    recency_half_life_days: float = 30.0
    length_weight: float = 0.0
    # the learned fusion (:func:`.fusion.score_learned`): signal name -> weight; None: the hand weights
    fusion: Mapping[str, float] | None = None


@dataclass(slots=True)
class Scored:  # one per candidate, so not frozen either (see Candidate)
    id: str
    score: float
    parts: dict[str, dict[str, float]] = field(default_factory=dict)


def base_scores(candidates: Sequence[Candidate], plan: QueryPlan, w: TurnWeights) -> dict[str, float]:
    """Per turn: cosine + weighted max-normalised BM25 + the date boost.

    A turn that was not a vector candidate gets the lowest similarity seen (it ranked
    below all of them), so keyword-only and neighbour turns are not over-rewarded.
    """
    sims = [c.similarity for c in candidates if c.similarity is not None]
    floor = min(sims) if sims else 0.0
    top_bm25 = max((c.bm25 for c in candidates if c.bm25 is not None and c.bm25 > 0), default=0.0)
    out = {}
    for c in candidates:
        s = c.similarity if c.similarity is not None else floor
        if c.bm25 is not None and top_bm25 > 0:
            s += w.keyword_score_weight * max(0.0, c.bm25) / top_bm25
        if plan.dates and in_date_ranges(c.timestamp, plan.dates, w.date_before_days, w.date_after_days):
            s += w.date_boost
        out[c.id] = s
    return out


def best_first(scores: Mapping[str, float]) -> list[str]:
    """The ids of ``scores``, best score first, ties by id: ``sorted(scores, key=lambda i:
    (-scores[i], i))`` in two sorts keyed in C (by id, then stably by score), at less than
    half the cost (a search orders some hundreds of candidates, twice)."""
    return sorted(sorted(scores), key=scores.__getitem__, reverse=True)


def session_shares(scores: Mapping[str, float], sessions: Mapping[str, str], top: int) -> dict[str, float]:
    """Each session's sum of scores among the ``top`` best turns, divided by the best
    session's sum (1.0 for the best session; absent sessions score 0)."""
    best = best_first(scores)[:top]
    sums: dict[str, float] = {}
    for i in best:
        sums[sessions[i]] = sums.get(sessions[i], 0.0) + max(0.0, scores[i])
    peak = max(sums.values(), default=0.0)
    return {s: v / peak for s, v in sums.items()} if peak > 0 else {}


def session_best(scores: Mapping[str, float], sessions: Mapping[str, str]) -> dict[str, float]:
    """Per turn: its session's best turn score over the best score of all (1.0 for the
    best turn's session; 0 for all when no score is positive)."""
    best: dict[str, float] = {}
    for i, s in scores.items():
        best[sessions[i]] = max(best.get(sessions[i], 0.0), s)
    peak = max(best.values(), default=0.0)
    return {i: best[sessions[i]] / peak for i in scores} if peak > 0 else {}


def add_coverage(scores: dict[str, float], parts: dict[str, dict[str, dict[str, float]]],
                 texts: Mapping[str, str], previous: Mapping[str, str], sessions: Mapping[str, str],
                 plan: QueryPlan, w: TurnWeights) -> None:
    """Add the exchange and session keyword coverage (:mod:`.coverage`) to ``scores``."""
    weights = term_weights(plan.terms, list(texts.values()))
    if not weights:
        return
    if w.exchange_weight:
        for i, value in exchange_coverage(texts, previous, weights).items():
            if value:
                scores[i] += w.exchange_weight * value
                parts[i]["exchange"] = {"rank": 0.0, "value": value, "contribution": w.exchange_weight * value}
    if w.session_coverage_weight:
        per_session = session_coverage(texts, sessions, weights)
        for i in scores:
            value = per_session.get(sessions[i], 0.0)
            if value:
                scores[i] += w.session_coverage_weight * value
                parts[i]["session_terms"] = {"rank": 0.0, "value": value,
                                             "contribution": w.session_coverage_weight * value}


def score_turns(
    candidates: Sequence[Candidate], previous: Mapping[str, str], plan: QueryPlan,
    w: TurnWeights, *, now: float,
) -> list[Scored]:
    """Score and order turn candidates, best first (ties by id); see the module docstring.

    ``previous`` maps a turn id to the id of the turn before it in its session, where
    known; a previous turn that is not a candidate contributes nothing. ``w.fusion`` is
    not read here: :func:`.fusion.score_learned` scores by it.
    """
    by_id = {c.id: c for c in candidates}
    base = base_scores(candidates, plan, w)
    lengths = sorted(len(c.text) for c in candidates)
    typical = max(1, lengths[len(lengths) // 2]) if lengths else 1
    scores: dict[str, float] = {}
    parts: dict[str, dict[str, dict[str, float]]] = {}
    for c in candidates:
        p: dict[str, dict[str, float]] = {}
        if c.similarity is not None:
            p["vector"] = {"rank": float(c.vector_rank or 0), "value": c.similarity}
        if c.bm25 is not None:
            p["keyword"] = {"rank": float(c.keyword_rank or 0), "value": c.bm25}
        s = base[c.id]
        prev = previous.get(c.id)
        if prev is not None and prev in base and (w.neighbor_weight or w.reply_weight):
            nw = w.neighbor_weight + w.reply_weight * question_share(by_id[prev].text)
            s += nw * base[prev]
            p["neighbor"] = {"rank": 0.0, "value": base[prev], "contribution": nw * base[prev]}
        if w.question_penalty:
            asked = question_share(c.text)
            if asked:
                s -= w.question_penalty * asked
                p["question"] = {"rank": 0.0, "value": asked, "contribution": -w.question_penalty * asked}
        if w.speaker_boost and names_speaker(plan.names, c.speaker):
            s += w.speaker_boost
            p["speaker"] = {"rank": 0.0, "value": 1.0, "contribution": w.speaker_boost}
        if w.time_boost and plan.temporal and has_time_expression(c.text):
            s += w.time_boost
            p["time"] = {"rank": 0.0, "value": 1.0, "contribution": w.time_boost}
        if w.recency_boost:
            r = recency_score(c.timestamp, now, w.recency_half_life_days)
            s += w.recency_boost * r
            p["recency"] = {"rank": 0.0, "value": r, "contribution": w.recency_boost * r}
        if w.length_weight:
            # a prompt pays for every token: among equals, prefer the shorter turn
            penalty = w.length_weight * math.log(max(1, len(c.text)) / typical)
            s -= penalty
            p["length"] = {"rank": 0.0, "value": float(len(c.text)), "contribution": -penalty}
        scores[c.id] = s
        parts[c.id] = p
    sessions = {i: c.session_id for i, c in by_id.items()}
    if w.exchange_weight or w.session_coverage_weight:
        add_coverage(scores, parts, {i: c.text for i, c in by_id.items()}, previous, sessions, plan, w)
    if w.session_best_weight:
        for i, value in session_best(scores, sessions).items():
            scores[i] += w.session_best_weight * value
            parts[i]["session_best"] = {"rank": 0.0, "value": value, "contribution": w.session_best_weight * value}
    if w.session_weight:
        shares = session_shares(scores, sessions, w.session_top)
        for i, c in by_id.items():
            share = shares.get(c.session_id, 0.0)
            if share:
                scores[i] += w.session_weight * share
                parts[i]["session"] = {"rank": 0.0, "value": share, "contribution": w.session_weight * share}
    return [Scored(i, scores[i], parts[i]) for i in best_first(scores)]


REACTIONS_SKIPPED = 2  # at most this many reactions lie between a turn and the one it follows up


def previous_turns(records: Mapping[str, Any], neighbors: Mapping[str, Sequence[Any]]) -> dict[str, str]:
    """Map turn id -> id of the turn it follows up in its session: the turn before it, or,
    when that one only reacts (:func:`~.query.is_reaction`: "lol", "omg yes") and the turn
    itself does not, the one before the reactions (at most :data:`REACTIONS_SKIPPED`). A
    reply passes on what it answers and a question receives its reply's match, and in real
    chat a reaction often sits between them.

    Adjacency comes from ``neighbors`` (id -> the session's messages around it, in order)
    and, for the rest, from consecutive ``seq`` numbers within a session among ``records``
    (sound: nothing of the session can sit between two consecutive numbers). The map is
    ordered by (session, seq) of its keys, so where a reaction and the reply after it both
    follow up one turn, the reply comes last: inverting the map gives each turn its reply.
    """
    before: dict[str, str] = {}
    turns: dict[str, Any] = dict(records)
    by_key = {(r.session_id, r.seq): r.id for r in records.values()}
    for r in records.values():
        b = by_key.get((r.session_id, r.seq - 1))
        if b is not None:
            before[r.id] = b
    for around in neighbors.values():
        for a, b in zip(around, around[1:]):
            turns.setdefault(a.id, a)
            turns.setdefault(b.id, b)
            if a.session_id == b.session_id:
                before[b.id] = a.id
    prev: dict[str, str] = {}
    for i in sorted(before, key=lambda i: (turns[i].session_id, turns[i].seq)):
        b = before[i]
        if b in before and is_reaction(turns[b].content) and not is_reaction(turns[i].content):
            skipped = before[b]
            for _ in range(REACTIONS_SKIPPED - 1):
                if skipped not in before or not is_reaction(turns[skipped].content):
                    break
                skipped = before[skipped]
            if not is_reaction(turns[skipped].content):
                b = skipped
        prev[i] = b
    return prev
