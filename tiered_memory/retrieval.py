"""Pure retrieval decisions: keyword query building, rank fusion, recency.

Nothing here does I/O; ``recall.py`` fetches candidates and calls these.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    did does ever also get got like really would could should much many""".split()
)


def keywords(text: str) -> list[str]:
    """Lower-cased content words of ``text`` in order, without stopwords or repeats."""
    seen: dict[str, None] = {}
    for tok in _TOKEN.findall(text.lower()):
        if tok not in STOPWORDS and (len(tok) > 1 or tok.isdigit()):
            seen.setdefault(tok, None)
    return list(seen)


def fts_query(text: str) -> str | None:
    """An FTS5 expression OR-ing the quoted keywords of ``text`` (safe against FTS syntax)."""
    words = keywords(text)
    if not words:
        return None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words)


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
