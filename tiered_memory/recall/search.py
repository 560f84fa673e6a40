"""Turn recall: fetch candidates (I/O here), score them (pure, in scoring.py).

One query embedding, one vector query, one keyword query, one record fetch, and the neighbours of
the best few candidates (the turn either side; the turns within ``neighbor_wide_window`` for the
very best); everything else is arithmetic. When the index scans the user's vectors in memory, the
keyword query runs in a worker thread meanwhile, and reads its matches' records there (both let go
of the GIL), so the search waits for the longer of the two. The index's errors are VectorIndexErrors.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, fields
from itertools import islice
from operator import attrgetter
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np

from ..aio import thread_pool
from ..config import RetrievalConfig
from ..embedding import Embedder, embed_query
from ..errors import ConfigurationError
from ..guard import vector_errors_typed
from .chunking import CHUNK_LAYER, best_chunks, best_span_by_terms, chunk_spans
from .fusion import LEARNED, TOPIC_WINDOW, WINDOW_SIGNALS, check_weights, score_learned
from .hybrid import SEARCH_FAILED, typed_search
from .query import QueryPlan, is_reaction, plan_query
from .scoring import (Candidate, Scored, TurnWeights, base_scores, best_first, matches_filters, previous_turns,
                      score_turns, speaker_of)
from .spread import DEPTH, check_spread, spread_sessions, spread_slots
from ..store.base import CandidateSource, DuplicateScope, FilterSource, LongMessageSource, PositionSource, RecordStore
from ..types import MemoryHit, StoredMessage
from ..validation import MAX_COUNT
from ..vector.base import ExactScope, VectorIndex


def turn_weights(config: RetrievalConfig) -> TurnWeights:
    """The scoring weights, read from the config fields of the same names; ``fusion`` is the
    learned table (``config.fusion_weights``, else :data:`.fusion.LEARNED`) unless
    ``config.turn_fusion`` is ``"hand"``. A bad choice, table or spread raises ConfigurationError
    (pool sizes and flags, like every number and flag of a config, are checked when the memory
    opens: :func:`~tiered_memory.config.config_problems`)."""
    check_spread(config)
    if config.turn_fusion not in ("learned", "hand"):
        raise ConfigurationError(f"RetrievalConfig.turn_fusion must be 'learned' or 'hand', got {config.turn_fusion!r}")
    fusion = None
    if config.turn_fusion == "learned":
        table = LEARNED if config.fusion_weights is None else config.fusion_weights
        if not isinstance(table, Mapping):
            raise ConfigurationError("RetrievalConfig.fusion_weights must be a dict of signal name -> weight, "
                                     f"got {type(table).__name__}")
        fusion = dict(table)
        check_weights(fusion)
    values: dict[str, Any] = {f.name: getattr(config, f.name) for f in fields(TurnWeights) if f.name != "fusion"}
    return TurnWeights(**values, fusion=fusion)


FILTER_SCOPE_MAX = 50_000  # more matching ids than this: filter the best candidates instead
# keyword queries that run while the caller scans the user's vectors held in memory
# (RetrievalConfig.keyword_beside_from)
beside_pool = thread_pool(4, "tiered-memory-search")


Matches = tuple[dict[str, StoredMessage], list[tuple[str, float]]]  # records, and (id, score) best first


def keyword_matches(store: RecordStore, user_id: str, terms: Sequence[str], *, k: int,
                    session_id: str | None) -> Matches:
    """The best ``k`` keyword matches and their records: what a search runs beside its vector
    scan. The scan mostly takes longer, so the records read here are mostly read while the
    search would wait anyway."""
    kw = store.keyword_search(user_id, terms, k=k, session_id=session_id)
    return store.get_by_ids(user_id, [i for i, _ in kw]), kw


def fetch_candidates(store: RecordStore, user_id: str, ids: list[str], terms: Sequence[str], *, k: int,
                     session_id: str | None, keyword: Future[Matches] | None = None) -> Matches:
    """The records of ``ids`` and of the best ``k`` keyword matches, and those matches: in one
    store call when the store offers :class:`~tiered_memory.store.base.CandidateSource`, or
    from ``keyword`` (:func:`keyword_matches` already running beside the caller) and the
    records it lacks. (The order of the records is the store's: scoring does not read it.)"""
    if keyword is not None:
        found, kw = keyword.result()
        return {**found, **store.get_by_ids(user_id, [i for i in ids if i not in found])}, kw
    if isinstance(store, CandidateSource):
        return store.candidates(user_id, ids, terms, k=k, session_id=session_id)
    kw = store.keyword_search(user_id, terms, k=k, session_id=session_id) if terms else []
    return store.get_by_ids(user_id, ids + [i for i, _ in kw]), kw


@typed_search
def vector_hits(index: VectorIndex, qv: np.ndarray, *, user_id: str, n: int, chunks: int, session_id: str | None,
                among: Sequence[str] | None, exact: bool) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """The best ``n`` turns and the best ``chunks`` chunks of long messages by cosine: from one
    scan when the index holds the user's vectors in memory (one product for both layers, not two
    at a big user's size), else a query per layer."""
    if chunks and exact and among is None and isinstance(index, ExactScope):
        held = index.query_held(qv, user_id=user_id, ks={"turn": n, CHUNK_LAYER: chunks}, session_id=session_id)
        if held is not None:
            return held["turn"], held[CHUNK_LAYER]
    vec = index.query(qv[None, :], user_id=user_id, k=n, layers=["turn"], session_id=session_id, among=among)[0]
    parts = index.query(qv[None, :], user_id=user_id, k=chunks, layers=[CHUNK_LAYER],
                        session_id=session_id)[0] if chunks else []
    return vec, parts


def merge_parts(vec: Sequence[tuple[str, float]], parts: Mapping[str, tuple[int, float]]
                ) -> list[tuple[str, float]]:
    """Whole-message vector hits with each message's best chunk: a message's similarity is
    the better of the two; best first (ties by id)."""
    best = dict(vec)
    for message, (_, sim) in parts.items():
        if sim > best.get(message, float("-inf")):
            best[message] = sim
    return sorted(best.items(), key=lambda p: (-p[1], p[0]))


def matching_part(text: str, chunk: tuple[int, float] | None, terms: Sequence[str]) -> dict[str, Any] | None:
    """Where in a long message the match is: the chunk whose vector matched, else the chunk
    holding most query terms; ``{"index", "count", "start", "end", "text"}``, or None for a
    message that is not chunked."""
    spans = chunk_spans(text)
    if not spans:
        return None
    n = chunk[0] if chunk is not None and chunk[0] < len(spans) else best_span_by_terms(text, terms)
    if n is None:
        n = 0
    start, end = spans[n]
    return {"index": n, "count": len(spans), "start": start, "end": end, "text": text[start:end]}


def stand_ins(duplicates: Mapping[str, tuple[str, bool]], *, matching: Collection[str] | None,
              apart_out: bool) -> dict[str, str]:
    """The duplicates a search finds by their original's vector (pure): id -> original id, of
    ``duplicates`` (id -> (original, whether it lies in another session)). A duplicate has no
    vector of its own, so its original's stands for it; where the original is out of scope (not
    among the ``matching`` ids of a filter; in another session, when ``apart_out``: a search of
    one session, or of sessions) the duplicate in scope stands for the original instead.

    Example:
        >>> stand_ins({"d1": ("o1", True), "d2": ("o2", False)}, matching=None, apart_out=True)
        {'d1': 'o1'}
        >>> stand_ins({"d1": ("o1", True), "d2": ("o2", False)}, matching={"d2"}, apart_out=False)
        {'d2': 'o2'}
    """
    return {d: o for d, (o, apart) in duplicates.items()
            if (matching is None or d in matching) and ((apart and apart_out) or (matching is not None
                                                                                   and o not in matching))}


def with_stand_ins(vec: list[tuple[str, float]], stand: Mapping[str, str], sims: Mapping[str, float],
                   n: int) -> list[tuple[str, float]]:
    """``vec`` (the scoped vector hits, ``n`` asked for) with the duplicates of ``stand``
    (:func:`stand_ins`) whose original has a cosine in ``sims`` (the best originals), each at
    its original's, best first (at most ``n``, or as many as ``vec``, as if each had its own
    vector); the originals themselves are not added (pure).

    Example:
        >>> with_stand_ins([("a", 0.5)], {"d1": "o1", "d2": "o2"}, {"o1": 0.9}, 10)
        [('d1', 0.9), ('a', 0.5)]
    """
    extra = [(d, sims[o]) for d, o in stand.items() if o in sims]
    return sorted([*vec, *extra], key=lambda p: (-p[1], p[0]))[: max(n, len(vec))] if extra else vec


def in_scope_duplicates(store: DuplicateScope, index: VectorIndex, qv: np.ndarray, user_id: str, *,
                        vec: list[tuple[str, float]], turns: Sequence[tuple[str, float]], n: int,
                        session_id: str | None, matched: Collection[str] | None, by_session: bool,
                        filters: Mapping[str, Any] | None) -> list[tuple[str, float]]:
    """``vec`` with the duplicates in scope standing for their originals out of it (:func:`stand_ins`).
    A search of every session ranked the user's whole turns (``turns``, the vector hits), so it reads
    the duplicates of those alone, at their cosines (thousands of "thanks" cost nothing until found);
    a session or a filter reads the duplicates in it (under ``filters`` when the ``matched`` ids hold
    every match: the store's SQL of them takes no fewer), and queries their originals' vectors."""
    if session_id is None and matched is None:
        found = dict(turns)
        stand = stand_ins(store.duplicates(user_id, originals=sorted(found)), matching=None, apart_out=True)
        return with_stand_ins(vec, stand, found, n)
    stand = stand_ins(store.duplicates(user_id, session_id, filters=None if matched is None else filters),
                      matching=matched, apart_out=session_id is not None or by_session)
    originals = sorted(set(stand.values()))
    if not originals:
        return vec
    sims = dict(vector_hits(index, qv, user_id=user_id, n=min(len(originals), n), chunks=0, session_id=None,
                            among=originals, exact=False)[0])
    return with_stand_ins(vec, stand, sims, n)


@dataclass(frozen=True, kw_only=True)
class Pool:
    """What a turn search fetched for one query: the candidates to score, their records,
    the turn before each (where known), the query's plan, and each long message's best
    chunk hit."""

    candidates: list[Candidate]
    records: dict[str, StoredMessage]
    previous: dict[str, str]
    plan: QueryPlan
    chunk_hit: dict[str, tuple[int, float]]
    places: dict[str, int]  # each record's place in its session (:func:`session_positions`), when the table reads it


def gather_pool(
    *, store: RecordStore, index: VectorIndex, embedder: Embedder, config: RetrievalConfig,
    query: str, user_id: str, k: int,
    session_id: str | None = None,
    filters: Mapping[str, Any] | None = None,
    vector: np.ndarray | None = None,
    weights: TurnWeights | None = None,
    by_session: bool = False,
) -> Pool | None:
    """The candidate pool of a turn search (the I/O of :func:`search_turns`); None when a
    filter matches nothing. ``weights``: :func:`turn_weights` of ``config``, when the caller
    has it. ``by_session``: for a search of sessions, where a duplicate in another session than
    its original stands for its own session (:func:`stand_ins`). Reads only: one scope query, one
    candidate fetch, two neighbour fetches (and, in a scoped search of a store with duplicates,
    one query of the duplicates found or in scope, and for a session or a filter one of their
    originals' vectors: :func:`in_scope_duplicates`)."""
    # at most MAX_COUNT: a session search asks for k x turns, each up to it, and a store's LIMIT is 64 bits
    n = min(MAX_COUNT, max(config.candidates, k * (4 if filters else 2)))
    plan = plan_query(query)
    weights = turn_weights(config) if weights is None else weights
    qv = embed_query(embedder, query) if vector is None else vector
    among = matched = None
    if filters and isinstance(store, FilterSource):
        # the store finds every match, so the vector query ranks matches only: a match far down
        # the user's whole ranking is still found
        matching = store.filtered_ids(user_id, filters, session_id=session_id, limit=FILTER_SCOPE_MAX + 1)
        if not matching:
            return None
        matched = set(matching) if len(matching) <= FILTER_SCOPE_MAX else None
        among = None if matched is None else sorted(matched)
    scans = index if isinstance(index, ExactScope) else None
    with vector_errors_typed(SEARCH_FAILED):  # the index's answers, typed as its queries are
        exact = scans is not None and scans.scans_exactly(user_id)
        held = scans.held_rows(user_id) if scans is not None and exact and plan.terms else 0
    if among is None and config.id_scope_max and not exact and not getattr(index, "cheap_user_filter", False):
        # a list of the user's ids is much cheaper for the index than its filter (not for pgvector's
        # user column; an exact scan of the user needs neither)
        scope = store.indexed_ids(user_id, session_id)
        among = sorted(scope) if len(scope) <= config.id_scope_max else None
    # long messages are also indexed by their chunks: a message scores as its best part
    chunks = config.chunk_candidates if config.chunk_candidates and (
        not isinstance(store, LongMessageSource) or store.has_long_messages(user_id)) else 0
    keyword = None
    if exact and plan.terms and held >= config.keyword_beside_from:
        # the scan is in this process and long: the keyword query runs beside it
        keyword = beside_pool().submit(keyword_matches, store, user_id, plan.terms, k=n, session_id=session_id)
    vec, parts = vector_hits(index, qv, user_id=user_id, n=n, chunks=chunks, session_id=session_id, among=among,
                             exact=exact)
    chunk_hit: dict[str, tuple[int, float]] = {}
    turns = vec
    if chunks:
        chunk_hit = best_chunks(parts)
        vec = merge_parts(vec, chunk_hit)
    if (session_id is not None or by_session or matched is not None) and isinstance(store, DuplicateScope):
        vec = in_scope_duplicates(store, index, qv, user_id, vec=vec, turns=turns, n=n, session_id=session_id,
                                  matched=matched, by_session=by_session, filters=filters)
    records, kw = fetch_candidates(store, user_id, [i for i, _ in vec], plan.terms, k=n, session_id=session_id,
                                   keyword=keyword)
    # the record store is the authority: anything it does not hold for this user is ignored
    sims = {i: s for i, s in vec if i in records}
    bm25 = {i: s for i, s in kw if i in records}
    vrank = {i: r for r, i in enumerate(sims, start=1)}
    krank = {i: r for r, i in enumerate(bm25, start=1)}

    def candidate(r: Any) -> Candidate:
        return Candidate(id=r.id, session_id=r.session_id, timestamp=r.timestamp, text=r.content,
                         speaker=speaker_of(r.content, r.metadata), similarity=sims.get(r.id),
                         bm25=bm25.get(r.id), vector_rank=vrank.get(r.id), keyword_rank=krank.get(r.id))

    pool = [candidate(r) for r in records.values()]
    neighbors: dict[str, list[Any]] = {}
    if (config.neighbor_weight or config.reply_weight) and config.neighbor_expand and records:
        # the turns around the best candidates join the pool: a reply is found by its question
        base = base_scores(pool, plan, weights)
        best = best_first(base)[: config.neighbor_expand]
        wide = best[: config.neighbor_wide] if config.neighbor_wide_window > 1 else []
        neighbors = store.neighbors(user_id, best[len(wide):], 1)
        if wide:  # the very best bring more of their topic: in a big store the pool misses it
            neighbors.update(store.neighbors(user_id, wide, config.neighbor_wide_window))
        for around in neighbors.values():
            for m in around:
                if m.id not in records and (session_id is None or m.session_id == session_id):
                    records[m.id] = m
                    pool.append(candidate(m))
    places = session_positions(store, user_id, records, TOPIC_WINDOW + 1) \
        if weights.fusion is not None and any(weights.fusion.get(n) for n in WINDOW_SIGNALS) else {}
    return Pool(candidates=pool, records=records, previous=previous_turns(records, neighbors), plan=plan,
                chunk_hit=chunk_hit, places=places)


def session_positions(store: RecordStore, user_id: str, records: Mapping[str, StoredMessage],
                      cap: int) -> dict[str, int]:
    """Each record's place in its session, counted from the session's first record here: the
    turns between two records as the store counts them (:class:`PositionSource`), else their
    ``seq`` difference (which then counts other sessions' writes too). A gap over ``cap``
    counts as ``cap``: places then still tell whether two turns lie within ``cap - 1`` of each
    other, and a long session costs no more to place than a short one."""
    by_session: dict[str, list[StoredMessage]] = {}
    for r in records.values():
        by_session.setdefault(r.session_id, []).append(r)
    pairs: list[tuple[str, int, int]] = []
    for rows in by_session.values():
        rows.sort(key=attrgetter("seq"))
        pairs.extend((a.session_id, a.seq, b.seq) for a, b in zip(rows, rows[1:]))
    apart = [p for p in pairs if p[2] - p[1] > 1]  # adjacent seqs have nothing between them
    counted = dict(zip(apart, store.session_gaps(user_id, apart))) if isinstance(store, PositionSource) else {}
    out: dict[str, int] = {}
    for rows in by_session.values():
        place = 0
        out[rows[0].id] = place
        for a, b in zip(rows, rows[1:]):
            gap = b.seq - a.seq
            if gap > 1:
                gap = counted.get((a.session_id, a.seq, b.seq), gap)
            place += min(cap, gap)
            out[b.id] = place
    return out


def ranked_hits(pool: Pool, weights: TurnWeights, *, filters: Mapping[str, Any] | None, now: float,
                explain: int | None, reactions_last: bool = False) -> Iterator[MemoryHit]:
    """The pool's turns as hits, best first, those ``filters`` rejects left out; the best
    ``explain`` candidates (None: all) carry their signals. ``reactions_last``: a turn that only
    reacts (:func:`~.query.is_reaction`) comes after every other, in score order among them:
    it sits beside what it reacts to, so it shares its signals, but answers nothing."""
    records, chunk_hit, plan = pool.records, pool.chunk_hit, pool.plan
    if weights.fusion is not None:
        scored = score_learned(pool.candidates, pool.previous, plan, weights, weights.fusion, now=now,
                               explain=explain, places=pool.places)
    else:
        scored = score_turns(pool.candidates, pool.previous, plan, weights, now=now)

    def hit(f: Scored) -> MemoryHit | None:
        r = records[f.id]
        if not matches_filters(r.metadata, r.role, r.timestamp, filters):
            return None
        explanation: dict[str, Any] = {"method": "hybrid turn scoring (cosine + BM25 + neighbour, name, "
                                                 "date and session signals)", "signals": f.parts}
        part = matching_part(r.content, chunk_hit.get(r.id), plan.terms)
        if part is not None:
            explanation["part"] = part
        return MemoryHit(id=r.id, text=r.content, score=f.score, layer="turn", session_id=r.session_id,
                         timestamp=r.timestamp, metadata=r.metadata, role=r.role, explanation=explanation)

    later: list[Scored] = []
    for f in scored:
        if reactions_last and is_reaction(records[f.id].content):
            later.append(f)
        elif (h := hit(f)) is not None:
            yield h
    for f in later:
        if (h := hit(f)) is not None:
            yield h


def search_turns(
    *,
    store: RecordStore,
    index: VectorIndex,
    embedder: Embedder,
    config: RetrievalConfig,
    query: str,
    user_id: str,
    k: int,
    session_id: str | None = None,
    filters: Mapping[str, Any] | None = None,
    now: float | None = None,
    vector: np.ndarray | None = None,
) -> list[MemoryHit]:
    """The best ``k`` turns of ``user_id`` for ``query`` (``vector`` is its embedding when the
    caller has it); for a question that asks for several things, the last of them are the best
    turns of sessions not yet among the hits (:mod:`.spread`, ``explanation["spread"]``).
    Reads only: one scope query, one candidate fetch, two neighbour fetches."""
    now = time.time() if now is None else now
    weights = turn_weights(config)  # once a search: it checks the learned table too
    got = gather_pool(store=store, index=index, embedder=embedder, config=config, query=query, user_id=user_id,
                      k=k, session_id=session_id, filters=filters, vector=vector, weights=weights)
    if got is None:
        return []
    slots = spread_slots(config, k, got.plan.listing)
    depth = DEPTH * k if slots else k  # the hits a spread picks from
    # explained: the ones that may be returned, unless a filter may pass over some of the best
    # (reactions put last may bring up some beyond the first depth by score)
    explain = None if filters else 2 * depth if config.reactions_last else depth
    hits = list(islice(ranked_hits(got, weights, filters=filters, now=now, explain=explain,
                                   reactions_last=config.reactions_last), depth))
    if slots:
        picked = spread_sessions([h.session_id for h in hits], k, slots)
        for place, i in enumerate(picked):
            if place >= k - slots and i >= k:
                hits[i].explanation["spread"] = "the best turn of a session not yet among the hits"
        hits = [hits[i] for i in picked]
    return hits
