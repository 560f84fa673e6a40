"""SQLite's keyword index: per-user posting lists, kept by triggers, written in bulk, queried per user.

Each row of ``messages`` holds ``keywords``: its words, each with its user's tag in front
(:func:`~.text_search.keyword_text`; ``7q`` + ``violin`` -> ``7qviolin``), computed in
Python when the row is written. ``messages_fts`` is an FTS5 table of that one column,
external content over ``messages``. A user's tagged word is a token no other user's row
holds, so a keyword query walks the posting lists of that user's rows only, and BM25
counts a term's rows within the user (its N and average length stay the store's). The
layer tables (facts, episode key points, items) are indexed the same way, their keywords
computed by their triggers (``sqlite_layers.tagged_index``).

Invariants:

- The FTS5 table is fed only by triggers that read the stored ``keywords`` column, on
  insert, delete and update of it. Whoever writes a row, the entry FTS5 is told to delete
  is the one it was given, so the index can not be made inconsistent. A row written by
  other means without ``keywords`` is indexed as an empty document (found by no keyword)
  until :func:`fill_missing` computes its words (on open and on ``rebuild_index``).
- :func:`insert_deferred` skips the per-row insert trigger while ``fts_deferred`` holds its
  one row, and writes the batch's entries in one ``INSERT .. SELECT``. The guard row lives
  only inside that one write transaction: other connections never see it, a crash rolls
  it back, and any other insert runs the trigger.
- A tag is a number from ``user_tags`` (``AUTOINCREMENT``: never reused, so a forgotten
  user's tag can not come back as someone else's). The user's id goes nowhere in the text.
"""

from __future__ import annotations

import re
import sqlite3
import unicodedata
from typing import Any, Callable, Iterable, Iterator, Sequence

from .text_search import (CJK, SELECTIVE_FROM_ROWS, TermCounts, keyword_text, selective_terms, tagged_phrases, text_hash,
                          user_tag)

