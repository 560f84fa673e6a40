"""SQLite record store (WAL, FTS5). The embedded default's source of truth.

The connection, its settings, transactions, migrations and durability are the
:class:`~.sqlite_db.SQLiteDatabase` below it; this class holds the messages' queries.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..types import SessionInfo, StoredMessage
from .base import LONG_MESSAGE_CHARS, pend_duplicates, read_duplicates
from .filters import sqlite_filter
from .pending_deletes import OwedRows, entries, owe_in
from .sqlite_db import APP_ID, SQLiteDatabase
from .sqlite_keywords import KeywordSearch, fill_missing, insert_deferred, tag_of, tags_for
from .sqlite_schema import MIGRATIONS, user_tables
from .stored_values import json_dict, message_values
from .text_search import keyword_text, same_text_sqlite, text_hash

__all__ = ["APP_ID", "MIGRATIONS", "SQLiteRecordStore", "user_tables"]

_COLUMNS = "id, user_id, session_id, role, content, metadata, timestamp, rowid"
# the largest rowid a message was ever given (meta): a message's rowid is its seq, which a
# session's episode cursor compares, so no rowid is given twice, even after the newest rows
# were deleted (forget, clear_session, consolidate's archive), as SQLite's own max + 1 would
ROWID_KEY = "messages_rowid_high"


def next_rowid(c: sqlite3.Connection) -> int:
    """The rowid the next message gets: past every rowid the table holds or ever gave."""
    found = c.execute("SELECT value FROM meta WHERE key=?", (ROWID_KEY,)).fetchone()
    top = int(c.execute("SELECT coalesce(max(rowid), 0) FROM messages").fetchone()[0])
    return max(top, int(found[0]) if found else 0) + 1


def _row(r: tuple[Any, ...]) -> StoredMessage:
    # what StoredMessage(...) builds (it has no __post_init__), without the __init__ of a frozen
    # dataclass, which sets each field through object.__setattr__: 3x the cost, and a search
    # reads some 400 rows
    m = object.__new__(StoredMessage)
    role, content, ts = r[3], r[4], r[6]
    if type(role) is not str or type(content) is not str or type(ts) is not float:  # another writer's row
        role, content, ts = message_values(r)
    m.__dict__.update(id=r[0], user_id=r[1], session_id=r[2], role=role, content=content,
                      metadata=json_dict(r[5], "messages", r[0], "metadata") if r[5] != "{}" else {},  # most carry none
                      timestamp=ts, seq=r[7])
    return m


class SQLiteRecordStore(SQLiteDatabase):
    """Thread-safe (one connection behind a lock); one process per file.

    Args:
        path: the database file; created with its schema when missing.
        read_only: read the file beside the process that writes it, writing nothing
            (:class:`~.sqlite_db.SQLiteDatabase`); rows that process has not yet given
            keywords are not found by keyword search until it does.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        super().__init__(path, read_only=read_only)
        self._keywords = KeywordSearch(self.query, self.tag)
        self.owed_rows = OwedRows(self.transaction, self._on_connection)
        try:
            self.migrate("core", MIGRATIONS)
            if not read_only:
                self._fill_keywords()
        except BaseException:
            self.close()
            raise

    # ---- writes ---------------------------------------------------------
    def insert_messages(self, rows: list[StoredMessage], *, indexed: bool = False,
                        duplicates: Mapping[str, str] | None = None, sync: bool = True) -> None:
        dup = duplicates or {}
        with self._synced(sync), self.transaction() as c:
            tags = tags_for(c, (m.user_id for m in rows))
            start = next_rowid(c)
            insert_deferred(
                c,
                "INSERT INTO messages (rowid, id, user_id, session_id, role, content, metadata, timestamp,"
                " created_at, keywords, text_hash, indexed, duplicate_of)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, strftime('%s','now'), ?, ?, ?, ?)",
                [
                    (start + n, m.id, m.user_id, m.session_id, m.role, m.content,
                     json.dumps(m.metadata, ensure_ascii=False) if m.metadata else "{}", m.timestamp,
                     keyword_text(tags[m.user_id], m.content), text_hash(m.content), int(indexed), dup.get(m.id))
                    for n, m in enumerate(rows)
                ],
            )
            if rows:
                c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (ROWID_KEY, str(start + len(rows) - 1)))

    def _on_connection(self, fn: Callable[[Any], Any]) -> Any:
        self.check_usable()
        with self.lock:
            return fn(self.conn)

    def _fill_keywords(self) -> None:
        """Index rows written by other means than :meth:`insert_messages` (their keywords
        unset); the check is one probe of an index that holds only such rows."""
        if self.query("SELECT 1 FROM messages INDEXED BY messages_unkeyed WHERE keywords IS NULL LIMIT 1"):
            with self.transaction() as c:
                fill_missing(c)

    def mark_indexed(self, ids: list[str], duplicates: dict[str, str]) -> None:
        with self.unsynced_transaction() as c:  # a mark lost leaves the rows pending: indexed again
            c.executemany(
                "UPDATE messages SET indexed=1, duplicate_of=? WHERE id=?",
                [(duplicates.get(i), i) for i in ids],
            )

    def touch(self, user_id: str, ids: list[str], now: float) -> None:
        if ids:
            with self.transaction() as c:
                c.executemany(
                    "UPDATE messages SET access_count=access_count+1, last_access=? WHERE id=? AND user_id=?",
                    [(now, i, user_id) for i in ids],
                )

    def delete_message(self, user_id: str, message_id: str) -> bool:
        with self.transaction() as c:
            c.execute(pend_duplicates("?"), (user_id, message_id))
            cur = c.execute("DELETE FROM messages WHERE user_id=? AND id=?", (user_id, message_id))
            if cur.rowcount > 0:  # its vectors are owed to the index until it deletes them
                owe_in(c, entries(user_id, turns=[message_id]), time.time())
            return cur.rowcount > 0

    def clear_session(self, user_id: str, session_id: str) -> list[str]:
        with self.transaction() as c:
            ids = [r[0] for r in c.execute(
                "SELECT id FROM messages WHERE user_id=? AND session_id=?", (user_id, session_id))]
            c.execute(pend_duplicates("SELECT id FROM messages WHERE user_id=? AND session_id=?"),
                      (user_id, user_id, session_id))
            c.execute("DELETE FROM messages WHERE user_id=? AND session_id=?", (user_id, session_id))
            owe_in(c, entries(user_id, turns=ids), time.time())
            return ids

    def forget_user(self, user_id: str) -> list[str]:
        with self.transaction() as c:
            ids = [r[0] for r in c.execute("SELECT id FROM messages WHERE user_id=?", (user_id,))]
            for table in user_tables(c):  # messages and every layer's table: each has user_id
                c.execute(f"DELETE FROM {table} WHERE user_id=?", (user_id,))
        with self.lock:
            # rebuild the FTS shadow tables' free pages so deleted text does not linger on disk
            for (fts,) in self.conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' AND sql LIKE 'CREATE VIRTUAL TABLE%fts5%'"
            ).fetchall():
                self.conn.execute(f"INSERT INTO {fts}({fts}) VALUES ('optimize')")
        return ids

    # ---- reads ----------------------------------------------------------
    def get_messages(
        self, user_id: str, session_id: str, *, limit: int | None = None
    ) -> list[StoredMessage]:
        if limit is None:
            rows = self.query(
                f"SELECT {_COLUMNS} FROM messages WHERE user_id=? AND session_id=? ORDER BY rowid",
                (user_id, session_id),
            )
        else:
            rows = self.query(
                f"SELECT * FROM (SELECT {_COLUMNS} FROM messages WHERE user_id=? AND session_id=?"
                " ORDER BY rowid DESC LIMIT ?) ORDER BY rowid",
                (user_id, session_id, limit),
            )
        return [_row(r) for r in rows]

    def get_by_ids(self, user_id: str, ids: Iterable[str]) -> dict[str, StoredMessage]:
        return {r[0]: _row(r) for r in self._rows_by_id(_COLUMNS, user_id, ids)}

    def _rows_by_id(self, columns: str, user_id: str, ids: Iterable[str]) -> Iterator[tuple[Any, ...]]:
        """``columns`` of the user's rows among ``ids``, 500 ids a query."""
        wanted = list(dict.fromkeys(ids))
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            # +user_id: the unique index on id finds the rows; one on (user_id, ...) would
            # scan every row of the user (measured: 240 vs 0.3 ms at 30,000)
            yield from self.query(
                f"SELECT {columns} FROM messages WHERE +user_id=? AND id IN ({','.join('?' * len(part))})",
                [user_id, *part])

    def keyword_search(
        self, user_id: str, terms: Sequence[str], *, k: int, session_id: str | None = None
    ) -> list[tuple[str, float]]:
        """BM25 over FTS5 within the user's posting lists; higher score is better
        (:class:`~.sqlite_keywords.KeywordSearch`)."""
        return self._keywords.search(user_id, terms, k=k, session_id=session_id)

    def tag(self, user_id: str) -> str | None:
        """The user's tag in the keyword indexes (:func:`~.text_search.user_tag`); ``None`` for
        a user who never wrote."""
        with self.lock:
            return tag_of(self.conn, user_id)

    def candidates(self, user_id: str, ids: Sequence[str], terms: Sequence[str], *, k: int,
                   session_id: str | None = None) -> tuple[dict[str, StoredMessage], list[tuple[str, float]]]:
        """Keyword matches and the records of them and of ``ids``, under one lock."""
        with self.lock:
            kw = self.keyword_search(user_id, terms, k=k, session_id=session_id) if terms else []
            return self.get_by_ids(user_id, [*ids, *(i for i, _ in kw)]), kw

    def filtered_ids(self, user_id: str, filters: Mapping[str, Any], *, session_id: str | None = None,
                     limit: int) -> list[str]:
        where, params = sqlite_filter(filters)
        if session_id is not None:
            where, params = where + " AND session_id = ?", [*params, session_id]
        return [r[0] for r in self.query(
            f"SELECT id FROM messages WHERE user_id = ?{where} ORDER BY rowid DESC LIMIT ?", [user_id, *params, limit])]

    def neighbors(self, user_id: str, ids: list[str], window: int) -> dict[str, list[StoredMessage]]:
        """For each id, the messages of the same session within ``window`` positions (itself included)."""
        out: dict[str, list[StoredMessage]] = {mid: [] for mid in ids}
        wanted = list(dict.fromkeys(ids))
        for start in range(0, len(wanted), 300):  # one query per 300 ids, not one per id
            out.update(self._neighbors(user_id, wanted[start:start + 300], window))
        return out

    def _neighbors(self, user_id: str, ids: list[str], window: int) -> dict[str, list[StoredMessage]]:
        targets = self.query(
            f"SELECT id, session_id, rowid FROM messages WHERE +user_id=? AND id IN ({','.join('?' * len(ids))})",
            [user_id, *ids])
        if not targets:
            return {}
        # rowids are global, so a session's turns may be spread out: look 4x wider, then count
        # positions. The ranges (one a target, found by the index on (user_id, session_id, rowid),
        # all in one statement) read only ids and rowids; the rows that are someone's neighbour
        # are then read once
        span = window * 4
        by_session: dict[str, dict[str, int]] = {}
        ranges = self.query(
            "WITH t(sid, lo, hi) AS (VALUES " + ",".join("(?,?,?)" for _ in targets) + ")"
            " SELECT m.session_id, m.id, m.rowid FROM t JOIN messages m ON m.user_id=? AND m.session_id=t.sid"
            " AND m.rowid BETWEEN t.lo AND t.hi",
            [*(v for _, sid, seq in targets for v in (sid, seq - span, seq + span)), user_id])
        for sid, mid, rowid in ranges:
            by_session.setdefault(sid, {})[mid] = rowid
        ordered = {sid: sorted(found, key=found.__getitem__) for sid, found in by_session.items()}
        near: dict[str, list[str]] = {}
        for mid, sid, _ in targets:
            ids_in_order = ordered.get(sid, [])
            if mid not in ids_in_order:  # deleted by another thread since `targets` was read: none, as
                continue  # for an id the store never held (PostgreSQL reads both in one statement)
            pos = ids_in_order.index(mid)
            near[mid] = ids_in_order[max(0, pos - window): pos + window + 1]
        rows = self.get_by_ids(user_id, [i for around in near.values() for i in around])
        return {mid: [rows[i] for i in around if i in rows] for mid, around in near.items()}

    def session_gaps(self, user_id: str, pairs: Sequence[tuple[str, int, int]]) -> list[int]:
        """Each pair's count over the covering index on ``(user_id, session_id, rowid)``, a
        statement per 300 pairs; SQLite counts, so no row comes back to Python."""
        out: list[int] = []
        for start in range(0, len(pairs), 300):
            part = pairs[start:start + 300]
            rows = self.query(
                "WITH p(n, sid, lo, hi) AS (VALUES " + ",".join("(?,?,?,?)" for _ in part) + ")"
                " SELECT (SELECT count(*) FROM messages m WHERE m.user_id=? AND m.session_id=p.sid"
                " AND m.rowid > p.lo AND m.rowid <= p.hi) FROM p ORDER BY p.n",
                [*(v for n, pair in enumerate(part) for v in (n, *pair)), user_id])
            out.extend(int(r[0]) for r in rows)
        return out

    def has_long_messages(self, user_id: str) -> bool:
        return bool(self.query("SELECT 1 FROM messages INDEXED BY messages_long WHERE user_id=?"
                               f" AND length(content) > {LONG_MESSAGE_CHARS} LIMIT 1", (user_id,)))

    def same_text(self, user_id: str, texts: Sequence[str]) -> dict[str, str]:
        """For each of ``texts`` that an indexed, non-duplicate message of the user already
        holds (up to ASCII case and spaces at the ends), that message's id."""
        return same_text_sqlite(self.query, user_id, texts)

    def existing_ids(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` exist for any user (ids are global keys)."""
        out: set[str] = set()
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            out |= {r[0] for r in self.query(
                f"SELECT id FROM messages WHERE id IN ({','.join('?' * len(part))})", part)}
        return out

    def pending_index(self, limit: int) -> list[StoredMessage]:
        return [_row(r) for r in self.query(
            f"SELECT {_COLUMNS} FROM messages WHERE indexed=0 ORDER BY rowid LIMIT ?", (limit,))]

    def message_sessions(self, user_id: str, ids: Sequence[str] | None = None) -> dict[str, str]:
        if ids is not None:
            return {r[0]: r[1] for r in self._rows_by_id("id, session_id", user_id, ids)}
        return {r[0]: r[1] for r in self.query("SELECT id, session_id FROM messages WHERE user_id=?", (user_id,))}

    def indexed_ids(self, user_id: str | None = None, session_id: str | None = None) -> set[str]:
        sql, params = "SELECT id FROM messages WHERE indexed=1 AND duplicate_of IS NULL", []
        if user_id is not None:
            sql, params = sql + " AND user_id=?", [user_id]
            if session_id is not None:
                sql, params = sql + " AND session_id=?", [user_id, session_id]
        return {r[0] for r in self.query(sql, params)}

    def reset_indexed(self) -> None:
        self._fill_keywords()  # the keyword index is derived too: a rebuild covers every row
        with self.transaction() as c:
            c.execute("UPDATE messages SET indexed=0, duplicate_of=NULL")

    def reset_indexed_ids(self, ids: list[str]) -> None:
        with self.transaction() as c:
            c.executemany("UPDATE messages SET indexed=0, duplicate_of=NULL WHERE id=?", [(i,) for i in ids])

    def duplicates(self, user_id: str, session_id: str | None = None, *, originals: Sequence[str] | None = None,
                   filters: Mapping[str, Any] | None = None) -> dict[str, tuple[str, bool]]:
        return read_duplicates(self.query, user_id, session_id, originals,
                               session_index="INDEXED BY messages_user_session", where=sqlite_filter(filters or {}))

    def release_duplicates(self, user_id: str | None) -> list[StoredMessage]:
        with self.transaction() as c:
            whose, params = ("user_id=? AND ", (user_id,)) if user_id is not None else ("", ())  # (the index's)
            rows = [_row(r) for r in c.execute(
                f"SELECT {_COLUMNS} FROM messages m WHERE {whose}duplicate_of IS NOT NULL"
                " AND NOT EXISTS (SELECT 1 FROM messages o WHERE o.id = m.duplicate_of) ORDER BY rowid", params)]
            c.executemany("UPDATE messages SET indexed=0, duplicate_of=NULL WHERE id=?", [(r.id,) for r in rows])
        return rows

    def iter_messages(self, user_id: str | None = None) -> Iterator[StoredMessage]:
        last = 0
        while True:
            if user_id is None:
                rows = self.query(f"SELECT {_COLUMNS} FROM messages WHERE rowid>? ORDER BY rowid LIMIT 1000", (last,))
            else:
                rows = self.query(
                    f"SELECT {_COLUMNS} FROM messages WHERE rowid>? AND user_id=? ORDER BY rowid LIMIT 1000",
                    (last, user_id),
                )
            if not rows:
                return
            for r in rows:
                yield _row(r)
            last = rows[-1][7]

    def sessions(self, user_id: str) -> list[SessionInfo]:
        rows = self.query("SELECT session_id, COUNT(*), MIN(timestamp), MAX(timestamp) FROM messages"
                          " WHERE user_id=? GROUP BY session_id ORDER BY MIN(rowid)", (user_id,))
        return [SessionInfo(session_id=r[0], messages=r[1], first=r[2], last=r[3]) for r in rows]

    def counts(self) -> dict[str, int]:
        users, sessions, messages, indexed, dups = self.query(
            "SELECT COUNT(DISTINCT user_id), COUNT(DISTINCT user_id || char(31) || session_id),"
            " COUNT(*), COALESCE(SUM(indexed),0), COUNT(duplicate_of) FROM messages"
        )[0]
        return {"users": users, "sessions": sessions, "messages": messages,
                "indexed": indexed, "duplicates": dups}
