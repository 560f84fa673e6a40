"""The signals round two of the learned fusion tried on top of ``recall.fusion.SIGNALS``
(issue 20; none was kept, see bench/README.md), computed from a raw pool of
``bench/fusion_pools.py``. Pure; the core does not compute them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from tiered_memory.recall.coverage import coverage, stems, term_weights
from tiered_memory.recall.query import question_share

EXTRA = (
    "exchange_text_terms",  # query-term coverage (pool idf) of previous + turn + next as one text
    "neighbour_terms",   # the better coverage of the turn before and the turn after
    "previous_terms",    # the coverage of the turn before
    "next_terms",        # the coverage of the turn after
    "terms_share",       # the unweighted share of the query's terms in the turn
    "session_rank",      # 1 / log2(1 + the turn's rank by base score within its session's candidates)
    "best_distance",     # 1 / (1 + turns between it and its session's best candidate)
    "similarity_gap",    # its cosine minus its session's best cosine
    "names_turn",        # the share of the query's names its text mentions (any case)
    "names_session",     # the share its session's candidates mention
    "session_top3",      # its session's three best base scores summed / the best such sum
    "session_size",      # its session's candidates / the most any session has
    "next_question",     # the question share of the turn after it
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def extra_columns(candidates: Sequence[Any], seq: Sequence[int], previous: Mapping[str, str], plan: Any,
                  base: Mapping[str, float], similarity: np.ndarray) -> np.ndarray:
    """Rows in ``candidates`` order, columns :data:`EXTRA`; ``similarity`` is the pool's
    cosine column (the lowest for a turn found otherwise), ``seq`` each turn's session position."""
    n = len(candidates)
    out = np.zeros((n, len(EXTRA)))
    col = {name: j for j, name in enumerate(EXTRA)}
    pos = {c.id: k for k, c in enumerate(candidates)}
    before = {pos[i]: pos[p] for i, p in previous.items() if i in pos and p in pos}
    after = {p: i for i, p in before.items()}
    own = [stems(c.text) for c in candidates]
    weights = term_weights(plan.terms, [c.text for c in candidates])
    plain = dict.fromkeys(weights, 1.0)
    empty: frozenset[str] = frozenset()
    for k in range(n):
        prev, nxt = before.get(k), after.get(k)
        if weights:
            out[k, col["exchange_text_terms"]] = coverage(
                own[k] | (own[prev] if prev is not None else empty) | (own[nxt] if nxt is not None else empty),
                weights)
            near = [coverage(own[j], weights) for j in (prev, nxt) if j is not None]
            out[k, col["neighbour_terms"]] = max(near, default=0.0)
            out[k, col["previous_terms"]] = coverage(own[prev], weights) if prev is not None else 0.0
            out[k, col["next_terms"]] = coverage(own[nxt], weights) if nxt is not None else 0.0
            out[k, col["terms_share"]] = coverage(own[k], plain)
        if nxt is not None:
            out[k, col["next_question"]] = question_share(candidates[nxt].text)
    sessions: dict[str, list[int]] = {}
    for k in sorted(range(n), key=lambda k: (-base[candidates[k].id], candidates[k].id)):
        sessions.setdefault(candidates[k].session_id, []).append(k)
    top3 = {s: sum(max(0.0, base[candidates[k].id]) for k in ks[:3]) for s, ks in sessions.items()}
    peak3 = max(top3.values(), default=0.0)
    most = max((len(ks) for ks in sessions.values()), default=1)
    lowered = {name.lower() for name in plan.names}
    words = [{w.lower() for w in _WORD.findall(c.text)} for c in candidates] if lowered else []
    for s, ks in sessions.items():
        best_sim = max(similarity[k] for k in ks)
        named = set().union(*(lowered & words[k] for k in ks)) if lowered else set()
        for r, k in enumerate(ks):
            out[k, col["session_rank"]] = 1.0 / math.log2(2 + r)
            out[k, col["best_distance"]] = 1.0 / (1.0 + abs(seq[k] - seq[ks[0]]))
            out[k, col["similarity_gap"]] = similarity[k] - best_sim
            out[k, col["session_top3"]] = top3[s] / peak3 if peak3 > 0 else 0.0
            out[k, col["session_size"]] = len(ks) / most
            if lowered:
                out[k, col["names_turn"]] = len(lowered & words[k]) / len(lowered)
                out[k, col["names_session"]] = len(named) / len(lowered)
    return out
