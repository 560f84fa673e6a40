"""The record store protocol every backend implements (SQLite, PostgreSQL)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from ..types import SessionInfo, StoredMessage
from .pending_deletes import OwedRows


@runtime_checkable
class CandidateSource(Protocol):
    """A record store that fetches a search's candidates in one round trip (optional)."""

    def candidates(self, user_id: str, ids: Sequence[str], terms: Sequence[str], *, k: int,
                   session_id: str | None = None) -> tuple[dict[str, StoredMessage], list[tuple[str, float]]]:
        """The records of ``ids`` and of the best ``k`` matches of ``terms``, and those
        matches best first (as :meth:`RecordStore.keyword_search` returns them)."""
        ...


@runtime_checkable
class FilterSource(Protocol):
    """A record store that finds the messages matching search filters itself (optional)."""

    def filtered_ids(self, user_id: str, filters: Mapping[str, Any], *, session_id: str | None = None,
                     limit: int) -> list[str]:
        """Ids of the user's messages whose role, timestamp and metadata match
        ``filters`` (validated by :func:`~tiered_memory.validation.check_filters`), newest
        first, at most ``limit``."""
        ...


#: Messages longer than this many characters are also indexed by their chunks
#: (``recall/chunking.py``); stores keep a partial index of them by user.
LONG_MESSAGE_CHARS = 1200


@runtime_checkable
class LongMessageSource(Protocol):
    """A record store that tells in one index probe whether a user holds any message
    longer than :data:`LONG_MESSAGE_CHARS` (optional): a search of a user without one
    then skips the chunk layer's vector query."""

    def has_long_messages(self, user_id: str) -> bool: ...


@runtime_checkable
class TextMatchSource(Protocol):
    """A record store that finds a user's messages with the same text (optional): the
    near-duplicate check of a write then needs no vector query."""

    def same_text(self, user_id: str, texts: Sequence[str]) -> dict[str, str]:
        """For each of ``texts`` that an indexed, non-duplicate message of the user holds
        (up to case and spaces at the ends, as the store compares them), that message's id."""
        ...


@runtime_checkable
class PositionSource(Protocol):
    """A record store that counts a session's messages between two of them (optional): recall
    places its candidates in their sessions from it. Without it, recall reads distances from
    ``seq``, which other sessions' and users' writes interleave."""

    def session_gaps(self, user_id: str, pairs: Sequence[tuple[str, int, int]]) -> list[int]:
        """For each ``(session_id, low, high)``, how many of the user's messages of that session
        have a ``seq`` above ``low`` and up to ``high``."""
        ...


@runtime_checkable
class SettledSource(Protocol):
    """A record store whose writers may commit a session's messages out of ``seq`` order
    (optional). On PostgreSQL a row's ``seq`` is drawn when it is inserted and the row is seen
    when its transaction commits, so one worker's turn can appear after another's with a
    higher ``seq``; ``end_session`` moves the session's coverage cursor to the highest
    ``seq`` it read, and a turn committed under it later would never be summarised. A store
    whose writes commit in ``seq`` order (SQLite: one writer at a time) needs none."""

    def settled_messages(self, user_id: str, session_id: str) -> list[StoredMessage]:
        """The session's messages in ``seq`` order, read while no write of the session is in
        flight: every message of the session committed after them has a higher ``seq``."""
        ...


@runtime_checkable
class SessionSource(Protocol):
    """A record store that tells each message's session (optional): an embedded Chroma index
    then keeps no session in its metadata (each key is a row Chroma writes) and asks here."""

    def message_sessions(self, user_id: str, ids: Sequence[str] | None = None) -> dict[str, str]:
        """The user's messages (every one, or those of ``ids``): id -> session id."""
        ...


@runtime_checkable
class DuplicateSource(Protocol):
    """A record store that gives back the duplicates whose original is gone (optional)."""

    def release_duplicates(self, user_id: str | None) -> list[StoredMessage]:
        """The user's messages (``None``: every user's) stored as duplicates of a message no
        longer held (forgotten, cleared or archived), oldest first, marked pending (not
        indexed, no original): the caller indexes them again."""
        ...


