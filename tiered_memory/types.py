"""Records returned by the public API. All frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Mapping

Role = Literal["user", "assistant", "system", "tool"]
ROLES: frozenset[str] = frozenset({"user", "assistant", "system", "tool"})
Layer = Literal["turn", "episode", "fact", "working", "item"]


@dataclass(frozen=True, kw_only=True)
class Message:
    """A message given to :meth:`TieredMemory.add_many`."""

    role: str
    content: str
    metadata: Mapping[str, Any] | None = None
    timestamp: float | datetime | str | None = None
    id: str | None = None  # caller-chosen: retrying the same batch stores it once


@dataclass(frozen=True, kw_only=True)
class StoredMessage:
    """A message as kept in the record store."""

    id: str
    user_id: str
    session_id: str
    role: str
    content: str
    timestamp: float
    metadata: dict[str, Any] = field(default_factory=dict)
    seq: int = 0

    @property
    def datetime(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp, tz=timezone.utc)


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """One session of a user, as listed by :meth:`TieredMemory.sessions`."""

    session_id: str
    messages: int
    first: float
    last: float


@dataclass(frozen=True, kw_only=True)
class MemoryHit:
    """One search result with an explanation of its score."""

    id: str
    text: str
    score: float
    layer: str
    session_id: str | None
    timestamp: float | None
    metadata: dict[str, Any] = field(default_factory=dict)
    explanation: dict[str, Any] = field(default_factory=dict)
    role: str | None = None


@dataclass(frozen=True, kw_only=True)
class SessionHit:
    """One past session found by :meth:`TieredMemory.search_sessions`: its score is that of
    its best turn, and ``hits`` are its best turns for the query, best first."""

    session_id: str
    score: float
    hits: list[MemoryHit] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Stats:
    """Counts reported by :meth:`TieredMemory.stats`."""

    users: int
    sessions: int
    messages: int
    indexed: int
    duplicates: int
    #: ``None`` where not known: a folder read beside the process that holds it (its vector
    #: index is that process's, and is not opened)
    vectors: int | None
    extra: dict[str, int] = field(default_factory=dict)
