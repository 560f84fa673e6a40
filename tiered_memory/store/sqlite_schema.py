"""The SQLite record store's schema: its migrations, in order, and the helpers that read it.

Each migration runs once, inside a transaction, recorded in ``schema_migrations`` (as on
PostgreSQL); a step is SQL statements or a function given the connection, for work done
in Python. Append, never edit: a store written by any earlier version upgrades in order.
"""

from __future__ import annotations

import sqlite3
from typing import Callable, Union

from .base import LONG_MESSAGE_CHARS
from .pending_deletes import OWED_VECTORS
from .sqlite_keywords import add_text_hash, recompose, regram, upgrade
from .text_search import FTS5_SPLITTING_LETTERS

# A migration step: SQL statements, or a function given the connection (for work in Python).
Step = Union[str, Callable[[sqlite3.Connection], None]]

MIGRATIONS: list[Step] = [
    """
    CREATE TABLE IF NOT EXISTS messages (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}',
        timestamp REAL NOT NULL,
        created_at REAL NOT NULL,
        importance REAL NOT NULL DEFAULT 0.5,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access REAL,
        indexed INTEGER NOT NULL DEFAULT 0,
        duplicate_of TEXT
    );
    CREATE INDEX IF NOT EXISTS messages_user_session ON messages(user_id, session_id, rowid);
    CREATE INDEX IF NOT EXISTS messages_pending ON messages(indexed);
    CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
        content, content='messages', content_rowid='rowid', tokenize='porter unicode61'
    );
    CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.rowid, new.content);
    END;
    CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.rowid, old.content);
    END;
    """,
    # near-duplicate check by text (same_text): one index range per batch, not a vector query
    """
    CREATE INDEX IF NOT EXISTS messages_user_text ON messages(user_id, lower(trim(content)));
    """,
    # has_long_messages: the users with a chunked message, without reading their rows
    f"""
    CREATE INDEX IF NOT EXISTS messages_long ON messages(user_id) WHERE length(content) > {LONG_MESSAGE_CHARS};
    """,
    # the keyword index holds each row's user too, so a keyword search reads the posting lists
    # of the user's rows, not of the whole store (store/text_search.py: user_fts_query)
    """
    DROP TRIGGER IF EXISTS messages_ai;
    DROP TRIGGER IF EXISTS messages_ad;
    DROP TABLE IF EXISTS messages_fts;
    CREATE VIRTUAL TABLE messages_fts USING fts5(
        content, user_id, content='messages', content_rowid='rowid', tokenize='porter unicode61'
    );
    INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
    CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content, user_id) VALUES (new.rowid, new.content, new.user_id);
    END;
    CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content, user_id)
        VALUES ('delete', old.rowid, old.content, old.user_id);
    END;
    """,
    # per-user posting lists: each row's words tagged with its user's number, so a small user's
    # keyword query no longer walks (and bm25 no longer counts) other users' rows; the insert
    # trigger can be skipped for a bulk write (store/sqlite_keywords.py)
    upgrade,
    # the text check reads a hash of each text: the whole text as an index key made every
    # bulk commit rewrite pages across a large index (with the checkpoints, about a fifth of
    # the library's part of a 100,000-message write)
    add_text_hash,
    # release_duplicates (after every forget, clear_session and archive): the user's duplicates,
    # without reading all of the user's rows
    """
    CREATE INDEX IF NOT EXISTS messages_duplicates ON messages(user_id) WHERE duplicate_of IS NOT NULL;
    """,
    # words now split where FTS5 splits them (text_search.FTS5_SPLITTING_LETTERS): the rows that
    # hold such a letter have their keywords computed again (fill_missing, when the store opens)
    f"""
    UPDATE messages SET keywords = NULL WHERE content GLOB '*[{FTS5_SPLITTING_LETTERS}]*';
    """,
    # the store's id, written once: a collection on a shared vector server records the store
    # that owns it (vector/ownership.py); a copy of the file is the same store
    """
    INSERT OR IGNORE INTO meta VALUES ('store_id', lower(hex(randomblob(16))));
    """,
    # words are read composed (NFC), so a combining mark no longer splits one ("nai" + U+0308 +
    # "ve"): the rows whose text is not in NFC have their keywords computed again likewise
    recompose,
    # long messages are also indexed by their chunks (recall/chunking.py), which the first
    # release did not write and no repair adds while the message's own vector is there: its
    # long messages go back to pending, and the open's repair indexes them with their chunks
    # (once; a store written since re-embeds its long messages once for nothing)
    f"""
    UPDATE messages SET indexed = 0
    WHERE length(content) > {LONG_MESSAGE_CHARS} AND indexed = 1 AND duplicate_of IS NULL;
    """,
    # a run of Chinese, Japanese or Korean characters is read as its bigrams, so a word inside
    # it is found (text_search.cjk_grams), and "i" + a combining dot as "i": the rows whose
    # keywords that changes have them computed again likewise
    regram,
    # a search of sessions reads the duplicates of the turns it found (DuplicateScope.duplicates
    # with originals), and a removal marks the duplicates of the removed turns pending: both by
    # original, without reading every duplicate of the user (thousands of "thanks" and "ok").
    # The index on the user alone is covered by this one (release_duplicates reads it so)
    """
    CREATE INDEX IF NOT EXISTS messages_duplicate_of ON messages(user_id, duplicate_of) WHERE duplicate_of IS NOT NULL;
    DROP INDEX IF EXISTS messages_duplicates;
    """,    # the deletions the vector index owes, one row each (pending_deletes.py), no longer one JSON
    # value in meta that every deletion rewrote whole; the entries an earlier version left there
    # are moved in when the memory pays what is owed
    OWED_VECTORS,
]


def user_tables(c: sqlite3.Connection) -> list[str]:
    """The tables holding a ``user_id`` column: what ``forget_user`` empties for the user.

    Every layer keys its rows by ``user_id``, so a table added by any layer's migration
    is covered without registering anything."""
    tables = [r[0] for r in c.execute(
        "SELECT name FROM sqlite_master WHERE type='table' AND sql NOT LIKE 'CREATE VIRTUAL TABLE%'")]
    return [t for t in tables if any(col[1] == "user_id" for col in c.execute(f"PRAGMA table_info({t})"))]


def split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements, buf, depth = [], [], 0
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        buf.append(line)
        upper = stripped.upper()
        if upper.startswith("CREATE TRIGGER"):
            depth += 1
        if depth and upper.startswith("END;"):
            depth -= 1
        if not depth and stripped.endswith(";"):
            statements.append("\n".join(buf))
            buf = []
    if buf:
        statements.append("\n".join(buf))
    return statements