@runtime_checkable
class DuplicateScope(Protocol):
    """A record store that lists a user's duplicates with their originals (optional): a scoped
    search finds a duplicate in scope by its original's vector, which may lie outside it."""

    def duplicates(self, user_id: str, session_id: str | None = None, *, originals: Sequence[str] | None = None,
                   filters: Mapping[str, Any] | None = None) -> dict[str, tuple[str, bool]]:
        """The user's messages (of ``session_id``, if given; duplicating one of ``originals``,
        if given; matching ``filters``, if given) stored as duplicates: id -> (the original's id,
        whether the original lies in another session). ``originals``: the turns a search found, so
        that it reads their duplicates alone, however many the user has (:func:`read_duplicates`
        reads them by original, in parts). ``filters`` (validated by
        :func:`~tiered_memory.validation.check_filters`): a filtered search's, so that it reads
        the duplicates its filter takes alone; they are the duplicate's own role, time and
        metadata, as :meth:`FilterSource.filtered_ids` reads them (its SQL, a superset of what
        recall accepts, never a subset: :mod:`.filters`), whatever its original's."""
        ...


DUPLICATES_PART = 500  # originals a statement: under SQLite's 999 parameters of old builds


def duplicates_sql(session: bool, p: str = "?", originals: int = 0, session_index: str = "", where: str = "") -> str:
    """The query of :meth:`DuplicateScope.duplicates` (SQLite and PostgreSQL alike): the
    parameters are the user, then the session when ``session``, then ``where``'s, then
    ``originals`` ids when given; ``p`` the dialect's placeholder; ``session_index`` the
    dialect's index hint for a session (SQLite's planner otherwise walks every duplicate of the
    user by the index on originals: 160 ms at 20,000, not 0.03); ``where`` the dialect's filter
    conditions on the duplicate (:mod:`.filters`: columns of ``messages`` unqualified, hence the
    duplicates selected on their own before the join to their originals)."""
    hint = " " + session_index if session else ""
    return (f"SELECT d.id, o.id, o.session_id <> d.session_id FROM (SELECT id, user_id, session_id, duplicate_of"
            f" FROM messages{hint} WHERE user_id = {p}{f' AND session_id = {p}' if session else ''}{where}"
            " AND duplicate_of" + (f" IN ({', '.join([p] * originals)})" if originals else " IS NOT NULL")
            + ") d JOIN messages o ON o.id = d.duplicate_of AND o.user_id = d.user_id")


def read_duplicates(query: Callable[[str, list[Any]], Iterable[Sequence[Any]]], user_id: str,
                    session_id: str | None, originals: Sequence[str] | None,
                    p: str = "?", session_index: str = "",
                    where: tuple[str, list[Any]] = ("", [])) -> dict[str, tuple[str, bool]]:
    """:meth:`DuplicateScope.duplicates` through a store's ``query`` (SQL, parameters -> rows):
    one statement, or one per :data:`DUPLICATES_PART` of ``originals``; ``where``: the
    dialect's SQL of the filters and its parameters (:mod:`.filters`)."""
    scope: list[Any] = [user_id] if session_id is None else [user_id, session_id]
    wanted = [None] if originals is None else list(dict.fromkeys(originals))
    out: dict[str, tuple[str, bool]] = {}
    for start in range(0, len(wanted), DUPLICATES_PART):
        part = [] if originals is None else wanted[start:start + DUPLICATES_PART]
        sql = duplicates_sql(session_id is not None, p, len(part), session_index, where[0])
        for r in query(sql, [*scope, *where[1], *part]):
            out[r[0]] = (r[1], bool(r[2]))
    return out


def pend_duplicates(removed: str, user: str = "?") -> str:
    """The statement that marks the user's duplicates of removed turns pending, run in the
    transaction that removes them (``delete_message``, ``clear_session``, consolidate's
    archive; SQLite and PostgreSQL alike): a crash before :meth:`DuplicateSource.release_duplicates`
    indexes them again leaves them to the next open, which indexes pending turns (a shared
    store's open indexes only those). ``removed`` is SQL for the removed turns' ids (placeholders
    or a subquery); the first parameter is the user, ``user`` the dialect's placeholder."""
    return f"UPDATE messages SET indexed=FALSE WHERE user_id={user} AND duplicate_of IN ({removed})"


