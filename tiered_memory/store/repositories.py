"""The layer repository protocols: what the memory layers ask of a record store.

Every method names a domain operation; none takes SQL or hands out a cursor. Each
layer depends on its own small protocol: semantic memory on :class:`FactRepository`,
episodic memory on :class:`EpisodeRepository`, working memory on
:class:`WorkingRepository`, the item store on :class:`ItemRepository`; consolidation and
the layer set use the union :class:`LayerRepository`.

Reads are plain methods. Writes happen inside ``with repo.unit() as u:``: the *unit of
work* is one transaction (committed when the block ends, rolled back when it raises),
and ``u`` exposes only domain writes (and the few reads a write decides on), never
``execute``. All methods are scoped by ``user_id`` where the rows have one; ids are
global keys. Keyword methods take plain keywords: each backend writes its own query
syntax and returns ``(id, score)`` best first.

A record store that implements :class:`LayerRepository` itself gets every layer
(:func:`tiered_memory.backends.open_layer_store` returns it as is); the layer
conformance suite (``tests/test_layer_conformance.py``) is how it proves it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Iterator, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..records import ArchivedTurn, AuditEntry, Episode, Fact, FactChange, Item, SessionPad, WorkingItem
from .pending_deletes import OwedVector

Scored = list[tuple[str, float]]
#: where a page of items (newest first) ended, to read the next one from (:meth:`ItemRepository.items_page`)
ItemCursor = tuple[float, int]


class OwedWrites(Protocol):
    def owe_vectors(self, user_id: str, *, turns: Sequence[str] = (),
                    vectors: Sequence[str] = ()) -> list[OwedVector]:
        """Record, with ``user_id``'s rows this unit deletes, the vectors the index must delete (a
        turn's id: its own and its chunks'), until they are paid (:mod:`.pending_deletes`); returns
        the entries."""


class AuditWrites(OwedWrites, Protocol):
    def audit(self, user_id: str, layer: str, item_id: str, action: str, details: Mapping[str, Any],
              at: float) -> None:
        """Append one entry to the audit log."""


# ---- facts ---------------------------------------------------------------------
class FactWrites(AuditWrites, Protocol):
    def insert_fact(self, fact: Fact, vector: np.ndarray | None) -> None: ...

    def revise_fact(self, user_id: str, fact_id: str, *, text: str, confidence: float, source_ids: Sequence[str],
                    metadata: Mapping[str, Any], updated_at: float, vector: np.ndarray, key: str | None,
                    polarity: int) -> None:
        """New evidence refines a fact: text, confidence, sources, metadata (``add_fact``'s caller's
        keys merged in) and vector change, and its slot (``key``, ``polarity``: a fact of no slot
        rewritten in a slot's words is in that slot)."""

    def edit_fact(self, user_id: str, fact_id: str, *, text: str, type: str, confidence: float,
                  metadata: Mapping[str, Any], key: str | None, polarity: int, updated_at: float,
                  vector: np.ndarray | None) -> None:
        """An application edit (the slot ``key`` and ``polarity`` are the text's); the vector is
        kept when ``vector`` is ``None``."""

    def invalidate_fact(self, user_id: str, fact_id: str, *, at: float, superseded_by: str,
                        updated_at: float) -> None: ...

    def absorb_facts(self, fact_id: str, *, source_ids: Sequence[str], access_count: int,
                     last_access: float | None, updated_at: float, metadata: Mapping[str, Any] | None = None,
                     confidence: float | None = None) -> None:
        """A merge keeper (or a fact said again) takes the sources and ``access_count`` more
        accesses of its duplicates, and their ``last_access`` where it is later than its own
        (``None``: none of them was read); ``metadata`` and ``confidence``, where given, replace its own."""

    def held_facts(self, user_id: str, ids: Sequence[str]) -> list[Fact]:
        """Those of ``ids`` that are not deleted, as this unit sees them, held against every other
        writer till it ends (a row lock where the engine locks rows; SQLite's write transaction
        already excludes every other writer): a write decided on them acts on them as read."""

    def delete_fact(self, user_id: str, fact_id: str) -> None: ...

    def soft_delete_fact(self, user_id: str, fact_id: str, at: float) -> str | None:
        """Hide a live fact (kept for audit); returns its text, or ``None`` if it was not live."""

    def record_history(self, user_id: str, change: FactChange) -> None: ...

    def set_fact_vectors(self, vectors: Sequence[tuple[str, np.ndarray]]) -> None: ...

    def touch_facts(self, user_id: str, ids: Sequence[str], now: float) -> None:
        """One access per listed id (ids may repeat), last access ``now``."""


class FactRepository(Protocol):
    def fact(self, user_id: str, fact_id: str) -> Fact | None:
        """A fact that is not deleted (valid or invalidated)."""

    def facts_of(self, user_id: str, *, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        """Live facts, oldest first."""

    def facts_by_ids(self, user_id: str, ids: Sequence[str]) -> list[Fact]:
        """Those of ``ids`` that are not deleted."""

    def facts_in_slot(self, user_id: str, key: str) -> list[tuple[Fact, np.ndarray | None]]:
        """Valid, not deleted facts stored with slot ``key``, with their stored vectors (as
        :meth:`fact_vectors`), oldest first (one indexed query: each fact of a slot resolution
        writes asks it)."""

    def valid_facts(self, user_id: str | None = None) -> list[Fact]:
        """Valid, not deleted facts (of every user when ``user_id`` is ``None``)."""

    def fact_vectors(self, user_id: str) -> list[tuple[Fact, np.ndarray | None]]:
        """Valid facts with their stored vectors, oldest first."""

    def fact_history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]: ...

    def keyword_facts(self, user_id: str, terms: Sequence[str], k: int) -> Scored: ...

    def fact_owners(self, ids: Sequence[str]) -> dict[str, str]:
        """The user of each of ``ids`` that any fact row holds, deleted ones included (ids are
        global keys: an import must not reuse one)."""

    def history_owners(self, fact_ids: Sequence[str]) -> dict[str, str]:
        """The user of each of ``fact_ids`` that the fact history names (deleted facts' too)."""

    def unit(self) -> AbstractContextManager[FactWrites]: ...


# ---- episodes and sessions -----------------------------------------------------------
class EpisodeWrites(AuditWrites, Protocol):
    def lock_session(self, user_id: str, session_id: str) -> None:
        """Serialise this session's episode, working-memory and scratchpad writes across workers
        until the unit ends."""

    def cursor(self, user_id: str, session_id: str) -> int:
        """The last message seq an episode of the session covers (0: none)."""

    def latest_episode(self, user_id: str, session_id: str) -> Episode | None: ...

    def insert_episode(self, episode: Episode, points: Sequence[tuple[str, str]]) -> None:
        """The episode and its key points ``(point id, text)``."""

    def delete_episode(self, user_id: str, episode_id: str) -> list[str] | None:
        """Remove the user's episode and its key points, and release its turns
        (:meth:`release_cursor`); returns the key points' ids (their vectors' ids), or ``None``
        when the user holds no such episode."""

    def advance_cursor(self, user_id: str, session_id: str, seq: int) -> None:
        """Move the session's coverage cursor to ``seq`` (never back)."""

    def release_cursor(self, user_id: str, session_id: str) -> None:
        """Move the session's coverage cursor back to the last live turn one of its episodes
        cites (0: none), never forward: the turns after it are uncovered again."""

    def mark_promoted(self, episode_id: str, at: float) -> bool:
        """Mark the episode promoted at ``at``; False if it was already (another run got there first)."""

    def mark_compressed(self, episode_id: str, at: float) -> bool:
        """Mark the episode compressed at ``at``; False if it was already (another run got there first)."""

    def archive_messages(self, user_id: str, ids: Sequence[str], episode_id: str, at: float, *,
                         delete: bool) -> int:
        """Move messages out of the hot table (and its keyword index) into the archive, or delete
        them; returns how many left the hot table."""

    def restore_archived(self, turns: Sequence[ArchivedTurn]) -> int:
        """Put exported turns back into the archive as they were; a turn whose id the archive
        holds is left as it is. Returns how many were written."""

    def forget_archived(self, user_id: str, *, ids: Sequence[str] = (), session_id: str | None = None) -> int:
        """Delete the user's archived messages among ``ids``, or all of ``session_id``'s;
        returns how many."""

    def touch_episodes(self, user_id: str, ids: Sequence[str], now: float) -> None: ...


class EpisodeRepository(Protocol):
    def episodes_of(self, user_id: str | None, session_id: str | None = None) -> list[Episode]:
        """Episodes by end time (of every user when ``user_id`` is ``None``)."""

    def episodes_by_ids(self, user_id: str, ids: Sequence[str]) -> dict[str, Episode]: ...

    def episode_points(self, episode_id: str) -> list[str]:
        """The key point texts of an episode, in order."""

    def point_texts(self, point_ids: Sequence[str]) -> dict[str, str]: ...

    def keyword_points(self, user_id: str, terms: Sequence[str], k: int) -> Scored:
        """Key points matching ``terms`` (ids ``ep:<episode id>:<n>``)."""

    def episode_owners(self, ids: Sequence[str]) -> dict[str, str]:
        """The user of each of ``ids`` that an episode holds (ids are global keys)."""

    def cursor(self, user_id: str, session_id: str) -> int: ...

    def session_cursors(self, user_id: str | None) -> dict[tuple[str, str], int]:
        """Every coverage cursor of ``user_id`` (of every user when ``None``), by (user, session)."""

    def archived_turns(self, user_id: str | None) -> Iterator[ArchivedTurn]:
        """Archived turns of ``user_id`` (of every user when ``None``), every field (for export)."""

    def archived_count(self, user_id: str) -> int:
        """How many archived turns ``user_id`` has (counted by the store: no row is read)."""

    def archived_by_ids(self, user_id: str, ids: Sequence[str]) -> dict[str, ArchivedTurn]:
        """The user's archived turns among ``ids``, by id."""

    def archive_owners(self, ids: Sequence[str]) -> dict[str, str]:
        """The user of each of ``ids`` that an archived turn holds (ids are global keys)."""

    def uncovered_count(self, user_id: str, session_id: str, *, role: str | None = None) -> int:
        """Messages of the session (of ``role`` if given) that no episode covers yet."""

    def idle_sessions(self, user_id: str, before: float) -> list[str]:
        """Sessions with uncovered messages whose last message is before ``before``, oldest first."""

    def unit(self) -> AbstractContextManager[EpisodeWrites]: ...


# ---- working memory ------------------------------------------------------------------
class WorkingWrites(AuditWrites, Protocol):
    def lock_session(self, user_id: str, session_id: str) -> None: ...

    def working_items(self, user_id: str, session_id: str) -> list[WorkingItem]:
        """The session's live items, read in the unit (after :meth:`lock_session`: current)."""

    def insert_working_item(self, item: WorkingItem, vector: np.ndarray | None) -> None: ...

    def set_working_vectors(self, vectors: Sequence[tuple[str, np.ndarray]]) -> None:
        """Replace the vectors of live items, by id (another embedder's); an item gone or
        retired meanwhile is left alone."""

    def evict_working_item(self, item_id: str) -> bool:
        """Delete a live item; False if it is gone or retired already (by another worker)."""

    def retire_working_item(self, item_id: str, at: float) -> bool:
        """Hide a live item (pruned), kept for audit; False if it is gone or retired already."""

    def forget_working_item(self, user_id: str, session_id: str, item_id: str) -> bool: ...

    def clear_working(self, user_id: str, session_id: str) -> int:
        """Remove the session's items and scratchpad; returns items removed."""

    def scratchpad(self, user_id: str, session_id: str) -> dict[str, Any]: ...

    def save_scratchpad(self, user_id: str, session_id: str, data: Mapping[str, Any], at: float) -> None: ...

    def restore_scratchpad(self, pad: SessionPad) -> bool:
        """Write an exported scratchpad as it was, unless the session has one; returns whether
        it was written."""

    def touch_working(self, user_id: str, ids: Sequence[str], now: float) -> None: ...


class WorkingRepository(Protocol):
    def working_items(self, user_id: str, session_id: str) -> list[WorkingItem]:
        """The session's live items, oldest first."""

    def working_vectors(self, user_id: str, session_id: str) -> list[tuple[WorkingItem, np.ndarray | None]]: ...

    def live_working_items(self, user_id: str | None) -> list[WorkingItem]:
        """Live items of every session of the user (of every user when ``None``)."""

    def working_owners(self, ids: Sequence[str]) -> dict[str, str]:
        """The user of each of ``ids`` that a working item holds, pruned ones included (ids are
        global keys)."""

    def scratchpad(self, user_id: str, session_id: str) -> dict[str, Any]: ...

    def scratchpads_of(self, user_id: str | None) -> list[SessionPad]:
        """The stored scratchpads of ``user_id`` (of every user when ``None``), for export."""

    def unit(self) -> AbstractContextManager[WorkingWrites]: ...


# ---- items ---------------------------------------------------------------------------
class ItemWrites(OwedWrites, Protocol):
    def item_id(self, namespace: Sequence[str], key: str, live_at: float | None = None) -> str | None:
        """The id of the item at ``namespace`` and ``key``; with ``live_at``, unless it has expired."""

    def insert_item(self, item: Item, *, ttl_minutes: float | None = None, expires_at: float | None = None) -> str:
        """Insert ``item``, or update the row another writer stored under its namespace and key
        meanwhile; returns the id of the row written."""

    def update_item(self, item_id: str, *, user_id: str, value: Mapping[str, Any], text: str | None,
                    updated_at: float, ttl_minutes: float | None = None, expires_at: float | None = None) -> None: ...

    def delete_item(self, item_id: str) -> str | None:
        """Delete the item; returns its owner (``None``: no such item)."""

    def refresh_items(self, ids: Sequence[str], now: float) -> None:
        """Restart the TTL of these items (those that have one) from ``now``."""


class ItemRepository(Protocol):
    """Reads take ``live_at``: when given, items that expired by then are left out."""

    def item(self, namespace: Sequence[str], key: str, live_at: float | None = None) -> Item | None: ...

    def items_under(self, prefix: Sequence[str], ids: Sequence[str] | None = None,
                    live_at: float | None = None, filter: Mapping[str, Any] | None = None) -> list[Item]:
        """Items whose namespace starts with ``prefix`` (only ``ids`` if given), newest first;
        with ``filter`` (checked), at least those it matches (the caller checks each again)."""

    def items_page(self, prefix: Sequence[str], limit: int, after: ItemCursor | None = None,
                   live_at: float | None = None, filter: Mapping[str, Any] | None = None,
                   user_id: str | None = None) -> list[tuple[Item, ItemCursor]]:
        """Up to ``limit`` items under ``prefix`` (the page after ``after``), newest first, as
        :meth:`items_under` orders them, each with the cursor that reads on from it. With
        ``filter`` (checked), at least the items it matches (the caller checks each again);
        with ``user_id``, only that owner's."""

    def items_with_text(self) -> list[Item]: ...

    def item_namespaces(self, live_at: float | None = None, *, with_keys: bool = False
                        ) -> list[tuple[tuple[str, ...], str | None, str]]:
        """Distinct ``(namespace, key, user_id)`` of the items; ``key`` is ``None`` unless
        ``with_keys`` (then there is one row per item)."""

    def expired_items(self, now: float) -> list[str]:
        """Ids of the items that expired by ``now``."""

    def expiring_items(self, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` whose item has a TTL (the ones a refreshing read restarts)."""

    def count_items(self, user_id: str | None = None) -> int: ...

    def keyword_items(self, user_id: str, terms: Sequence[str], k: int) -> Scored: ...

    def item_rows(self, user_id: str | None, live_at: float | None = None
                  ) -> list[tuple[Item, float | None, float | None]]:
        """Items of ``user_id`` (of every owner when ``None``) with their ``ttl_minutes`` and
        ``expires_at``, oldest first (for export)."""

    def item_owners(self, ids: Sequence[str]) -> dict[str, str]:
        """The owner of each of ``ids`` that an item holds (ids are global keys)."""

    def unit(self) -> AbstractContextManager[ItemWrites]: ...


# ---- vectors not yet written -------------------------------------------------------------
@runtime_checkable
class PendingVectorSource(Protocol):
    """Optional: a layer repository that marks the facts and episodes whose vectors are not yet
    written (stored pending by the unit that writes the row, settled once the index has them), so
    that any worker's open writes what a crash cut off without comparing the whole index. Ours
    (SQLite, PostgreSQL) offer it; without it, only a full repair or ``rebuild_index`` does."""

    def pending_facts(self, after: int, limit: int) -> list[tuple[int, Fact, bool]]:
        """``(position, fact, live)`` of pending facts past ``after``, in position order."""

    def pending_episodes(self, after: int, limit: int) -> list[tuple[int, Episode]]: ...

    def settle_facts(self, written: Sequence[tuple[str, str, float]]) -> None:
        """Settle each ``(id, text, updated_at)`` whose vector was written, unless the fact changed since."""

    def settle_episodes(self, ids: Sequence[str]) -> None: ...

    def pend(self, facts: Sequence[str] = (), episodes: Sequence[str] = ()) -> None:
        """Mark these facts and episodes pending (the index refused their vectors)."""

    def pend_all(self) -> None:
        """Mark every fact and episode pending."""


# ---- all of them -----------------------------------------------------------------------
class LayerWrites(FactWrites, EpisodeWrites, WorkingWrites, ItemWrites, Protocol):
    """One transaction over every layer's tables."""


@runtime_checkable
class LayerRepository(FactRepository, EpisodeRepository, WorkingRepository, ItemRepository, Protocol):
    """Every layer's rows. ``layer_users`` and the id sets serve vector repair."""

    def valid_fact_ids(self) -> set[str]: ...

    def point_ids(self) -> set[str]: ...

    def layer_users(self) -> set[str]:
        """Users with facts or episodes."""

    def audit_log(self, user_id: str, layer: str | None = None) -> list[AuditEntry]:
        """The user's audit entries (of one layer), oldest first."""

    def audit_users(self) -> set[str]:
        """Users with audit entries."""

    def unit(self) -> AbstractContextManager[LayerWrites]: ...
