"""The PostgreSQL record store's schema: its migrations, in order (as :mod:`.sqlite_schema` is
the SQLite store's).

Each migration runs once, inside a transaction under the migration lock, recorded in
``schema_migrations`` (:meth:`~.postgres_db.PostgresDatabase.migrate`); a step is SQL
statements or a function given the connection. Append, never edit: a store written by any
earlier version upgrades in order. The tables live in the store's own PostgreSQL schema.
"""

from __future__ import annotations

from .base import LONG_MESSAGE_CHARS
from .pending_deletes import OWED_VECTORS
from .postgres_db import Step
from .postgres_keywords import TEXT_SEARCH_CONFIG, bigram_turn_keywords, fold_turn_keywords

MIGRATIONS: list[Step] = [
    f"""
    CREATE TABLE IF NOT EXISTS messages (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{{}}',
        timestamp DOUBLE PRECISION NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        importance REAL NOT NULL DEFAULT 0.5,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access DOUBLE PRECISION,
        indexed BOOLEAN NOT NULL DEFAULT FALSE,
        duplicate_of TEXT,
        tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}', content)) STORED
    );
    CREATE INDEX IF NOT EXISTS messages_user_session ON messages (user_id, session_id, seq);
    CREATE INDEX IF NOT EXISTS messages_pending ON messages (seq) WHERE NOT indexed;
    CREATE INDEX IF NOT EXISTS messages_tsv ON messages USING GIN (tsv);
    """,
    # has_long_messages: the users with a chunked message, without reading their rows
    f"""
    CREATE INDEX IF NOT EXISTS messages_long ON messages (user_id) WHERE length(content) > {LONG_MESSAGE_CHARS};
    """,
    # same_text: a message with an earlier one's text is a duplicate (as on SQLite), found by
    # a hash of its text, not by the nearest vector (which also took near-duplicates)
    """
    CREATE INDEX IF NOT EXISTS messages_user_text ON messages (user_id, md5(lower(btrim(content, ' '))))
        WHERE indexed AND duplicate_of IS NULL;
    """,
    # release_duplicates (after every forget, clear_session and archive): the user's duplicates,
    # without reading all of the user's rows
    """
    CREATE INDEX IF NOT EXISTS messages_duplicates ON messages (user_id) WHERE duplicate_of IS NOT NULL;
    """,
    fold_turn_keywords,
    # the store's id, written once (under the migration lock: every worker reads the same): a
    # collection on a shared vector server records the store that owns it (vector/ownership.py)
    """
    INSERT INTO meta VALUES ('store_id', md5(random()::text || clock_timestamp()::text))
        ON CONFLICT (key) DO NOTHING;
    """,
    # a run of Chinese, Japanese or Korean characters is indexed as its bigrams, as on SQLite
    bigram_turn_keywords,
    # a search of sessions reads the duplicates of the turns it found (DuplicateScope.duplicates
    # with originals), and a removal marks the duplicates of the removed turns pending: both by
    # original, without reading every duplicate of the user (as on SQLite)
    """
    CREATE INDEX IF NOT EXISTS messages_duplicate_of ON messages (user_id, duplicate_of) WHERE duplicate_of IS NOT NULL;
    DROP INDEX IF EXISTS messages_duplicates;
    """,    # the deletions the vector index owes, one row each (as on SQLite): no deletion takes a lock
    # every other deletion waits for, nor rewrites what the others owe
    OWED_VECTORS,
]
