"""The layer repositories on a SQL record store: every read query, written once.

:class:`LayerStore` implements :class:`~.repositories.LayerRepository` in the portable
SQL subset SQLite and PostgreSQL share, with ``?`` placeholders; its writes live in
:class:`~.layer_unit.LayerUnit`, the unit of work :meth:`LayerStore.unit` yields. A
dialect subclass (:mod:`.sqlite_layers`, :mod:`.postgres_layers`) supplies the schema
and only what differs: running a query, opening a transaction, the messages' order
column, ``max`` of two values, full-text search and locking a session across workers.

``query`` and ``transaction`` are this module's plumbing (and the tests' way to read
tables directly); the layers never see them: they are typed against the protocols.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..records import ArchivedTurn, AuditEntry, Episode, Fact, FactChange, SessionPad, WorkingItem
from .layer_codec import (ARCHIVE_COLS, EPISODE_COLS, FACT_COLS, HISTORY_COLS, PAD_COLS, WORKING_COLS,
                          archived_from_row, change_from_row, episode_from_row, fact_from_row,
                          from_blob, id_batches, marks, pad_from_row, working_from_row)
from .layer_items import LayerItems
from .layer_unit import SESSION_WORKING, LayerUnit
from .repositories import Scored
from .stored_values import count, json_dict, number, text

class LayerStore(LayerItems):
    """Layer rows on top of a SQL record store; subclasses bind the dialect."""

    #: which SQL dialect: "sqlite" or "postgres"
    dialect = ""
    #: the messages table's insertion-order column
    message_order = "rowid"
    #: the SQL function for the larger of two values
    greatest = "max"
    #: what ends a query whose rows a unit holds till it commits (:meth:`.LayerUnit.held_facts`):
    #: nothing on SQLite, whose write transaction (``BEGIN IMMEDIATE``) excludes every other writer
    row_lock = ""

    def __init__(self, store: Any) -> None:
        self.db = store

    # ---- dialect ------------------------------------------------------------
    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Any]:
        """A connection in one transaction whose ``execute``/``executemany`` take ``?``."""
        raise NotImplementedError

    def mark_transaction(self) -> AbstractContextManager[Any]:
        """:meth:`transaction` for the marks that a row's vectors are written: one lost leaves the
        row pending and the next open writes them again, so a dialect may commit it without
        waiting for the disk (SQLite does, as for the turns' marks)."""
        return self.transaction()

    def keyword(self, table: str, user_id: str, terms: Sequence[str], k: int, extra: str = "") -> Scored:
        """Full-text search over ``facts``, ``episode_points`` or ``items`` OR-ing ``terms``
        (each dialect writes its own syntax); ``extra`` filters on alias ``t``."""
        raise NotImplementedError

    def lock_session(self, c: Any, user_id: str, session_id: str) -> None:
        """Serialise writes to one session across workers until ``c`` commits (a no-op on SQLite:
        its write transaction, ``BEGIN IMMEDIATE``, already excludes every other writer of the file)."""

    # ---- the unit of work -------------------------------------------------------
    @contextmanager
    def unit(self) -> Iterator[LayerUnit]:
        with self.transaction() as c:
            yield LayerUnit(self, c)

    # ---- facts ------------------------------------------------------------------
    def fact(self, user_id: str, fact_id: str) -> Fact | None:
        found = self.query(f"SELECT {FACT_COLS} FROM facts WHERE user_id=? AND id=? AND deleted_at IS NULL",
                           (user_id, fact_id))
        return fact_from_row(found[0]) if found else None

    def facts_of(self, user_id: str, *, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        sql = f"SELECT {FACT_COLS} FROM facts WHERE user_id=? AND deleted_at IS NULL"
        params: list[Any] = [user_id]
        if type:
            sql += " AND type=?"
            params.append(type)
        sql += "" if include_invalid else " AND invalid_at IS NULL"
        return [fact_from_row(r) for r in self.query(sql + " ORDER BY rowid", params)]

    def facts_by_ids(self, user_id: str, ids: Sequence[str]) -> list[Fact]:
        if not ids:
            return []
        return [fact_from_row(r) for r in self.query(
            f"SELECT {FACT_COLS} FROM facts WHERE user_id=? AND deleted_at IS NULL AND id IN ({marks(len(ids))})",
            [user_id, *ids])]

    def facts_in_slot(self, user_id: str, key: str) -> list[tuple[Fact, np.ndarray | None]]:
        return [(fact_from_row(r), from_blob(r[-1])) for r in self.query(
            f"SELECT {FACT_COLS}, vector FROM facts WHERE user_id=? AND key=? AND deleted_at IS NULL"
            " AND invalid_at IS NULL ORDER BY rowid", (user_id, key))]

    def valid_facts(self, user_id: str | None = None) -> list[Fact]:
        sql = f"SELECT {FACT_COLS} FROM facts WHERE deleted_at IS NULL AND invalid_at IS NULL"
        return [fact_from_row(r) for r in self.query(sql + (" AND user_id=?" if user_id else ""),
                                                     [user_id] if user_id else [])]

    def fact_vectors(self, user_id: str) -> list[tuple[Fact, np.ndarray | None]]:
        rows = self.query(f"SELECT {FACT_COLS}, vector FROM facts WHERE user_id=? AND deleted_at IS NULL"
                          " AND invalid_at IS NULL ORDER BY rowid", (user_id,))
        return [(fact_from_row(r), from_blob(r[-1])) for r in rows]

    def fact_history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]:
        sql = f"SELECT {HISTORY_COLS} FROM fact_history WHERE user_id=?"
        params: list[Any] = [user_id]
        if fact_id is not None:
            sql += " AND fact_id=?"
            params.append(fact_id)
        return [change_from_row(r) for r in self.query(sql + " ORDER BY seq", params)]

    def keyword_facts(self, user_id: str, terms: Sequence[str], k: int) -> Scored:
        return self.keyword("facts", user_id, terms, k, "AND t.deleted_at IS NULL") if terms else []

    def fact_owners(self, ids: Sequence[str]) -> dict[str, str]:
        return self._owners("facts", ids)

    def history_owners(self, fact_ids: Sequence[str]) -> dict[str, str]:
        return self._owners("fact_history", fact_ids, key="fact_id")

    def _owners(self, table: str, ids: Sequence[str], key: str = "id") -> dict[str, str]:
        found: dict[str, str] = {}
        for part in id_batches(sorted(set(ids))):
            found.update({r[0]: r[1] for r in self.query(
                f"SELECT DISTINCT {key}, user_id FROM {table} WHERE {key} IN ({marks(len(part))})", part)})
        return found

    # ---- vectors not yet written (the start-up repair of a shared store) -----------
    def pending_facts(self, after: int, limit: int) -> list[tuple[int, Fact, bool]]:
        """Up to ``limit`` facts marked pending past ``after`` (a rowid), in rowid order: each
        with its rowid and whether it is live (valid, not deleted: it should have a vector)."""
        return [(int(r[-2]), fact, fact.valid and r[-1] is None) for r in self.query(
            f"SELECT {FACT_COLS}, rowid, deleted_at FROM facts WHERE NOT indexed AND rowid > ?"
            " ORDER BY rowid LIMIT ?", (after, limit)) for fact in [fact_from_row(r)]]

    def pending_episodes(self, after: int, limit: int) -> list[tuple[int, Episode]]:
        """Up to ``limit`` episodes marked pending past ``after`` (a rowid), in rowid order."""
        return [(int(r[-1]), episode_from_row(r)) for r in self.query(
            f"SELECT {EPISODE_COLS}, rowid FROM episodes WHERE NOT indexed AND rowid > ?"
            " ORDER BY rowid LIMIT ?", (after, limit))]

    def settle_facts(self, written: Sequence[tuple[str, str, float]]) -> None:
        """Mark facts indexed whose vector was written for ``(id, text, updated_at)``; one that
        changed since (another call revised it meanwhile) is left pending, so the vector of
        its old text is not taken for its own."""
        with self.mark_transaction() as c:
            c.executemany("UPDATE facts SET indexed = (text = ? AND updated_at = ?) WHERE id = ?",
                          [(text, at, i) for i, text, at in sorted(written)])

    def settle_episodes(self, ids: Sequence[str]) -> None:
        """Mark episodes indexed (their key points never change)."""
        with self.mark_transaction() as c:
            c.executemany("UPDATE episodes SET indexed = TRUE WHERE id = ?", [(i,) for i in sorted(ids)])

    def pend(self, facts: Sequence[str] = (), episodes: Sequence[str] = ()) -> None:
        """Mark these facts and episodes pending: the index refused their vectors (a repair's
        re-embedding), so the next pending pass writes them."""
        with self.transaction() as c:  # durable, unlike a settlement: a lost mark would leave a vector missing
            c.executemany("UPDATE facts SET indexed = FALSE WHERE id = ?", [(i,) for i in sorted(facts)])
            c.executemany("UPDATE episodes SET indexed = FALSE WHERE id = ?", [(i,) for i in sorted(episodes)])

    def pend_all(self) -> None:
        """Mark every fact and episode pending: their vectors are to be written again
        (``rebuild_index``), by that call or, if it is cut short, the next open."""
        with self.transaction() as c:
            c.execute("UPDATE facts SET indexed = FALSE WHERE deleted_at IS NULL AND invalid_at IS NULL")
            c.execute("UPDATE episodes SET indexed = FALSE")

    def valid_fact_ids(self) -> set[str]:
        return {r[0] for r in self.query("SELECT id FROM facts WHERE deleted_at IS NULL AND invalid_at IS NULL")}

    def layer_users(self) -> set[str]:
        # fact_history too: a user whose every fact was deleted still has their trail
        return {r[0] for r in self.query(
            "SELECT user_id FROM facts UNION SELECT user_id FROM episodes UNION SELECT user_id FROM fact_history")}

    # ---- episodes and sessions ------------------------------------------------------
    def episodes_of(self, user_id: str | None, session_id: str | None = None) -> list[Episode]:
        sql, params = f"SELECT {EPISODE_COLS} FROM episodes WHERE 1=1", []
        if user_id is not None:
            sql, params = sql + " AND user_id=?", [user_id]
        if session_id is not None:
            sql += " AND session_id=?"
            params.append(session_id)
        return [episode_from_row(r) for r in self.query(sql + " ORDER BY end_ts, rowid", params)]

    def episodes_by_ids(self, user_id: str, ids: Sequence[str]) -> dict[str, Episode]:
        if not ids:
            return {}
        return {r[0]: episode_from_row(r) for r in self.query(
            f"SELECT {EPISODE_COLS} FROM episodes WHERE user_id=? AND id IN ({marks(len(ids))})", [user_id, *ids])}

    def episode_points(self, episode_id: str) -> list[str]:
        return [text(r[1], "episode_points", r[0], "text") for r in self.query(
            "SELECT id, text FROM episode_points WHERE episode_id=? ORDER BY rowid", (episode_id,))]

    def point_texts(self, point_ids: Sequence[str]) -> dict[str, str]:
        if not point_ids:
            return {}
        return {r[0]: text(r[1], "episode_points", r[0], "text") for r in self.query(
            f"SELECT id, text FROM episode_points WHERE id IN ({marks(len(point_ids))})", list(point_ids))}

    def episode_owners(self, ids: Sequence[str]) -> dict[str, str]:
        return self._owners("episodes", ids)

    def point_ids(self) -> set[str]:
        return {r[0] for r in self.query("SELECT id FROM episode_points")}

    def keyword_points(self, user_id: str, terms: Sequence[str], k: int) -> Scored:
        return self.keyword("episode_points", user_id, terms, k) if terms else []

    def cursor(self, user_id: str, session_id: str) -> int:
        found = self.query("SELECT last_seq FROM session_cursor WHERE user_id=? AND session_id=?",
                           (user_id, session_id))
        return count(found[0][0], "session_cursor", session_id, "last_seq") if found else 0

    def session_cursors(self, user_id: str | None) -> dict[tuple[str, str], int]:
        sql, params = "SELECT user_id, session_id, last_seq FROM session_cursor", []
        if user_id is not None:
            sql, params = sql + " WHERE user_id=?", [user_id]
        return {(r[0], r[1]): count(r[2], "session_cursor", r[1], "last_seq") for r in self.query(sql, params)}

    def uncovered_count(self, user_id: str, session_id: str, *, role: str | None = None) -> int:
        sql = f"SELECT COUNT(*) FROM messages WHERE user_id=? AND session_id=? AND {self.message_order} > ?"
        params: list[Any] = [user_id, session_id, self.cursor(user_id, session_id)]
        if role is not None:
            sql += " AND role=?"
            params.append(role)
        return int(self.query(sql, params)[0][0])

    def idle_sessions(self, user_id: str, before: float) -> list[str]:
        """Sessions with turns no episode covers, whose last readable turn time is before
        ``before``. A time another writer left unreadable tells no age (text and blobs, which
        SQLite sorts above every number; NaN and infinities, which PostgreSQL sorts at the ends):
        the range test leaves it out of the ``max``, and a session of such times alone is not idle."""
        order = f"m.{self.message_order}"
        return [r[0] for r in self.query(
            "SELECT m.session_id FROM messages m LEFT JOIN session_cursor c"
            " ON c.user_id = m.user_id AND c.session_id = m.session_id"
            f" WHERE m.user_id=? AND {order} > COALESCE(c.last_seq, 0) GROUP BY m.session_id"
            " HAVING max(CASE WHEN m.timestamp BETWEEN -1e300 AND 1e300 THEN m.timestamp END) < ?"
            f" ORDER BY min({order})",
            (user_id, before))]

    # ---- working memory ------------------------------------------------------------
    def working_items(self, user_id: str, session_id: str) -> list[WorkingItem]:
        return [working_from_row(r) for r in self.query(SESSION_WORKING, (user_id, session_id))]

    def working_vectors(self, user_id: str, session_id: str) -> list[tuple[WorkingItem, np.ndarray | None]]:
        return [(working_from_row(r), from_blob(r[-1])) for r in self.query(
            f"SELECT {WORKING_COLS}, vector FROM working_items WHERE user_id=? AND session_id=?"
            " AND deleted_at IS NULL", (user_id, session_id))]

    def live_working_items(self, user_id: str | None) -> list[WorkingItem]:
        sql, params = f"SELECT {WORKING_COLS} FROM working_items WHERE deleted_at IS NULL", []
        if user_id is not None:
            sql, params = sql + " AND user_id=?", [user_id]
        return [working_from_row(r) for r in self.query(
            sql + " ORDER BY user_id, session_id, created_at, id", params)]

    def working_owners(self, ids: Sequence[str]) -> dict[str, str]:
        return self._owners("working_items", ids)

    def scratchpad(self, user_id: str, session_id: str) -> dict[str, Any]:
        found = self.query("SELECT data FROM scratchpads WHERE user_id=? AND session_id=?", (user_id, session_id))
        return json_dict(found[0][0], "scratchpads", session_id, "data") if found else {}

    def scratchpads_of(self, user_id: str | None) -> list[SessionPad]:
        sql, params = f"SELECT {PAD_COLS} FROM scratchpads", []
        if user_id is not None:
            sql, params = sql + " WHERE user_id=?", [user_id]
        return [pad_from_row(r) for r in self.query(sql + " ORDER BY user_id, session_id", params)]

    # ---- audit and archive (inspection) ----------------------------------------------
    def audit_log(self, user_id: str, layer: str | None = None) -> list[AuditEntry]:
        sql = "SELECT layer, item_id, action, at, details FROM audit_log WHERE user_id=?"
        params: list[Any] = [user_id]
        if layer:
            sql += " AND layer=?"
            params.append(layer)
        return [AuditEntry(user_id=user_id, layer=r[0], item_id=r[1], action=r[2],
                           at=number(r[3], "audit_log", r[1], "at"),
                           details=json_dict(r[4], "audit_log", r[1], "details"))
                for r in self.query(sql + " ORDER BY seq", params)]

    def audit_users(self) -> set[str]:
        return {r[0] for r in self.query("SELECT DISTINCT user_id FROM audit_log")}

    def archived_turns(self, user_id: str | None, page: int = 1000) -> Iterator[ArchivedTurn]:
        """Every archived turn (one user's, or everyone's), read ``page`` rows at a time in
        the order of the archive's index: an archive may hold most of a long history."""
        last: tuple[Any, ...] | None = None
        while True:
            where, params = ([], []) if user_id is None else (["user_id=?"], [user_id])
            if last is not None:
                where.append("(user_id, session_id, timestamp, id) > (?, ?, ?, ?)")
                params += list(last)
            sql = f"SELECT {ARCHIVE_COLS} FROM messages_archive" + (" WHERE " + " AND ".join(where) if where else "")
            turns = [archived_from_row(r) for r in
                     self.query(sql + f" ORDER BY user_id, session_id, timestamp, id LIMIT {int(page)}", params)]
            yield from turns
            if len(turns) < page:
                return
            last = (turns[-1].user_id, turns[-1].session_id, turns[-1].timestamp, turns[-1].id)

    def archived_count(self, user_id: str) -> int:
        return int(self.query("SELECT COUNT(*) FROM messages_archive WHERE user_id=?", (user_id,))[0][0])

    def archive_owners(self, ids: Sequence[str]) -> dict[str, str]:
        return self._owners("messages_archive", ids)

    def archived_by_ids(self, user_id: str, ids: Sequence[str]) -> dict[str, ArchivedTurn]:
        found: dict[str, ArchivedTurn] = {}
        for part in id_batches(sorted(set(ids))):
            found.update((t.id, t) for t in map(archived_from_row, self.query(
                f"SELECT {ARCHIVE_COLS} FROM messages_archive WHERE user_id=? AND id IN ({marks(len(part))})",
                [user_id, *part])))
        return found
