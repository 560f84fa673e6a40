"""PostgreSQL record store: the source of truth shared by many workers on many hosts.

Same protocol as :class:`~tiered_memory.store.sqlite.SQLiteRecordStore`. Keyword search
uses PostgreSQL's own full-text search (a generated ``tsvector`` column with a GIN index,
ranked by ``ts_rank``; diacritics folded as on SQLite, :mod:`.postgres_keywords`).
Connections come from a ``psycopg_pool`` pool; every write batch is one transaction. The
schema lives in its own PostgreSQL schema (``tiered_memory`` by default) so it never
collides with an application's tables, and is created or migrated on first use, recorded
in the ``schema_migrations`` version table.

Example:
    >>> store = PostgresRecordStore("postgresql://app@db:5432/app")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..types import SessionInfo, StoredMessage
from .base import LONG_MESSAGE_CHARS, pend_duplicates, read_duplicates
from .filters import postgres_filter
from .pending_deletes import OwedRows, entries, owe_in
from .postgres_db import DEFAULT_SCHEMA, ROW_LOCK, SKIP_LOCKED, PostgresDatabase, lock_key
from .postgres_keywords import match_prepare, turn_matches
from .postgres_schema import MIGRATIONS
from .stored_values import json_dict, message_values
from .text_search import USER_SCAN_ROWS, scan_user_rows, text_key, tsquery_any

__all__ = ["MIGRATIONS", "PostgresRecordStore"]

_COLUMNS = "id, user_id, session_id, role, content, metadata, timestamp, seq"

#: The advisory locks that order a session's writes before the reads that settle it
#: (:meth:`PostgresRecordStore.settled_messages`): the two-key form, whose key space no one-key
#: lock shares, under this first key; sessions fold into TURN_LOCKS second keys, so a
#: transaction storing many sessions (an import) takes at most that many locks from the
#: server's lock table, and two sessions sharing one only wait for each other's commit.
TURN_LOCK_SPACE = 0x7475726E  # "turn"
TURN_LOCKS = 1024


def turn_lock(user_id: str, session_id: str) -> int:
    """The second key of the session's turn lock (stable across processes)."""
    return lock_key(f"{user_id}\x1f{session_id}") % TURN_LOCKS


def _row(r: Sequence[Any]) -> StoredMessage:
    role, content, ts = message_values(r)
    return StoredMessage(
        id=r[0], user_id=r[1], session_id=r[2], role=role, content=content,
        metadata=json_dict(r[5], "messages", r[0], "metadata"), timestamp=ts, seq=r[7],
    )


