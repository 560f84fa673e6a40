"""Session spread: the last places of a search go to sessions not yet among its hits.

A question that asks for several things told over time (``"What books has Mel read?"``,
:func:`.query.is_listing_question`) is answered across sessions, while the ranking tends
to fill its first ten with turns of the one session that matches best. Pure: the hits'
sessions in rank order in, the positions to return out.
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

from ..config import RetrievalConfig
from ..errors import ConfigurationError

DEPTH = 4  # spread picks are found within the first DEPTH x k ranked hits


def check_spread(config: RetrievalConfig) -> None:
    """``spread`` and ``listing_spread`` are shares of ``k`` in [0, 1]; else ConfigurationError."""
    for name in ("spread", "listing_spread"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0.0 <= value <= 1.0:
            raise ConfigurationError(f"RetrievalConfig.{name} must be a number from 0 to 1, got {value!r}")


def spread_slots(config: RetrievalConfig, k: int, listing: bool) -> int:
    """How many of ``k`` places go to unseen sessions: ``spread`` x k for every query,
    ``listing_spread`` x k (when larger) for a listing question, rounded."""
    share = max(config.spread, config.listing_spread) if listing else config.spread
    return min(k, round(share * k))


def spread_sessions(sessions: Sequence[Hashable], k: int, slots: int) -> list[int]:
    """Positions into ``sessions`` (the session of each hit, best first) to return, in order:
    the first ``k - slots`` as ranked, then the best hit of each session not yet among them,
    in rank order, found within the first :data:`DEPTH` x ``k``; a place still open is filled
    in rank order."""
    chosen = list(range(min(k - slots, len(sessions))))
    seen = {sessions[i] for i in chosen}
    for i in range(len(chosen), min(DEPTH * k, len(sessions))):
        if len(chosen) == k:
            break
        if sessions[i] not in seen:
            chosen.append(i)
            seen.add(sessions[i])
    if len(chosen) < k:
        taken = set(chosen)
        chosen += [i for i in range(len(sessions)) if i not in taken][: k - len(chosen)]
    return chosen
