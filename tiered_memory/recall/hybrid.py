"""The one hybrid-search helper the layers share (facts, episodes, store items): vector
candidates from the index and keyword candidates from the record store, fused by weighted
reciprocal rank, optionally with recency. Turns have their own, richer scoring
(:mod:`.scoring`); everything else ranks this way.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence, TypeVar

import numpy as np

from ..config import RetrievalConfig
from ..guard import vector_errors_typed
from ..vector.base import VectorIndex
from .query import query_terms
from .scoring import Fused, recency_score, rrf_fuse

KeywordSearch = Callable[[list[str], int], list[tuple[str, float]]]
F = TypeVar("F", bound=Callable[..., object])

#: the VectorIndexError of a recall whose vector query the engine failed
SEARCH_FAILED = ("a search failed in the vector engine ({error}); nothing was changed: retry it, and should the "
                 "engine keep failing, see to it (rebuild_index() restores the index from the records)")


def typed_search(read: F) -> F:
    """``read``, which reads the vector index alone, with the engine's error (whatever a custom
    index raises) as a VectorIndexError (:data:`SEARCH_FAILED`, the cause kept)."""
    return vector_errors_typed(SEARCH_FAILED)(read)


def candidates(index: VectorIndex, vector: np.ndarray, keyword_search: KeywordSearch, query: str, *,
               user_id: str, layer: str, n: int, prefix: str = "") -> tuple[list[tuple[str, float]],
                                                                          list[tuple[str, float]]]:
    """(vector hits, keyword hits), each best first as ``(id, score)``; the index's ids lose
    ``prefix`` (``"fact:"``) so both lists speak the record store's ids."""
    with vector_errors_typed(SEARCH_FAILED):
        vec = [(i.removeprefix(prefix), s) for i, s in
               index.query(vector[None, :], user_id=user_id, k=n, layers=[layer])[0]]
    terms = query_terms(query)
    return vec, keyword_search(terms, n) if terms else []


def fuse(vec: Sequence[tuple[str, float]], kw: Sequence[tuple[str, float]], retrieval: RetrievalConfig, *,
         keep: Callable[[str], bool] = lambda _: True, updated: Mapping[str, float] | None = None,
         now: float = 0.0) -> list[Fused]:
    """Reciprocal-rank fusion of the hits ``keep`` accepts; with ``updated`` (id -> time of
    the last change) recency is a third signal."""
    rankings = {"vector": [i for i, _ in vec if keep(i)], "keyword": [i for i, _ in kw if keep(i)]}
    weights = {"vector": retrieval.vector_weight, "keyword": retrieval.keyword_weight}
    extras = {"vector": dict(vec), "keyword": dict(kw)}
    if updated is not None:
        rankings["recency"] = sorted(updated, key=lambda i: -updated[i])
        weights["recency"] = retrieval.recency_weight
        extras["recency"] = {i: recency_score(t, now, retrieval.recency_half_life_days) for i, t in updated.items()}
    return rrf_fuse(rankings, weights, k=retrieval.rrf_k, extras=extras)
