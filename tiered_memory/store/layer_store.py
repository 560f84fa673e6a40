"""Row access for the episodic, semantic and working layers, common to every record store.

The layer modules write their SQL once, in the portable subset SQLite and PostgreSQL
share, with ``?`` placeholders. A backend subclass of :class:`LayerStore` supplies the
schema and the few parts that differ: placeholders, the messages' order column,
full-text ranking, ``max`` of two values, and locking a session across workers.
:func:`open_layer_store` picks the subclass for a record store.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from typing import Any, Iterable, Sequence

import numpy as np



def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def to_blob(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()


def from_blob(blob: bytes | memoryview | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(bytes(blob), dtype=np.float32)


class LayerStore:
    """Layer rows on top of a record store; subclasses bind the SQL dialect.

    ``transaction()`` yields a connection whose ``execute``/``executemany`` take ``?``
    placeholders and return a cursor (``fetchone``, ``fetchall``, ``rowcount``).
    """

    #: which SQL dialect: "sqlite" or "postgres" (picks a migration list)
    dialect = ""
    #: the messages table's insertion-order column
    message_order = "rowid"
    #: the SQL function for the larger of two values
    greatest = "max"

    def __init__(self, store: Any) -> None:
        self.db = store

    def migrate(self, name: str, steps: Sequence[Any]) -> None:
        """Apply the named migration list of a layer on the record store (once per step)."""
        self.db.migrate(name, steps)

    # ---- dialect ------------------------------------------------------------
    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def keyword(self, table: str, user_id: str, terms: Sequence[str], k: int,
                extra: str = "", params: Sequence[Any] = ()) -> list[tuple[str, float]]:
        """Full-text search over ``facts``, ``episode_points`` or ``items`` OR-ing ``terms``
        (each dialect writes its own syntax); ``extra`` filters on alias ``t``.
        Returns (row id, score) best first."""
        raise NotImplementedError

    def lock_session(self, c: Any, user_id: str, session_id: str) -> None:
        """Serialise writes to one session's episodes and scratchpad across workers, until ``c``
        commits (a no-op where the store serves one process)."""

    # ---- audit -----------------------------------------------------------------
    def audit(self, c: Any, user_id: str, layer: str, item_id: str, action: str,
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

    # ---- session coverage ---------------------------------------------------
    def cursor(self, user_id: str, session_id: str, c: Any = None) -> int:
        """The last message seq an episode of the session covers (0: none); inside ``c``'s
        transaction if given."""
        sql, params = "SELECT last_seq FROM session_cursor WHERE user_id=? AND session_id=?", (user_id, session_id)
        found = c.execute(sql, params).fetchall() if c is not None else self.query(sql, params)
        return int(found[0][0]) if found else 0

    def set_cursor(self, c: Any, user_id: str, session_id: str, seq: int) -> None:
        c.execute("INSERT INTO session_cursor (user_id, session_id, last_seq) VALUES (?,?,?)"
                  " ON CONFLICT (user_id, session_id) DO UPDATE"
                  f" SET last_seq={self.greatest}(session_cursor.last_seq, excluded.last_seq)",
                  (user_id, session_id, seq))

    def uncovered_count(self, user_id: str, session_id: str, *, role: str | None = None) -> int:
        """Messages of the session (of ``role`` if given) that no episode covers yet."""
        sql = (f"SELECT COUNT(*) FROM messages WHERE user_id=? AND session_id=?"
               f" AND {self.message_order} > ?")
        params: list[Any] = [user_id, session_id, self.cursor(user_id, session_id)]
        if role is not None:
            sql += " AND role=?"
            params.append(role)
        return int(self.query(sql, params)[0][0])

    def idle_sessions(self, user_id: str, before: float) -> list[str]:
        """Sessions with messages no episode covers yet, whose last message is before ``before``."""
        order = f"m.{self.message_order}"
        return [r[0] for r in self.query(
            "SELECT m.session_id FROM messages m LEFT JOIN session_cursor c"
            " ON c.user_id = m.user_id AND c.session_id = m.session_id"
            f" WHERE m.user_id=? AND {order} > COALESCE(c.last_seq, 0)"
            f" GROUP BY m.session_id HAVING max(m.timestamp) < ? ORDER BY min({order})",
            (user_id, before))]

    # ---- archive ---------------------------------------------------------------
    def archive_messages(self, c: Any, user_id: str, ids: Sequence[str],
                         episode_id: str, now: float, *, delete: bool) -> int:
        """Move messages out of the hot table (and its full-text index) into the archive, or delete them."""
        moved = 0
        for start in range(0, len(ids), 500):
            part = list(ids[start:start + 500])
            marks = ",".join("?" * len(part))
            if not delete:
                c.execute(
                    "INSERT INTO messages_archive (id, user_id, session_id, role, content, metadata,"
                    " timestamp, episode_id, archived_at) SELECT id, user_id, session_id, role, content, metadata,"
                    f" timestamp, ?, ? FROM messages WHERE user_id=? AND id IN ({marks})"
                    " ON CONFLICT DO NOTHING",
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