class PostgresRecordStore(PostgresDatabase):
    """Thread- and process-safe record store on PostgreSQL (shared by many workers).

    Takes the arguments of :class:`~.postgres_db.PostgresDatabase`: ``url`` (a libpq
    URL, ``postgresql://user:password@host:5432/dbname``), ``schema``, the pool's
    ``min_size``/``max_size`` and ``connect_timeout``; ``user_scan_rows`` is the user size
    below which keyword search (here and in the layer tables) starts from the user's rows
    (:func:`~.text_search.scan_user_rows`).
    """

    #: Many processes may open this store at once; TieredMemory takes no folder lock
    #: and leaves crash repair to an explicit call (see "Running at scale").
    shared = True

    def __init__(
        self, url: str, *, schema: str = DEFAULT_SCHEMA, min_size: int = 1, max_size: int = 8,
        connect_timeout: float | None = None, user_scan_rows: int = USER_SCAN_ROWS,
    ) -> None:
        super().__init__(url, schema=schema, min_size=min_size, max_size=max_size,
                         connect_timeout=connect_timeout)
        self.user_scan_rows = user_scan_rows
        self.owed_rows = OwedRows(self.transaction, self.read, p="%s", lock=ROW_LOCK, skip=SKIP_LOCKED)
        try:
            self.migrate("core", MIGRATIONS)
        except BaseException:
            self.pool.close()
            raise

    # ---- writes ---------------------------------------------------------
    def insert_messages(self, rows: list[StoredMessage], *, indexed: bool = False,
                        duplicates: Mapping[str, str] | None = None, sync: bool = True) -> None:
        if not rows:
            return
        dup = duplicates or {}

        locks = sorted({turn_lock(m.user_id, m.session_id) for m in rows})  # one order: no deadlock

        def run(conn: Any) -> None:
            with conn.cursor() as cur:
                if not sync:  # the server flushes it within a few hundred ms, or with the next synced commit
                    cur.execute("SET LOCAL synchronous_commit TO OFF")
                # held to the commit, before any seq is drawn: settled_messages waits for this write
                cur.execute("SELECT pg_advisory_xact_lock(%s::int, k) FROM unnest(%s::int[]) AS k",
                            (TURN_LOCK_SPACE, locks))
                cur.executemany(
                    "INSERT INTO messages (id, user_id, session_id, role, content, metadata, timestamp,"
                    " created_at, indexed, duplicate_of)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, extract(epoch FROM now()), %s, %s)",
                    [(m.id, m.user_id, m.session_id, m.role, m.content,
                      json.dumps(m.metadata, ensure_ascii=False), m.timestamp, indexed, dup.get(m.id))
                     for m in rows],
                )

        self.write(run)

    def sync(self) -> None:
        # a commit that writes (an id is assigned) waits for the WAL up to it, earlier commits included
        self.write(lambda c: c.execute("SELECT txid_current()"))

    def mark_indexed(self, ids: list[str], duplicates: dict[str, str]) -> None:
        if not ids:
            return
        ordered = sorted(set(ids))  # one lock order for every worker: no deadlocks
        self.write(lambda c: c.execute(
            "UPDATE messages m SET indexed=TRUE, duplicate_of=v.dup"
            " FROM unnest(%s::text[], %s::text[]) AS v(id, dup) WHERE m.id = v.id",
            (ordered, [duplicates.get(i) for i in ordered])))

    def touch(self, user_id: str, ids: list[str], now: float) -> None:
        if not ids:
            return
        counts: dict[str, int] = {}
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
        ordered = sorted(counts)
        self.write(lambda c: c.execute(
            "UPDATE messages m SET access_count=m.access_count+v.n, last_access=%s"
            " FROM unnest(%s::text[], %s::int[]) AS v(id, n) WHERE m.id = v.id AND m.user_id = %s",
            (now, ordered, [counts[i] for i in ordered], user_id)))

    def delete_message(self, user_id: str, message_id: str) -> bool:
        def run(c: Any) -> bool:
            c.execute(pend_duplicates("%s", user="%s"), (user_id, message_id))
            if not c.execute("DELETE FROM messages WHERE user_id=%s AND id=%s", (user_id, message_id)).rowcount:
                return False
            owe_in(c, entries(user_id, turns=[message_id]), time.time(), p="%s")  # till the index deletes them
            return True

        return bool(self.write(run))

    def clear_session(self, user_id: str, session_id: str) -> list[str]:
        def run(c: Any) -> list[str]:
            c.execute(pend_duplicates("SELECT id FROM messages WHERE user_id=%s AND session_id=%s", user="%s"),
                      (user_id, user_id, session_id))
            ids = [r[0] for r in c.execute("DELETE FROM messages WHERE user_id=%s AND session_id=%s RETURNING id",
                                           (user_id, session_id)).fetchall()]
            owe_in(c, entries(user_id, turns=ids), time.time(), p="%s")  # their vectors owed
            return ids

        return list(self.write(run))

    def forget_user(self, user_id: str) -> list[str]:
        from psycopg import sql

        def run(conn: Any) -> list[str]:
            ids = [r[0] for r in conn.execute(
                "DELETE FROM messages WHERE user_id=%s RETURNING id", (user_id,)).fetchall()]
            # every layer keys its rows by user_id: a table any migration adds is covered
            tables = [r[0] for r in conn.execute(
                "SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
                " WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"  # a name, not SQL
                " AND c.relkind = 'r'"
                " AND a.attname = 'user_id' AND NOT a.attisdropped AND c.relname <> 'messages'"
                " ORDER BY c.relname").fetchall()]
            for table in tables:
                conn.execute(sql.SQL("DELETE FROM {} WHERE user_id=%s").format(sql.Identifier(table)),
                             (user_id,))
            return ids

        return list(self.write(run))

    def reset_indexed(self) -> None:
        self.write(lambda c: c.execute("UPDATE messages SET indexed=FALSE, duplicate_of=NULL"))

    def reset_indexed_ids(self, ids: list[str]) -> None:
        if ids:
            self.write(lambda c: c.execute(
                "UPDATE messages SET indexed=FALSE, duplicate_of=NULL WHERE id = ANY(%s)",
                (sorted(set(ids)),)))

    def duplicates(self, user_id: str, session_id: str | None = None, *, originals: Sequence[str] | None = None,
                   filters: Mapping[str, Any] | None = None) -> dict[str, tuple[str, bool]]:
        return read_duplicates(self.query, user_id, session_id, originals, "%s", where=postgres_filter(filters or {}))

    def release_duplicates(self, user_id: str | None) -> list[StoredMessage]:
        whose, params = ("user_id=%s AND ", (user_id,)) if user_id is not None else ("", ())  # (the index's)
        rows = self.write(lambda c: c.execute(
            f"UPDATE messages m SET indexed=FALSE, duplicate_of=NULL WHERE {whose}duplicate_of IS NOT NULL"
            " AND NOT EXISTS (SELECT 1 FROM messages o WHERE o.id = m.duplicate_of)"
            f" RETURNING {', '.join('m.' + col.strip() for col in _COLUMNS.split(','))}", params).fetchall())
        return sorted((_row(r) for r in rows), key=lambda r: r.seq)

    # ---- reads ----------------------------------------------------------
    def get_messages(
        self, user_id: str, session_id: str, *, limit: int | None = None
    ) -> list[StoredMessage]:
        if limit is None:
            rows = self.query(
                f"SELECT {_COLUMNS} FROM messages WHERE user_id=%s AND session_id=%s ORDER BY seq",
                (user_id, session_id))
        else:
            rows = self.query(
                f"SELECT * FROM (SELECT {_COLUMNS} FROM messages WHERE user_id=%s AND session_id=%s"
                " ORDER BY seq DESC LIMIT %s) AS last ORDER BY seq",
                (user_id, session_id, limit))
        return [_row(r) for r in rows]

    def settled_messages(self, user_id: str, session_id: str) -> list[StoredMessage]:
        # a write of the session holds its turn lock from before it draws a seq to its commit: once
        # the shared lock is ours, each one either committed (seen by the next statement) or
        # draws its seq after this read, above every seq it returns
        def run(conn: Any) -> list[Any]:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock_shared(%s::int, %s::int)",
                             (TURN_LOCK_SPACE, turn_lock(user_id, session_id)))
                found: list[Any] = conn.execute(
                    f"SELECT {_COLUMNS} FROM messages WHERE user_id=%s AND session_id=%s ORDER BY seq",
                    (user_id, session_id)).fetchall()
                return found

        return [_row(r) for r in self.read(run)]

    def get_by_ids(self, user_id: str, ids: Iterable[str]) -> dict[str, StoredMessage]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        rows = self.query(
            f"SELECT {_COLUMNS} FROM messages WHERE user_id=%s AND id = ANY(%s)", (user_id, wanted))
        return {r[0]: _row(r) for r in rows}

    def _fenced(self, conn: Any, user_id: str) -> bool:
        """Whether the user's keyword match starts from their rows (:func:`.postgres_keywords.turn_matches`)."""
        return scan_user_rows(self.user_rows(conn, "messages", user_id, self.user_scan_rows), self.user_scan_rows)

    def session_gaps(self, user_id: str, pairs: Sequence[tuple[str, int, int]]) -> list[int]:
        """Each pair's count over the index on ``(user_id, session_id, seq)``, in one round trip."""
        if not pairs:
            return []
        rows = self.query(
            "SELECT (SELECT count(*) FROM messages m WHERE m.user_id = %s AND m.session_id = p.sid"
            " AND m.seq > p.lo AND m.seq <= p.hi)"
            " FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) WITH ORDINALITY AS p(sid, lo, hi, n) ORDER BY p.n",
            (user_id, [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]))
        return [int(r[0]) for r in rows]

    def same_text(self, user_id: str, texts: Sequence[str]) -> dict[str, str]:
        """For each of ``texts`` that an indexed, non-duplicate message of the user already
        holds (up to ASCII case and spaces at the ends, as on SQLite), that message's id: the
        ``messages_user_text`` index finds candidates, compared whole here (PostgreSQL's
        ``lower`` also folds letters beyond ASCII)."""
        keys = {t: text_key(t) for t in texts}
        found: dict[str, str] = {}
        wanted = sorted(set(texts))
        for start in range(0, len(wanted), 500):
            for mid, content in self.query(
                    "SELECT id, content FROM messages WHERE user_id = %s AND indexed AND duplicate_of IS NULL"
                    " AND md5(lower(btrim(content, ' '))) = ANY(ARRAY(SELECT md5(lower(btrim(t, ' ')))"
                    " FROM unnest(%s::text[]) AS t)) ORDER BY seq", (user_id, wanted[start:start + 500])):
                found.setdefault(text_key(content), mid)
        return {t: found[k] for t, k in keys.items() if k in found}

    def has_long_messages(self, user_id: str) -> bool:
        return bool(self.query(f"SELECT 1 FROM messages WHERE user_id = %s AND length(content) > {LONG_MESSAGE_CHARS}"
                               " LIMIT 1", (user_id,)))

    def keyword_search(
        self, user_id: str, terms: Sequence[str], *, k: int, session_id: str | None = None
    ) -> list[tuple[str, float]]:
        """PostgreSQL full-text search OR-ing ``terms``; higher score is better."""
        text = tsquery_any(terms)
        if text is None:
            return []
        session = " AND m.session_id = %(session)s" if session_id is not None else ""
        params = {"text": text, "user": user_id, "session": session_id, "k": k}

        def run(conn: Any) -> list[Any]:
            fenced = self._fenced(conn, user_id)
            return list(conn.execute(turn_matches(fenced, session), params, prepare=match_prepare(fenced)).fetchall())

        rows = self.read(run)
        return [(r[0], float(r[1])) for r in rows]

    def candidates(self, user_id: str, ids: Sequence[str], terms: Sequence[str], *, k: int,
                   session_id: str | None = None) -> tuple[dict[str, StoredMessage], list[tuple[str, float]]]:
        """Keyword matches and the records of them and of ``ids``, in one statement."""
        text = tsquery_any(terms)
        session = " AND m.session_id = %(session)s" if session_id is not None else ""
        cols = ", ".join(f"m.{c.strip()}" for c in _COLUMNS.split(","))
        params = {"text": text, "user": user_id, "session": session_id, "k": k, "ids": list(ids)}

        def run(conn: Any) -> list[tuple[Any, ...]]:
            fenced = text is None or self._fenced(conn, user_id)  # no words: nothing of the user's to match
            kw_cte = (turn_matches(fenced, session) if text is not None
                      else "SELECT NULL::text AS id, NULL::real AS s, NULL::bigint AS seq WHERE false")
            return list(conn.execute(
                # the wanted ids drive the join (the unique index on id): an OR of the two lists in
                # the WHERE clause read every row of the user instead (~55 ms for 10,000 rows)
                f"WITH kw AS ({kw_cte}), wanted AS (SELECT unnest(%(ids)s::text[]) AS id UNION SELECT id FROM kw)"
                f" SELECT {cols}, kw.s, kw.seq FROM wanted w JOIN messages m ON m.id = w.id"
                " LEFT JOIN kw ON kw.id = m.id WHERE m.user_id = %(user)s",
                params, prepare=match_prepare(fenced)).fetchall())

        rows: list[tuple[Any, ...]] = self.read(run)
        records = {r[0]: _row(r) for r in rows}
        kw = sorted(((r[0], float(r[-2]), r[-1]) for r in rows if r[-2] is not None), key=lambda t: (-t[1], -t[2]))
        return records, [(i, s) for i, s, _ in kw]

    def filtered_ids(self, user_id: str, filters: Mapping[str, Any], *, session_id: str | None = None,
                     limit: int) -> list[str]:
        where, params = postgres_filter(filters)
        if session_id is not None:
            where, params = where + " AND session_id = %s", [*params, session_id]
        return [r[0] for r in self.query(
            f"SELECT id FROM messages WHERE user_id = %s{where} ORDER BY seq DESC LIMIT %s", [user_id, *params, limit])]

    def neighbors(self, user_id: str, ids: list[str], window: int) -> dict[str, list[StoredMessage]]:
        """For each id, the messages of the same session within ``window`` positions (itself included)."""
        out: dict[str, list[StoredMessage]] = {mid: [] for mid in ids}
        if not ids:
            return out
        cols = ", ".join(f"m.{c.strip()}" for c in _COLUMNS.split(","))
        rows = self.query(  # one round trip for every id
            f"SELECT t.id, n.* FROM unnest(%s::text[]) AS t(id)"
            " JOIN messages c ON c.id = t.id AND c.user_id = %s"
            " CROSS JOIN LATERAL ("
            f"  (SELECT {cols} FROM messages m WHERE m.user_id = c.user_id AND m.session_id = c.session_id"
            "    AND m.seq <= c.seq ORDER BY m.seq DESC LIMIT %s)"
            f"  UNION ALL (SELECT {cols} FROM messages m WHERE m.user_id = c.user_id"
            "    AND m.session_id = c.session_id AND m.seq > c.seq ORDER BY m.seq LIMIT %s)) AS n",
            (list(dict.fromkeys(ids)), user_id, window + 1, window))
        for r in rows:
            out[r[0]].append(_row(r[1:]))
        for mid in out:
            out[mid].sort(key=lambda m: m.seq)
        return out

    def existing_ids(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` exist for any user (ids are global keys)."""
        if not ids:
            return set()
        return {r[0] for r in self.query("SELECT id FROM messages WHERE id = ANY(%s)", (list(ids),))}

    def pending_index(self, limit: int) -> list[StoredMessage]:
        return [_row(r) for r in self.query(
            f"SELECT {_COLUMNS} FROM messages WHERE NOT indexed ORDER BY seq LIMIT %s", (limit,))]

    def message_sessions(self, user_id: str, ids: Sequence[str] | None = None) -> dict[str, str]:
        if ids is None:
            return {r[0]: r[1] for r in self.query("SELECT id, session_id FROM messages WHERE user_id=%s", (user_id,))}
        return {r[0]: r[1] for r in self.query(
            "SELECT id, session_id FROM messages WHERE user_id=%s AND id = ANY(%s)", (user_id, sorted(set(ids))))}

    def indexed_ids(self, user_id: str | None = None, session_id: str | None = None) -> set[str]:
        sql, params = "SELECT id FROM messages WHERE indexed AND duplicate_of IS NULL", []
        if user_id is not None:
            sql, params = sql + " AND user_id=%s", [user_id]
            if session_id is not None:
                sql, params = sql + " AND session_id=%s", [user_id, session_id]
        return {r[0] for r in self.query(sql, params)}

    def iter_messages(self, user_id: str | None = None) -> Iterator[StoredMessage]:
        last = 0
        while True:
            if user_id is None:
                rows = self.query(
                    f"SELECT {_COLUMNS} FROM messages WHERE seq>%s ORDER BY seq LIMIT 1000", (last,))
            else:
                rows = self.query(
                    f"SELECT {_COLUMNS} FROM messages WHERE seq>%s AND user_id=%s ORDER BY seq LIMIT 1000",
                    (last, user_id))
            if not rows:
                return
            for r in rows:
                yield _row(r)
            last = rows[-1][7]

    def sessions(self, user_id: str) -> list[SessionInfo]:
        rows = self.query("SELECT session_id, COUNT(*), MIN(timestamp), MAX(timestamp) FROM messages"
                          " WHERE user_id=%s GROUP BY session_id ORDER BY MIN(seq)", (user_id,))
        return [SessionInfo(session_id=r[0], messages=r[1], first=r[2], last=r[3]) for r in rows]

    def counts(self) -> dict[str, int]:
        users, sessions, messages, indexed, dups = self.query(
            "SELECT COUNT(DISTINCT user_id), COUNT(DISTINCT (user_id, session_id)), COUNT(*),"
            " COUNT(*) FILTER (WHERE indexed), COUNT(duplicate_of) FROM messages")[0]
        return {"users": users, "sessions": sessions, "messages": messages,
                "indexed": indexed, "duplicates": dups}