FTS_TABLE = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
    keywords, content='messages', content_rowid='rowid', tokenize='porter unicode61'
)"""

TRIGGERS = [
    """CREATE TRIGGER messages_ai AFTER INSERT ON messages WHEN NOT EXISTS (SELECT 1 FROM fts_deferred) BEGIN
        INSERT INTO messages_fts(rowid, keywords) VALUES (new.rowid, new.keywords);
    END""",
    """CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, keywords) VALUES ('delete', old.rowid, old.keywords);
    END""",
    """CREATE TRIGGER messages_au AFTER UPDATE OF keywords ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, keywords) VALUES ('delete', old.rowid, old.keywords);
        INSERT INTO messages_fts(rowid, keywords) VALUES (new.rowid, new.keywords);
    END""",
]

FILL_BATCH = 5000


def upgrade(c: sqlite3.Connection) -> None:
    """The migration to per-user keywords: the column, the tag and guard tables, every
    row's keywords (in batches, before the index exists, so no trigger runs), then the FTS5
    table rebuilt from them and its triggers. Safe to run on a store that has the column."""
    for trigger in ("messages_ai", "messages_ad", "messages_au"):
        c.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    c.execute("DROP TABLE IF EXISTS messages_fts")
    add_column(c, "messages", "keywords TEXT")
    c.execute("CREATE TABLE IF NOT EXISTS user_tags ("
              " tag INTEGER PRIMARY KEY AUTOINCREMENT, user_id TEXT NOT NULL UNIQUE)")
    c.execute("CREATE TABLE IF NOT EXISTS fts_deferred (one INTEGER PRIMARY KEY CHECK (one = 1))")
    c.execute("DELETE FROM fts_deferred")
    # the rows fill_missing looks for; holds nothing while every row has its keywords
    c.execute("CREATE INDEX IF NOT EXISTS messages_unkeyed ON messages(rowid) WHERE keywords IS NULL")
    for rows in _every_row(c, "user_id, content"):
        _write_keywords(c, rows, hashes=False)  # (the text_hash column comes with a later migration)
    c.execute(FTS_TABLE)
    c.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
    for trigger in TRIGGERS:
        c.execute(trigger)


def add_text_hash(c: sqlite3.Connection) -> None:
    """The migration to a hashed text check: each row's ``text_hash`` (in batches), then its
    index in place of the one on the whole text. Safe to run on a store that has the column."""
    add_column(c, "messages", "text_hash INTEGER")
    for rows in _every_row(c, "content"):
        c.executemany("UPDATE messages SET text_hash=? WHERE rowid=?", [(text_hash(t), r) for r, t in rows])
    c.execute("DROP INDEX IF EXISTS messages_user_text")
    c.execute("CREATE INDEX IF NOT EXISTS messages_user_text_hash ON messages(user_id, text_hash)")


def recompose(c: sqlite3.Connection) -> None:
    """The migration to composed keywords (:func:`~.text_search.composed`): the rows whose text
    is not in NFC lose their keywords, computed again by :func:`fill_missing` when the store
    opens. Only rows holding a character beyond ASCII are asked (SQLite's GLOB, in C), and
    those in Python; the text itself is not changed."""
    c.create_function("tm_is_nfc", 1, lambda t: unicodedata.is_normalized("NFC", t), deterministic=True)
    c.execute("UPDATE messages SET keywords = NULL WHERE content GLOB ? AND NOT tm_is_nfc(content)",
              ("*[^\x01-\x7f]*",))


def regram(c: sqlite3.Connection) -> None:
    """The migration to CJK bigrams (:func:`~.text_search.cjk_grams`) and to ``i`` + a
    combining dot read as ``i``: the rows whose keywords these change lose them, computed again
    by :func:`fill_missing` when the store opens. Only rows holding a character beyond ASCII
    are asked (SQLite's GLOB, in C), and those in Python; the text itself is not changed."""
    c.create_function("tm_regrams", 1, lambda t: _CHANGED.search(t) is not None, deterministic=True)
    c.execute("UPDATE messages SET keywords = NULL WHERE content GLOB ? AND tm_regrams(content)",
              ("*[^\x01-\x7f]*",))


_CHANGED = re.compile(f"[{CJK}]|i\u0307")


def add_column(c: sqlite3.Connection, table: str, column: str) -> None:
    """``ALTER TABLE table ADD COLUMN column`` unless it is there (a migration run again)."""
    if column.split()[0] not in {r[1] for r in c.execute(f"PRAGMA table_info({table})")}:
        c.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


def _every_row(c: sqlite3.Connection, columns: str) -> Iterator[list[tuple[Any, ...]]]:
    """Every row of ``messages`` as (rowid, ``columns``...), in batches of ``FILL_BATCH``."""
    last = 0
    while True:
        rows = c.execute(f"SELECT rowid, {columns} FROM messages WHERE rowid > ? ORDER BY rowid LIMIT ?",
                         (last, FILL_BATCH)).fetchall()
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def tag_of(c: sqlite3.Connection, user_id: str) -> str | None:
    """The user's tag, or None for a user who never wrote (a read)."""
    found = c.execute("SELECT tag FROM user_tags WHERE user_id=?", (user_id,)).fetchone()
    return None if found is None else user_tag(int(found[0]))


def tags_for(c: sqlite3.Connection, users: Iterable[str]) -> dict[str, str]:
    """The tags of ``users``, giving a number to each who has none (inside the caller's
    write transaction)."""
    out: dict[str, str] = {}
    for user in dict.fromkeys(users):
        tag = tag_of(c, user)
        if tag is None:
            number = c.execute("INSERT INTO user_tags(user_id) VALUES (?)", (user,)).lastrowid
            tag = user_tag(int(number or 0))  # an insert into a rowid table always sets it
        out[user] = tag
    return out


def insert_deferred(c: sqlite3.Connection, sql: str, params: Sequence[Sequence[Any]]) -> None:
    """``executemany(sql, params)`` of new ``messages`` rows with the insert trigger skipped,
    then their keyword entries in one statement (3x cheaper than one trigger run a row, at
    100,000 rows). Inside the caller's write transaction, so the guard is never seen outside
    it; rowids only grow within it, so the new rows are those past the last one before."""
    before = int(c.execute("SELECT coalesce(max(rowid), 0) FROM messages").fetchone()[0])
    c.execute("INSERT OR IGNORE INTO fts_deferred VALUES (1)")
    c.executemany(sql, params)
    c.execute("INSERT INTO messages_fts(rowid, keywords) SELECT rowid, keywords FROM messages WHERE rowid > ?",
              (before,))
    c.execute("DELETE FROM fts_deferred")


def fill_missing(c: sqlite3.Connection) -> int:
    """Compute the keywords of rows written without them (by other means than
    ``insert_messages``); the update trigger indexes them. Returns how many. Such a row's
    content may be a number or bytes: it is read as text, as a read of the row reads it."""
    done = 0
    while True:
        rows = c.execute("SELECT rowid, user_id, CAST(content AS TEXT) FROM messages INDEXED BY messages_unkeyed"
                         " WHERE keywords IS NULL ORDER BY rowid LIMIT ?", (FILL_BATCH,)).fetchall()
        if not rows:
            return done
        _write_keywords(c, rows)
        done += len(rows)


def _write_keywords(c: sqlite3.Connection, rows: list[tuple[Any, ...]], *, hashes: bool = True) -> None:
    tags = tags_for(c, (r[1] for r in rows))
    if not hashes:
        c.executemany("UPDATE messages SET keywords=? WHERE rowid=?",
                      [(keyword_text(tags[user], content), rowid) for rowid, user, content in rows])
        return
    c.executemany("UPDATE messages SET keywords=?, text_hash=? WHERE rowid=?",
                  [(keyword_text(tags[user], content), text_hash(content), rowid) for rowid, user, content in rows])


Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


class KeywordSearch:
    """A store's keyword queries: BM25 within one user's posting lists, and the counts that
    leave a big user's common terms out (:func:`~.text_search.selective_terms`).

    Args:
        query: the store's read (``sql``, ``params``) -> rows.
        tag: the user's tag, ``None`` for a user with no rows yet.
    """

    def __init__(self, query: Query, tag: Callable[[str], str | None]) -> None:
        self._query = query
        self._tag = tag
        self.term_counts = TermCounts(self._rows_holding)  # tagged phrase -> the user's rows holding it
        self.user_rows = TermCounts(self._rows_of)  # user -> rows, counted again as the store grows

    def search(self, user_id: str, terms: Sequence[str], *, k: int,
               session_id: str | None = None) -> list[tuple[str, float]]:
        """The user's best ``k`` rows for ``terms`` OR-ed, as (id, score), higher is better."""
        tag = self._tag(user_id)
        phrases = [] if tag is None else tagged_phrases(tag, terms)
        if not phrases:
            return []
        if self._holds_rows(user_id, SELECTIVE_FROM_ROWS):
            # a smaller user keeps every term: their posting lists are short, and a few rows'
            # share says little. The counts are of the user's rows: a tagged term is theirs alone
            store_rows = int(self._query("SELECT coalesce(max(rowid), 0) FROM messages", ())[0][0])  # b-tree's end
            rows = self.user_rows.of([user_id], store_rows)[user_id]
            phrases = selective_terms(phrases, self.term_counts.of(phrases, rows), rows)
        match = " OR ".join(phrases)
        if session_id is None:
            # the best k by the index alone, then their rows: the tag holds the user's rows only, so
            # joining every match first (a row read per match) finds the same k (a quarter quicker
            # at 30,000 rows); the user column is still checked, the id being the authority
            sql = ("SELECT m.id, f.s FROM (SELECT rowid, -bm25(messages_fts) AS s FROM messages_fts"
                   " WHERE messages_fts MATCH ? ORDER BY bm25(messages_fts) LIMIT ?) AS f"
                   " JOIN messages m ON m.rowid = f.rowid WHERE m.user_id = ? ORDER BY f.s DESC")
            params: list[Any] = [match, k, user_id]
        else:
            sql = ("SELECT m.id, -bm25(messages_fts) AS s FROM messages_fts"
                   " JOIN messages m ON m.rowid = messages_fts.rowid"
                   " WHERE messages_fts MATCH ? AND m.user_id = ? AND m.session_id = ?"
                   " ORDER BY bm25(messages_fts) LIMIT ?")
            params = [match, user_id, session_id, k]
        return [(r[0], float(r[1])) for r in self._query(sql, params)]

    def _holds_rows(self, user_id: str, n: int) -> bool:
        """Whether the user has at least ``n`` messages (a count that stops at ``n``)."""
        return int(self._query("SELECT count(*) FROM (SELECT 1 FROM messages WHERE user_id=? LIMIT ?)",
                               (user_id, n))[0][0]) >= n

    def _rows_holding(self, phrase: str) -> int:
        """Rows holding a tagged phrase: a walk of one user's posting list."""
        return int(self._query("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (phrase,))[0][0])

    def _rows_of(self, user_id: str) -> int:
        return int(self._query("SELECT count(*) FROM messages WHERE user_id=?", (user_id,))[0][0])
