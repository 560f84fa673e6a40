"""Hybrid recall over stored turns: fetch candidates (I/O), fuse them (pure, retrieval.py)."""

from __future__ import annotations

import time
from typing import Any, Mapping

from .config import RetrievalConfig
from .embedding import Embedder, embed_query
from .retrieval import fts_query, matches_filters, recency_score, rrf_fuse
from .store.base import RecordStore
from .types import MemoryHit
from .vector.base import VectorIndex


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
) -> list[MemoryHit]:
    now = time.time() if now is None else now
    n = max(config.candidates, k * (4 if filters else 2))
    qv = embed_query(embedder, query)
    vec = index.query(qv[None, :], user_id=user_id, k=n, layers=["turn"], session_id=session_id)[0]
    match = fts_query(query)
    kw = store.keyword_search(user_id, match, k=n, session_id=session_id) if match else []
    records = store.get_by_ids(user_id, [i for i, _ in vec] + [i for i, _ in kw])
    # the record store is the authority: anything it does not hold for this user is ignored
    vec = [(i, s) for i, s in vec if i in records]
    kw = [(i, s) for i, s in kw if i in records]
    by_recency = sorted(records, key=lambda i: -records[i].timestamp)
    fused = rrf_fuse(
        {"vector": [i for i, _ in vec], "keyword": [i for i, _ in kw], "recency": by_recency},
        {"vector": config.vector_weight, "keyword": config.keyword_weight,
         "recency": config.recency_weight},
        k=config.rrf_k,
        extras={
            "vector": dict(vec),
            "keyword": dict(kw),
            "recency": {i: recency_score(r.timestamp, now, config.recency_half_life_days)
                        for i, r in records.items()},
        },
    )
    hits: list[MemoryHit] = []
    for f in fused:
        r = records[f.id]
        if not matches_filters(r.metadata, r.role, r.timestamp, filters):
            continue
        hits.append(MemoryHit(
            id=r.id, text=r.content, score=f.score, layer="turn", session_id=r.session_id,
            timestamp=r.timestamp, metadata=r.metadata, role=r.role,
            explanation={"method": "weighted reciprocal-rank fusion", "rrf_k": config.rrf_k,
                         "signals": f.parts},
        ))
        if len(hits) == k:
            break
    return hits
