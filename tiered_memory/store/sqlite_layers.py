"""SQLite tables of the episodic, semantic and working layers and of the items, and their dialect.

This is the one schema definition of the layer tables on SQLite (the core ``messages``
table is :mod:`.sqlite`'s). The tables join the core schema through
``SQLiteRecordStore.migrate("layers", ...)`` and ``migrate("items", ...)`` and, like
every table with a ``user_id`` column, are emptied for a user inside ``forget_user``'s
transaction. Facts, episode key points and items have their own FTS5 tables (keyword
recall), indexed as the turns are (:mod:`.sqlite_keywords`): each row's ``keywords`` column
holds its words with its user's tag in front, and the FTS5 table, external content over
that column, is fed by triggers from it (:func:`tagged_index`), so BM25 counts a term's rows
within the user and another user's rows never move a user's ranking. Their vectors live in
the shared vector index under ids with a ``:`` (``fact:<id>``, ``ep:<id>:<n>``,
``item:<id>``), derived from these rows. The queries themselves are
:class:`~.layer_store.LayerStore`'s; this dialect adds only FTS5 keyword search.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any, Iterable, Sequence

from .layer_store import LayerStore
from .layer_unit import PENDING_VECTORS, SLOT_INDEX, fill_slots
from .repositories import Scored
from .sqlite import SQLiteRecordStore
from .sqlite_db import CJK_GRAMS, KEYWORD_TEXT
from .sqlite_keywords import add_column
from .sqlite_schema import Step
from .text_search import CJK, tagged_any


def cjk_words(source: str) -> str:
    """SQL of ``source`` as the FTS5 tables of facts, key points and items index it: a text
    holding a CJK character through :data:`CJK_GRAMS`, any other as it is, without a call
    into Python (so English is indexed exactly as before). The function is given the
    text's bytes, so a value another writer left undecodable is read the same way at insert
    and at delete."""
    return f"CASE WHEN {source} GLOB '*[{CJK}]*' THEN {CJK_GRAMS}(CAST({source} AS BLOB)) ELSE {source} END"


def bigrams(table: str, source: str, update: str) -> Step:
    """The migration of ``table``'s FTS5 index to CJK bigrams. ``source`` is the indexed text,
    its columns after ``{row}``; ``update`` the event of the update trigger (empty for none).
    The index's content becomes the view ``<table>_words``, ``source`` through
    :func:`cjk_words`, so FTS5's own ``rebuild`` and ``integrity-check`` read what the triggers
    index; the index is built again from it (every row: a store's facts, key points and items
    are few next to its turns)."""
    fts, view = f"{table}_fts", f"{table}_words"
    new, old = cjk_words(source.format(row="new.")), cjk_words(source.format(row="old."))
    insert = f"INSERT INTO {fts}(rowid, text) VALUES (new.rowid, {new});"
    delete = f"INSERT INTO {fts}({fts}, rowid, text) VALUES ('delete', old.rowid, {old});"
    triggers = {"ai": f"AFTER INSERT ON {table} BEGIN {insert} END",
                "ad": f"AFTER DELETE ON {table} BEGIN {delete} END"}
    if update:
        triggers["au"] = f"AFTER {update} ON {table} BEGIN {delete} {insert} END"

    def step(c: sqlite3.Connection) -> None:
        for event in ("ai", "ad", "au"):
            c.execute(f"DROP TRIGGER IF EXISTS {table}_{event}")
        c.execute(f"DROP TABLE IF EXISTS {fts}")
        c.execute(f"DROP VIEW IF EXISTS {view}")
        c.execute(f"CREATE VIEW {view} AS SELECT rowid, {cjk_words(source.format(row=''))} AS text FROM {table}")
        c.execute(f"CREATE VIRTUAL TABLE {fts} USING fts5(text, content='{view}', content_rowid='rowid',"
                  " tokenize='porter unicode61')")
        c.execute(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
        for event, body in triggers.items():
            c.execute(f"CREATE TRIGGER {table}_{event} {body}")
    return step


def tagged_index(table: str) -> Step:
    """The migration of ``table``'s FTS5 index to per-user keywords, as the turns' (the rows'
    ``text``, each word with its user's tag in front: :func:`~.text_search.keyword_text`).
    Before it, BM25 counted a word's rows over every user, so a user's ranking, and the
    scores, told whether other users' rows held the query's words.

    Invariants, as :mod:`.sqlite_keywords` keeps them for the turns: every row is in the index
    with what its stored ``keywords`` column holds (none: an empty entry), and only triggers
    feed it, deleting what the column held. A row inserted, or whose ``text`` or ``user_id``
    changes, has its keywords computed in the trigger (:data:`~.sqlite_db.KEYWORD_TEXT`, its
    user given a tag if it had none); the change of the column re-indexes the row. The
    keywords of the existing rows are computed here, the index built again from them."""
    fts = f"{table}_fts"
    fill = ("INSERT OR IGNORE INTO user_tags(user_id) VALUES (new.user_id);"
            f" UPDATE {table} SET keywords = {KEYWORD_TEXT}("
            "(SELECT tag FROM user_tags WHERE user_id = new.user_id), CAST(new.text AS BLOB))"
            " WHERE rowid = new.rowid;")
    insert = f"INSERT INTO {fts}(rowid, keywords) VALUES (new.rowid, new.keywords);"
    delete = f"INSERT INTO {fts}({fts}, rowid, keywords) VALUES ('delete', old.rowid, old.keywords);"
    triggers = {"ai": f"AFTER INSERT ON {table} BEGIN {insert} {fill} END",
                "ad": f"AFTER DELETE ON {table} BEGIN {delete} END",
                "au": f"AFTER UPDATE OF text, user_id ON {table} BEGIN {fill} END",
                "ak": f"AFTER UPDATE OF keywords ON {table} BEGIN {delete} {insert} END"}

    def step(c: sqlite3.Connection) -> None:
        for event in triggers:
            c.execute(f"DROP TRIGGER IF EXISTS {table}_{event}")
        c.execute(f"DROP TABLE IF EXISTS {fts}")
        c.execute(f"DROP VIEW IF EXISTS {table}_words")  # the content of bigrams' index
        add_column(c, table, "keywords TEXT")
        c.execute(f"INSERT OR IGNORE INTO user_tags(user_id) SELECT DISTINCT user_id FROM {table}")
        c.execute(f"UPDATE {table} SET keywords = {KEYWORD_TEXT}("
                  f"(SELECT tag FROM user_tags u WHERE u.user_id = {table}.user_id), CAST(text AS BLOB))")
        c.execute(f"CREATE VIRTUAL TABLE {fts} USING fts5(keywords, content='{table}', content_rowid='rowid',"
                  " tokenize='porter unicode61')")
        c.execute(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
        for event, body in triggers.items():
            c.execute(f"CREATE TRIGGER {table}_{event} {body}")
    return step


LAYER_MIGRATIONS: list[Step] = [
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
    PENDING_VECTORS,
    # a CJK run is indexed as its bigrams, as the turns' are (text_search.fts5_text), so a word in
    # the middle of a run is found
    bigrams("facts", "{row}text", "UPDATE OF text"),
    bigrams("episode_points", "{row}text", ""),
    SLOT_INDEX,
    # each word with its user's tag, as the turns' (tagged_index): BM25 counts a word's rows within
    # the user, so another user's facts and key points no longer move a user's ranking
    tagged_index("facts"),
    tagged_index("episode_points"),
    fill_slots,  # (last: tests re-run it by deleting the last migration's record)
]

# the namespaced items of the LangGraph store (tiered_memory.layers.items)
ITEM_MIGRATIONS: list[Step] = [
    """
    CREATE TABLE IF NOT EXISTS items (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        ns_path TEXT NOT NULL,
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        text TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        UNIQUE (ns_path, key)
    );
    CREATE INDEX IF NOT EXISTS items_user ON items(user_id);
    CREATE VIRTUAL TABLE IF NOT EXISTS items_fts USING fts5(
        text, content='items', content_rowid='rowid', tokenize='porter unicode61'
    );
    CREATE TRIGGER IF NOT EXISTS items_ai AFTER INSERT ON items BEGIN
        INSERT INTO items_fts(rowid, text) VALUES (new.rowid, COALESCE(new.text, ''));
    END;
    CREATE TRIGGER IF NOT EXISTS items_ad AFTER DELETE ON items BEGIN
        INSERT INTO items_fts(items_fts, rowid, text) VALUES ('delete', old.rowid, COALESCE(old.text, ''));
    END;
    CREATE TRIGGER IF NOT EXISTS items_au AFTER UPDATE ON items BEGIN
        INSERT INTO items_fts(items_fts, rowid, text) VALUES ('delete', old.rowid, COALESCE(old.text, ''));
        INSERT INTO items_fts(rowid, text) VALUES (new.rowid, COALESCE(new.text, ''));
    END;
    """,
    # item TTL (LangGraph's TTLConfig): minutes, and when the item expires (epoch seconds)
    """
    ALTER TABLE items ADD COLUMN ttl_minutes REAL;
    ALTER TABLE items ADD COLUMN expires_at REAL;
    CREATE INDEX IF NOT EXISTS items_expiry ON items (expires_at) WHERE expires_at IS NOT NULL;
    """,
    bigrams("items", "COALESCE({row}text, '')", "UPDATE"),  # CJK runs as their bigrams, as the facts'
    tagged_index("items"),  # each word with its user's tag, as the facts'
    # the listing's order (a namespace prefix, newest first): a prefix is a range of ns_path
    "CREATE INDEX IF NOT EXISTS items_listing ON items (ns_path, updated_at DESC, rowid DESC);",
    # the listing of every namespace (the empty prefix) in the same order: read in the index's order
    # up to the page, where items_listing left a scan and a sort of the whole table for each page
    "CREATE INDEX IF NOT EXISTS items_recent ON items (updated_at DESC, rowid DESC);",
]


class SQLiteLayerStore(LayerStore):
    """Layer rows in the embedded :class:`SQLiteRecordStore` (shares its connection and lock)."""

    db: SQLiteRecordStore
    dialect = "sqlite"
    merges_namespaces = True  # no range statistics: a range of several namespaces was sorted for each page

    def __init__(self, store: SQLiteRecordStore) -> None:
        super().__init__(store)
        store.migrate("layers", LAYER_MIGRATIONS)
        store.migrate("items", ITEM_MIGRATIONS)

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        return self.db.query(sql, params)

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self.db.transaction()

    def mark_transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self.db.unsynced_transaction()  # the turns' marks' (mark_indexed)

    def keyword(self, table: str, user_id: str, terms: Sequence[str], k: int, extra: str = "") -> Scored:
        """BM25 within the user's posting lists (:func:`tagged_index`); the ``user_id`` check
        still decides."""
        tag = self.db.tag(user_id)
        match = None if tag is None else tagged_any(tag, terms)
        if match is None:
            return []
        fts = f"{table}_fts"
        sql = (f"SELECT t.id, -bm25({fts}) FROM {fts} JOIN {table} t ON t.rowid = {fts}.rowid"
               f" WHERE {fts} MATCH ? AND t.user_id = ? {extra} ORDER BY bm25({fts}) LIMIT ?")
        return [(r[0], float(r[1])) for r in self.query(sql, [match, user_id, k])]
