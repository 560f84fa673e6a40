"""Records the layers pass between them before anything is stored: a fact proposed by
rules or by an LLM, and the content of an episode. Both the extractive fallback and
the LLM paths produce them, so they live apart from either."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class FactCandidate:
    """A fact proposed by rules or by the LLM, before resolution."""

    type: str
    text: str
    confidence: float
    source_ids: tuple[str, ...] = ()
    key: str | None = None  # a slot like "residence" or "pref:sushi": same key, one truth
    polarity: int = 1


@dataclass(frozen=True, kw_only=True)
class EpisodeDraft:
    """The content of an episode, from the LLM or from rules."""

    summary: str
    entities: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    open_questions: list[str] = field(default_factory=list)
    key_facts: list[str] = field(default_factory=list)
