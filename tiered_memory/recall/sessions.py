"""Session recall: which past sessions of a user hold what a query asks about.

A session scores as its best turn under the turn ranking of :mod:`.search` (the same pool,
signals and table), so sessions come in the order their best turns do. Ranked this way, ten
sessions hold more of the sessions a question's evidence lies in than the sessions of the
ten best turns do (LoCoMo dev: 0.935 against 0.882; bench/README.md, "session search"):
the best turns of one well-matching session crowd out the other sessions a question spans.
Scoring a session by its whole text, or by its best turns together, did no better there
than its best turn (the same section). Reads only, as a turn search.
"""

from __future__ import annotations

import time
from typing import Any, Hashable, Iterable, Iterator, Mapping

import numpy as np

from ..config import RetrievalConfig
from ..embedding import Embedder
from ..store.base import RecordStore
from ..types import MemoryHit, SessionHit
from ..vector.base import VectorIndex
from .search import gather_pool, ranked_hits, turn_weights


def group_by_session(sessions: Iterable[Hashable], k: int, per_session: int) -> list[list[int]]:
    """Positions into ``sessions`` (the session of each ranked hit, best first), grouped by
    session: the first ``k`` sessions in the order of their best hit, each with the positions
    of its first ``per_session`` hits. Pure.

    Example:
        >>> group_by_session(["a", "a", "b", "a", "c"], 2, 2)
        [[0, 1], [2]]
    """
    groups: dict[Hashable, list[int]] = {}
    for i, s in enumerate(sessions):
        if s not in groups:
            if len(groups) == k:
                if all(len(g) >= per_session for g in groups.values()):
                    break
                continue
            groups[s] = []
        if len(groups[s]) < per_session:
            groups[s].append(i)
    return list(groups.values())


def search_sessions(
    *,
    store: RecordStore,
    index: VectorIndex,
    embedder: Embedder,
    config: RetrievalConfig,
    query: str,
    user_id: str,
    k: int,
    per_session: int,
    filters: Mapping[str, Any] | None = None,
    now: float | None = None,
    vector: np.ndarray | None = None,
) -> list[SessionHit]:
    """The ``k`` sessions of ``user_id`` whose best turn ranks highest for ``query``, each with
    its best ``per_session`` turns (turns ``filters`` rejects left out). Sessions with no turn
    among the pool of a turn search (``RetrievalConfig.candidates``) are not ranked. ``vector``:
    the query's embedding, when the caller has it."""
    now = time.time() if now is None else now
    weights = turn_weights(config)
    pool = gather_pool(store=store, index=index, embedder=embedder, config=config, query=query,
                       user_id=user_id, k=k * per_session, filters=filters, weights=weights,
                       vector=vector, by_session=True)
    if pool is None:
        return []
    hits: list[MemoryHit] = []

    def sessions() -> Iterator[str | None]:  # hits made only as far as the grouping reads
        for h in ranked_hits(pool, weights, filters=filters, now=now, explain=None,
                             reactions_last=config.reactions_last):
            hits.append(h)
            yield h.session_id
    return [SessionHit(session_id=str(hits[g[0]].session_id), score=hits[g[0]].score, hits=[hits[i] for i in g])
            for g in group_by_session(sessions(), k, per_session)]
