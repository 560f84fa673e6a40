"""SQLite record store (WAL, FTS5). The embedded default's source of truth."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..errors import CorruptStoreError, StoreError
from ..types import SessionInfo, StoredMessage
from .base import LONG_MESSAGE_CHARS
from .filters import sqlite_filter
from .sqlite_keywords import KeywordSearch, fill_missing, insert_deferred, tag_of, tags_for
from .sqlite_schema import MIGRATIONS, Step, split_sql, user_tables
from .text_search import keyword_text, same_text_sqlite, text_hash

APP_ID = "tiered-memory"
__all__ = ["APP_ID", "MIGRATIONS", "SQLiteRecordStore", "user_tables"]

_COLUMNS = "id, user_id, session_id, role, content, metadata, timestamp, rowid"
# 32 MiB of page cache per connection (SQLite's default is 2): re-reading FTS5 posting lists
# cost ~25% of a keyword search at 24,000 memories (measured while they held every user's rows)
CACHE_KIB = 32768
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default; none between unsynced commits (see _synced)
WAL_LIMIT_BYTES = 64 << 20  # a WAL grown by a long bulk write is cut back to this once checkpointed


def _row(r: tuple[Any, ...]) -> StoredMessage:
    return StoredMessage(
        id=r[0], user_id=r[1], session_id=r[2], role=r[3], content=r[4],
        metadata=json.loads(r[5]) if r[5] != "{}" else {}, timestamp=r[6], seq=r[7],  # most turns carry none
    )


class SQLiteRecordStore:
    """Thread-safe (one connection behind a lock); one process per file.

    Args:
        path: the database file; created with its schema when missing.
        extra_migrations: migrations of other layers, keyed by name, applied after ours.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock = threading.RLock()
        self._keywords = KeywordSearch(self.query, self._tag)
        conn: sqlite3.Connection | None = None
        try:
            self.conn = conn = sqlite3.connect(
                str(self.path), check_same_thread=False, isolation_level=None, timeout=30
            )
            # identify the file before changing anything in it (WAL mode is persistent)
            self._check_identity()
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            # freed pages are zeroed, so forgotten text does not linger in the file
            self.conn.execute("PRAGMA secure_delete=ON")
            self.conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            self.conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        except sqlite3.DatabaseError as e:
            if conn is not None:
                conn.close()
            raise CorruptStoreError(
                f"{self.path} is not a readable tiered-memory database ({e}). "
                "Point `path` at an empty or tiered-memory folder."
            ) from e
        except CorruptStoreError:
            if conn is not None:
                conn.close()
            raise
        self.migrate("core", MIGRATIONS)
        self._fill_keywords()

    # ---- plumbing -------------------------------------------------------
    def _check_identity(self) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            with self.transaction() as c:
                c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                c.execute("INSERT INTO meta VALUES ('app', ?)", (APP_ID,))
            return
        app = None
        if "meta" in tables:
            found = self.conn.execute("SELECT value FROM meta WHERE key='app'").fetchone()
            app = found[0] if found else None
        if app != APP_ID:
            raise CorruptStoreError(
                f"{self.path} is a SQLite database that tiered-memory did not create "
                f"(tables: {sorted(tables)[:5]}). Use another path."
            )

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException as e:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"record store write failed: {e}") from e
                raise

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self.lock:
            try:
                return self.conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"record store read failed: {e}") from e

    def migrate(self, name: str, steps: Sequence[Step]) -> None:
        """Apply the ``steps`` not yet recorded for ``name`` in ``schema_migrations``, each in its
        own transaction with its version row."""
        if not self.query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'"):
            with self.transaction() as c:  # once per file: not a write transaction on every open
                c.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT NOT NULL,"
                          " version INTEGER NOT NULL, applied_at REAL NOT NULL, PRIMARY KEY (name, version))")
        current = self.schema_version(name)
        for version, step in enumerate(steps[current:], start=current + 1):
            with self.transaction() as c:
                if callable(step):
                    step(c)
                else:
                    for statement in split_sql(step):
                        c.execute(statement)
                c.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (name, version, time.time()))

    def schema_version(self, name: str = "core") -> int:
        """The last migration applied for ``name`` (earlier stores kept it in ``meta``)."""
        recorded = self.query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations WHERE name=?", (name,))
        return max(int(recorded[0][0]), int(self.get_meta(f"schema_version:{name}") or 0))

    def get_meta(self, key: str) -> str | None:
        found = self.query("SELECT value FROM meta WHERE key=?", (key,))
        return found[0][0] if found else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # ---- writes ---------------------------------------------------------
    def insert_messages(self, rows: list[StoredMessage], *, indexed: bool = False,
                        duplicates: Mapping[str, str] | None = None, sync: bool = True) -> None:
        dup = duplicates or {}
        with self._synced(sync), self.transaction() as c:
            tags = tags_for(c, (m.user_id for m in rows))
            insert_deferred(
                c,
                "INSERT INTO messages (id, user_id, session_id, role, content, metadata, timestamp,"
                " created_at, keywords, text_hash, indexed, duplicate_of)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, strftime('%s','now'), ?, ?, ?, ?)",
                [
                    (m.id, m.user_id, m.session_id, m.role, m.content,
                     json.dumps(m.metadata, ensure_ascii=False) if m.metadata else "{}", m.timestamp,
                     keyword_text(tags[m.user_id], m.content), text_hash(m.content), int(indexed), dup.get(m.id))
                    for m in rows
                ],
            )

    @contextlib.contextmanager
    def _synced(self, sync: bool) -> Iterator[None]:
        """Commits inside wait for the disk (``synchronous=FULL``, the default) or not
        (``NORMAL``: in WAL mode a crash of the process keeps them, a power cut may lose
        them until the next FULL commit, whose sync of the WAL covers every frame before it)."""
        with self.lock:
            if sync:
                yield
                return
            # and no checkpoint between them: each would sync the database file (a bulk write's
            # chunks checkpointed at nearly every commit); the next FULL commit checkpoints
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
            try:
                yield
            finally:
                self.conn.execute("PRAGMA synchronous=FULL")
                self.conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")

    def sync(self) -> None:
        # every commit is in the WAL, in order: syncing the file is what a FULL commit does
        wal = self.path.with_name(self.path.name + "-wal")
        with self.lock:
            try:
                fd = os.open(wal, os.O_RDONLY)
            except FileNotFoundError:
                return  # checkpointed and removed: the database file holds it all
            try:
                os.fsync(fd)
            except OSError as e:
                raise StoreError(f"record store sync failed: {e}") from e
            finally:
                os.close(fd)

    def _fill_keywords(self) -> None:
        """Index rows written by other means than :meth:`insert_messages` (their keywords
        unset); the check is one probe of an index that holds only such rows."""
        if self.query("SELECT 1 FROM messages INDEXED BY messages_unkeyed WHERE keywords IS NULL LIMIT 1"):
            with self.transaction() as c:
                fill_missing(c)

    def mark_indexed(self, ids: list[str], duplicates: dict[str, str]) -> None:
        # Without its own fsync: a mark lost to a power cut leaves the rows pending, and the
        # next open indexes them again (upserts are idempotent), so it need not be durable
        # on its own; the next durable commit syncs it with everything before it.
        with self._synced(False), self.transaction() as c:
            c.executemany(
                "UPDATE messages SET indexed=1, duplicate_of=? WHERE id=?",
                [(duplicates.get(i), i) for i in ids],
            )

    def touch(self, ids: list[str], now: float) -> None:
        if ids:
            with self.transaction() as c:
                c.executemany(
                    "UPDATE messages SET access_count=access_count+1, last_access=? WHERE id=?",
                    [(now, i) for i in ids],
                )

    def delete_message(self, user_id: str, message_id: str) -> bool:
        with self.transaction() as c:
            cur = c.execute("DELETE FROM messages WHERE user_id=? AND id=?", (user_id, message_id))
            return cur.rowcount > 0

    def clear_session(self, user_id: str, session_id: str) -> list[str]:
        with self.transaction() as c:
            ids = [r[0] for r in c.execute(
                "SELECT id FROM messages WHERE user_id=? AND session_id=?", (user_id, session_id))]
            c.execute("DELETE FROM messages WHERE user_id=? AND session_id=?", (user_id, session_id))
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

    def _tag(self, user_id: str) -> str | None:
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
        # rowids are global, so a session's turns may be spread out: look 4x wider, then count positions
        span = window * 4
        by_session: dict[str, dict[str, StoredMessage]] = {}
        with self.lock:  # one simple index range per target: cheaper than one query OR-ing them
            try:
                for _, sid, seq in targets:
                    for r in self.conn.execute(
                            f"SELECT {_COLUMNS} FROM messages WHERE user_id=? AND session_id=?"
                            " AND rowid BETWEEN ? AND ?", (user_id, sid, seq - span, seq + span)):
                        by_session.setdefault(sid, {})[r[0]] = _row(r)
            except sqlite3.Error as e:
                raise StoreError(f"record store read failed: {e}") from e
        ordered = {sid: sorted(found.values(), key=lambda m: m.seq) for sid, found in by_session.items()}
        out: dict[str, list[StoredMessage]] = {}
        for mid, sid, _ in targets:
            msgs = ordered[sid]
            pos = next(i for i, m in enumerate(msgs) if m.id == mid)
            out[mid] = msgs[max(0, pos - window): pos + window + 1]
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
