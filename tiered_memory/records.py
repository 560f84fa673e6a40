"""The records of the memory layers: what the layers decide about and the stores keep.

They sit at the foundation, below both ``layers/`` and ``store/``, so a layer repository
can return a :class:`Fact` or an :class:`Episode` without importing a layer, and a layer
can speak in records without knowing how they are stored. Stored records
(:class:`Fact`, :class:`FactChange`, :class:`Episode`, :class:`WorkingItem`,
:class:`SessionPad`, :class:`ArchivedTurn`, :class:`Item`) are frozen dataclasses; so are
the records the layers pass between them before anything is stored
(:class:`FactCandidate`, :class:`EpisodeDraft`). Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The time of a record that has none to tell: a stored time another writer left unreadable (read
# as this, :mod:`.store.stored_values`) or a time a record was made without. Age-based rules
# (consolidation's compress and prune) judge such a record neither old nor new: they leave it.
NO_TIME = 0.0


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


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One fact about a user. ``invalid_at`` is set when a later fact contradicted it.

    ``key`` is the slot the fact fills, found in its words when it is stored (``"residence"``,
    ``"name"``, ``"employer"``, ``"rel:sister"``, ``"diet:vegetarian"``, ``"pref:coffee"``, ...;
    ``None`` for a fact of no slot), and ``polarity`` which way it goes (-1 for a dislike, "User
    dislikes coffee", 1 otherwise). A new fact is resolved against the valid fact of its slot
    (a new value invalidates it); facts of two slots are never merged into one."""

    id: str
    user_id: str
    type: str
    text: str
    confidence: float
    source_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    valid_from: float = 0.0
    invalid_at: float | None = None
    superseded_by: str | None = None
    access_count: int = 0
    last_access: float | None = None
    key: str | None = None
    polarity: int = 1

    @property
    def valid(self) -> bool:
        return self.invalid_at is None


@dataclass(frozen=True, kw_only=True)
class FactChange:
    """One row of the fact history (audit trail)."""

    fact_id: str
    action: str
    old_text: str | None
    new_text: str | None
    at: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One row of the audit log: what consolidation or eviction did to an episode or a
    working-memory item (``summarise``, ``promote``, ``archive``, ``delete_raw``, ``prune``,
    ``evict``), or a ``delete`` of an episode."""

    user_id: str
    layer: str  # one of AUDIT_LAYERS
    item_id: str
    action: str
    at: float
    details: dict[str, Any] = field(default_factory=dict)


AUDIT_LAYERS = ("episode", "working")


@dataclass(frozen=True, kw_only=True)
class Episode:
    """A compressed span of a session. ``metadata["method"]`` is ``"llm"`` or ``"extractive"``."""

    id: str
    user_id: str
    session_id: str
    summary: str
    entities: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    open_questions: list[str] = field(default_factory=list)
    key_facts: list[str] = field(default_factory=list)
    turn_count: int = 0
    start: float = 0.0
    end: float = 0.0
    source_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    access_count: int = 0
    last_access: float | None = None
    promoted_at: float | None = None
    compressed_at: float | None = None

    def key_points(self) -> list[str]:
        """The texts indexed for recall: summary first, then decisions, key facts, questions."""
        return [p for p in dict.fromkeys([self.summary, *self.decisions, *self.key_facts,
                                          *self.open_questions]) if p.strip()]

    def render(self) -> str:
        """Compact text for the "past sessions" context section."""
        parts = [self.summary]
        if self.decisions:
            parts.append("Decisions: " + "; ".join(self.decisions))
        if self.open_questions:
            parts.append("Open: " + "; ".join(self.open_questions))
        return " | ".join(parts)


@dataclass(frozen=True, kw_only=True)
class WorkingItem:
    """One item of a session's working memory; ``score`` is set by ranking. ``evicted`` is True
    only on the item :meth:`~tiered_memory.layers.working.WorkingMemory.remember` returns when the
    session, at ``WorkingConfig.capacity``, evicted it at once (it was the least important): its id
    names no item, and the audit log has its ``evict`` entry. Neither is stored or exported."""

    id: str
    user_id: str
    session_id: str
    text: str
    type: str = "note"
    importance: float = 0.5
    created_at: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    access_count: int = 0
    score: float | None = None
    evicted: bool = False


@dataclass(frozen=True, kw_only=True)
class SessionPad:
    """A session's scratchpad as stored: its JSON data and when it was last written."""

    user_id: str
    session_id: str
    data: dict[str, Any]
    updated_at: float


@dataclass(frozen=True, kw_only=True)
class ArchivedTurn:
    """A turn that consolidation moved out of the hot messages table (and its indexes) when
    it compressed the episode ``episode_id``, at ``archived_at``."""

    id: str
    user_id: str
    session_id: str
    role: str
    content: str
    metadata: dict[str, Any]
    timestamp: float
    episode_id: str | None
    archived_at: float


@dataclass(frozen=True, kw_only=True)
class Item:
    """One stored item of the namespaced key-value store. Times are epoch seconds."""

    id: str
    user_id: str
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    text: str | None
    created_at: float
    updated_at: float