class RecordStore(Protocol):
    """Raw messages and their keyword index. All methods are scoped by ``user_id``."""

    def insert_messages(self, rows: list[StoredMessage], *, indexed: bool = False,
                        duplicates: Mapping[str, str] | None = None, sync: bool = True) -> None:
        """Commit all rows in one transaction, or none. They are pending (to index) unless
        ``indexed``: then they are stored as indexed, each row in ``duplicates`` as a
        duplicate of the memory it maps to, as :meth:`mark_indexed` would mark them.
        Without ``sync`` the commit does not wait for the disk: a crash of the process
        keeps it, a power cut may lose it until the next synced commit or :meth:`sync`."""

    def sync(self) -> None:
        """Make every commit so far durable (those made without ``sync`` included)."""

    def mark_indexed(self, ids: list[str], duplicates: dict[str, str]) -> None: ...

    def get_messages(
        self, user_id: str, session_id: str, *, limit: int | None = None
    ) -> list[StoredMessage]: ...

    def get_by_ids(self, user_id: str, ids: Iterable[str]) -> dict[str, StoredMessage]: ...

    def keyword_search(
        self, user_id: str, terms: Sequence[str], *, k: int, session_id: str | None = None
    ) -> list[tuple[str, float]]:
        """Messages matching any of ``terms`` (plain keywords; the store writes its own
        query syntax), best first."""

    def neighbors(self, user_id: str, ids: list[str], window: int) -> dict[str, list[StoredMessage]]: ...

    def existing_ids(self, ids: list[str]) -> set[str]: ...

    def pending_index(self, limit: int) -> list[StoredMessage]: ...

    def indexed_ids(self, user_id: str | None = None, session_id: str | None = None) -> set[str]:
        """Ids of indexed, non-duplicate messages (those with a vector), of one user (and session) if given."""

    def reset_indexed(self) -> None: ...

    def reset_indexed_ids(self, ids: list[str]) -> None: ...

    def delete_message(self, user_id: str, message_id: str) -> bool:
        """Delete the user's message; ours mark the user's duplicates of it pending in the same
        transaction (indexed again after it, or by the next open if a crash comes first)."""

    def clear_session(self, user_id: str, session_id: str) -> list[str]:
        """Delete the session's messages, returning their ids (duplicates of them: as
        :meth:`delete_message`)."""

    def forget_user(self, user_id: str) -> list[str]: ...

    def iter_messages(self, user_id: str | None = None) -> Iterator[StoredMessage]: ...

    def sessions(self, user_id: str) -> list[SessionInfo]:
        """The user's sessions that hold messages, in the order they started."""

    def touch(self, user_id: str, ids: list[str], now: float) -> None:
        """One access per listed id of the user's messages (ids may repeat), last access ``now``;
        an id the user does not hold (forgotten since, perhaps taken by another user) is skipped."""

    def counts(self) -> dict[str, int]: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def change_meta(self, key: str, change: Callable[[str | None], str]) -> str:
        """Set ``key`` to ``change(its value)`` (``None``: unset) in one step, and return it:
        workers changing the key at once wait for each other, so neither change is lost, as
        one may be between a :meth:`get_meta` and a :meth:`set_meta`."""

    #: the deletions the vector index owes, one row each (:class:`~.pending_deletes.OwedRows`)
    owed_rows: OwedRows

    def close(self) -> None: ...


def warn_if_later(where: object, name: str, version: int, known: int) -> None:
    """Log a warning when the store's ``name`` schema is at a later ``version`` than the
    ``known`` steps of this code: a later tiered-memory migrated it. It still opens (refusing
    would stop the older workers of a rolling upgrade), but this code does not know what the
    later steps changed, so the warning names both versions and says to upgrade."""
    if version > known:
        logging.getLogger("tiered_memory").warning(
            "%s was migrated by a later version of tiered-memory (schema %r at version %s; this version "
            "knows version %s): it opens, so the workers of a rolling upgrade keep running, but what the "
            "later version changed is unknown here: upgrade this process to that version",
            where, name, version, known)
