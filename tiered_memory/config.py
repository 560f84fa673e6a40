"""Configuration objects. Frozen; build new ones with ``dataclasses.replace``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class BufferConfig:
    """The per-session buffer of recent turns."""

    max_messages: int = 20
    max_tokens: int = 2000


@dataclass(frozen=True, kw_only=True)
class RetrievalConfig:
    """How hybrid recall fuses its signals (reciprocal-rank fusion with weights)."""

    vector_weight: float = 1.0
    keyword_weight: float = 1.0
    recency_weight: float = 0.2
    rrf_k: int = 60
    candidates: int = 50
    recency_half_life_days: float = 30.0
    neighbor_weight: float = 0.0


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """Token budget of :meth:`TieredMemory.build_context`.

    ``shares`` splits the memory budget (what is left after the recent buffer)
    between sections; unused share flows to the next section by priority.
    """

    max_tokens: int = 3000
    buffer_share: float = 0.4
    shares: dict[str, float] = field(
        default_factory=lambda: {"session": 0.3, "facts": 0.4, "episodes": 0.3}
    )


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Everything tunable about a :class:`TieredMemory`."""

    buffer: BufferConfig = field(default_factory=BufferConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    dedup_threshold: float = 0.95
    max_content_chars: int = 200_000
    max_metadata_bytes: int = 64_000
    embed_batch_size: int = 64
