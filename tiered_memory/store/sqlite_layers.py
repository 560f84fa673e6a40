"""SQLite tables of the episodic, semantic and working layers, and their queries.

The tables join the core schema through ``SQLiteRecordStore.migrate("layers", ...)``
and are emptied for a user by the ``on_forget_user`` hook, inside the same
transaction that deletes the user's messages. Facts and episode key points have
their own FTS5 tables (keyword recall); their vectors live in the shared vector
index under ids with a ``:`` (``fact:<id>``, ``ep:<id>:<n>``), derived from these rows.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import ConfigurationError
from .sqlite import SQLiteRecordStore, on_forget_user

LAYER_MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS facts (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        type TEXT NOT NULL,
        text TEXT NOT NULL,
        key TEXT,
        polarity INTEGER NOT NULL DEFAULT 1,
        confidence REAL NOT NULL,
        source_ids TEXT NOT NULL DEFAULT '[]',
        metadata TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        valid_from REAL NOT NULL,
        invalid_at REAL,
        superseded_by TEXT,
        deleted_at REAL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access REAL,
        vector BLOB
    );
    CREATE INDEX IF NOT EXISTS facts_user ON facts(user_id, type);
    CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(
        text, content='facts', content_rowid='rowid', tokenize='porter unicode61'
    );
    CREATE TRIGGER IF NOT EXISTS facts_ai AFTER INSERT ON facts BEGIN
        INSERT INTO facts_fts(rowid, text) VALUES (new.rowid, new.text);
    END;
    CREATE TRIGGER IF NOT EXISTS facts_ad AFTER DELETE ON facts BEGIN
        INSERT INTO facts_fts(facts_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
    END;
    CREATE TRIGGER IF NOT EXISTS facts_au AFTER UPDATE OF text ON facts BEGIN
        INSERT INTO facts_fts(facts_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
        INSERT INTO facts_fts(rowid, text) VALUES (new.rowid, new.text);
    END;
    CREATE TABLE IF NOT EXISTS fact_history (
        seq INTEGER PRIMARY KEY,
        fact_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        action TEXT NOT NULL,
        old_text TEXT,
        new_text TEXT,
        at REAL NOT NULL,
        details TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX IF NOT EXISTS fact_history_fact ON fact_history(user_id, fact_id, seq);
    CREATE TABLE IF NOT EXISTS episodes (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        summary TEXT NOT NULL,
        body TEXT NOT NULL,
        turn_count INTEGER NOT NULL,
        start_ts REAL NOT NULL,
        end_ts REAL NOT NULL,
        source_ids TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access REAL,
        promoted_at REAL,
        compressed_at REAL
    );
    CREATE INDEX IF NOT EXISTS episodes_user ON episodes(user_id, end_ts);
    CREATE TABLE IF NOT EXISTS episode_points (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        episode_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        text TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS episode_points_ep ON episode_points(episode_id);
    CREATE VIRTUAL TABLE IF NOT EXISTS episode_points_fts USING fts5(
        text, content='episode_points', content_rowid='rowid', tokenize='porter unicode61'
    );
    CREATE TRIGGER IF NOT EXISTS episode_points_ai AFTER INSERT ON episode_points BEGIN
        INSERT INTO episode_points_fts(rowid, text) VALUES (new.rowid, new.text);
    END;
    CREATE TRIGGER IF NOT EXISTS episode_points_ad AFTER DELETE ON episode_points BEGIN
        INSERT INTO episode_points_fts(episode_points_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
    END;
    CREATE TABLE IF NOT EXISTS session_cursor (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        PRIMARY KEY (user_id, session_id)
    );
    CREATE TABLE IF NOT EXISTS working_items (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        type TEXT NOT NULL,
        text TEXT NOT NULL,
        importance REAL NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access REAL,
        deleted_at REAL,
        vector BLOB
    );
    CREATE INDEX IF NOT EXISTS working_session ON working_items(user_id, session_id);
    CREATE TABLE IF NOT EXISTS scratchpads (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        data TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (user_id, session_id)
    );
    CREATE TABLE IF NOT EXISTS messages_archive (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT NOT NULL,
        timestamp REAL NOT NULL,
        episode_id TEXT,
        archived_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS messages_archive_user ON messages_archive(user_id, session_id, timestamp);
    CREATE TABLE IF NOT EXISTS audit_log (
        seq INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        layer TEXT NOT NULL,
        item_id TEXT NOT NULL,
        action TEXT NOT NULL,
        at REAL NOT NULL,
        details TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX IF NOT EXISTS audit_user ON audit_log(user_id, layer, seq);
    """,
]

LAYER_TABLES = ("facts", "fact_history", "episodes", "episode_points", "session_cursor",
                "working_items", "scratchpads", "messages_archive", "audit_log")


@on_forget_user
def _forget_layers(c: sqlite3.Connection, user_id: str) -> None:
    present = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table in LAYER_TABLES:
        if table in present:
            c.execute(f"DELETE FROM {table} WHERE user_id=?", (user_id,))
    for fts in ("facts_fts", "episode_points_fts"):
        if fts in present:
            c.execute(f"INSERT INTO {fts}({fts}) VALUES ('optimize')")


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def to_blob(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()


def from_blob(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.float32)


class LayerStore:
    """Row access for the layers on top of a :class:`SQLiteRecordStore` (shares its lock)."""

    def __init__(self, store: object) -> None:
        if not isinstance(store, SQLiteRecordStore):
            raise ConfigurationError(
                "episodic, semantic and working memory need the embedded SQLite record store "
                f"in this version; got {type(store).__name__}")
        self.db = store
        store.migrate("layers", LAYER_MIGRATIONS)

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.query(sql, params)

    def transaction(self) -> Any:
        return self.db.transaction()

    def audit(self, c: sqlite3.Connection, user_id: str, layer: str, item_id: str, action: str,
              details: dict[str, Any] | None = None, at: float | None = None) -> None:
        c.execute("INSERT INTO audit_log (user_id, layer, item_id, action, at, details) VALUES (?,?,?,?,?,?)",
                  (user_id, layer, item_id, action, time.time() if at is None else at, dumps(details or {})))

    def audit_rows(self, user_id: str, layer: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT layer, item_id, action, at, details FROM audit_log WHERE user_id=?"
        params: list[Any] = [user_id]
        if layer:
            sql += " AND layer=?"
            params.append(layer)
        return [{"layer": r[0], "item_id": r[1], "action": r[2], "at": r[3], "details": json.loads(r[4])}
                for r in self.query(sql + " ORDER BY seq", params)]

    def keyword(self, table: str, user_id: str, match: str, k: int,
                extra: str = "", params: Sequence[Any] = ()) -> list[tuple[str, float]]:
        """BM25 over ``facts_fts`` or ``episode_points_fts``; returns (row id, score) best first."""
        fts = f"{table}_fts"
        sql = (f"SELECT t.id, -bm25({fts}) FROM {fts} JOIN {table} t ON t.rowid = {fts}.rowid"
               f" WHERE {fts} MATCH ? AND t.user_id = ? {extra} ORDER BY bm25({fts}) LIMIT ?")
        return [(r[0], float(r[1])) for r in self.query(sql, [match, user_id, *params, k])]

    # ---- session coverage ---------------------------------------------------
    def cursor(self, user_id: str, session_id: str) -> int:
        found = self.query("SELECT last_seq FROM session_cursor WHERE user_id=? AND session_id=?",
                           (user_id, session_id))
        return int(found[0][0]) if found else 0

    def set_cursor(self, c: sqlite3.Connection, user_id: str, session_id: str, seq: int) -> None:
        c.execute("INSERT INTO session_cursor VALUES (?,?,?) ON CONFLICT(user_id, session_id)"
                  " DO UPDATE SET last_seq=max(last_seq, excluded.last_seq)", (user_id, session_id, seq))

    def uncovered_count(self, user_id: str, session_id: str) -> int:
        return int(self.query(
            "SELECT COUNT(*) FROM messages WHERE user_id=? AND session_id=? AND rowid > ?",
            (user_id, session_id, self.cursor(user_id, session_id)))[0][0])

    def idle_sessions(self, user_id: str, before: float) -> list[str]:
        """Sessions with messages no episode covers yet, whose last message is before ``before``."""
        return [r[0] for r in self.query(
            "SELECT m.session_id FROM messages m LEFT JOIN session_cursor c"
            " ON c.user_id = m.user_id AND c.session_id = m.session_id"
            " WHERE m.user_id=? AND m.rowid > COALESCE(c.last_seq, 0)"
            " GROUP BY m.session_id HAVING max(m.timestamp) < ? ORDER BY min(m.rowid)",
            (user_id, before))]

    def archive_messages(self, c: sqlite3.Connection, user_id: str, ids: Sequence[str],
                         episode_id: str, now: float, *, delete: bool) -> int:
        """Move messages out of the hot table (and its FTS) into the archive, or delete them."""
        moved = 0
        for start in range(0, len(ids), 500):
            part = list(ids[start:start + 500])
            marks = ",".join("?" * len(part))
            if not delete:
                c.execute(
                    "INSERT OR IGNORE INTO messages_archive (id, user_id, session_id, role, content, metadata,"
                    f" timestamp, episode_id, archived_at) SELECT id, user_id, session_id, role, content, metadata,"
                    f" timestamp, ?, ? FROM messages WHERE user_id=? AND id IN ({marks})",
                    [episode_id, now, user_id, *part])
            moved += c.execute(f"DELETE FROM messages WHERE user_id=? AND id IN ({marks})",
                               [user_id, *part]).rowcount
        return moved

    def archived(self, user_id: str, session_id: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, session_id, role, content, timestamp, episode_id FROM messages_archive WHERE user_id=?"
        params: list[Any] = [user_id]
        if session_id is not None:
            sql += " AND session_id=?"
            params.append(session_id)
        return [{"id": r[0], "session_id": r[1], "role": r[2], "content": r[3], "timestamp": r[4],
                 "episode_id": r[5]} for r in self.query(sql + " ORDER BY timestamp", params)]
