"""PostgreSQL tables of the episodic, semantic and working layers and of the items, and their dialect.

The one schema definition of the layer tables on PostgreSQL: the same tables as
:mod:`.sqlite_layers`, created by ``PostgresRecordStore.migrate("layers", ...)`` and
``migrate("items", ...)`` (recorded in ``schema_migrations``) and,
like every table with a ``user_id`` column, emptied for a user inside ``forget_user``'s
transaction. Facts, episode key points and items
get a generated ``tsvector`` column with a GIN index for keyword recall. The
repository's ``?`` placeholders become psycopg's ``%s`` here; ``rowid`` is a ``BIGSERIAL``
giving the insertion order, as SQLite's rowid does.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..records import Item
from .layer_store import LayerStore
from .layer_unit import PENDING_VECTORS, SLOT_INDEX, fill_slots
from .repositories import ItemCursor, Scored
from .postgres import PostgresRecordStore
from .postgres_keywords import TEXT_SEARCH_CONFIG, match_prepare, refold, tsquery
from .text_search import scan_user_rows, tsquery_any
from .postgres_db import ROW_LOCK, Step, lock_key

# the keyword column as the first step made it (the third one folds its diacritics)
_TSV = f"tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}', text)) STORED"

LAYER_MIGRATIONS: list[Step] = [
    f"""
    CREATE TABLE IF NOT EXISTS facts (
        rowid BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        type TEXT NOT NULL,
        text TEXT NOT NULL,
        key TEXT,
        polarity INTEGER NOT NULL DEFAULT 1,
        confidence DOUBLE PRECISION NOT NULL,
        source_ids TEXT NOT NULL DEFAULT '[]',
        metadata TEXT NOT NULL DEFAULT '{{}}',
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        valid_from DOUBLE PRECISION NOT NULL,
        invalid_at DOUBLE PRECISION,
        superseded_by TEXT,
        deleted_at DOUBLE PRECISION,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access DOUBLE PRECISION,
        vector BYTEA,
        {_TSV}
    );
    CREATE INDEX IF NOT EXISTS facts_user ON facts (user_id, type);
    CREATE INDEX IF NOT EXISTS facts_tsv ON facts USING GIN (tsv);
    CREATE TABLE IF NOT EXISTS fact_history (
        seq BIGSERIAL PRIMARY KEY,
        fact_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        action TEXT NOT NULL,
        old_text TEXT,
        new_text TEXT,
        at DOUBLE PRECISION NOT NULL,
        details TEXT NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX IF NOT EXISTS fact_history_fact ON fact_history (user_id, fact_id, seq);
    CREATE TABLE IF NOT EXISTS episodes (
        rowid BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        summary TEXT NOT NULL,
        body TEXT NOT NULL,
        turn_count INTEGER NOT NULL,
        start_ts DOUBLE PRECISION NOT NULL,
        end_ts DOUBLE PRECISION NOT NULL,
        source_ids TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{{}}',
        created_at DOUBLE PRECISION NOT NULL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access DOUBLE PRECISION,
        promoted_at DOUBLE PRECISION,
        compressed_at DOUBLE PRECISION
    );
    CREATE INDEX IF NOT EXISTS episodes_user ON episodes (user_id, end_ts);
    CREATE TABLE IF NOT EXISTS episode_points (
        rowid BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        episode_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        text TEXT NOT NULL,
        {_TSV}
    );
    CREATE INDEX IF NOT EXISTS episode_points_ep ON episode_points (episode_id);
    CREATE INDEX IF NOT EXISTS episode_points_tsv ON episode_points USING GIN (tsv);
    CREATE TABLE IF NOT EXISTS session_cursor (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        last_seq BIGINT NOT NULL,
        PRIMARY KEY (user_id, session_id)
    );
    CREATE TABLE IF NOT EXISTS working_items (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        type TEXT NOT NULL,
        text TEXT NOT NULL,
        importance DOUBLE PRECISION NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{{}}',
        created_at DOUBLE PRECISION NOT NULL,
        access_count INTEGER NOT NULL DEFAULT 0,
        last_access DOUBLE PRECISION,
        deleted_at DOUBLE PRECISION,
        vector BYTEA
    );
    CREATE INDEX IF NOT EXISTS working_session ON working_items (user_id, session_id);
    CREATE TABLE IF NOT EXISTS scratchpads (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        data TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (user_id, session_id)
    );
    CREATE TABLE IF NOT EXISTS messages_archive (
        id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        metadata TEXT NOT NULL,
        timestamp DOUBLE PRECISION NOT NULL,
        episode_id TEXT,
        archived_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX IF NOT EXISTS messages_archive_user ON messages_archive (user_id, session_id, timestamp);
    CREATE TABLE IF NOT EXISTS audit_log (
        seq BIGSERIAL PRIMARY KEY,
        user_id TEXT NOT NULL,
        layer TEXT NOT NULL,
        item_id TEXT NOT NULL,
        action TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        details TEXT NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX IF NOT EXISTS audit_user ON audit_log (user_id, layer, seq);
    """,
    # keyword search counts a user's episode points (and matches a small user's row by row):
    # both start from the user's rows, which need a b-tree on user_id (facts and items have one)
    "CREATE INDEX IF NOT EXISTS episode_points_user ON episode_points (user_id)",
    # keywords with diacritics folded, as on SQLite (postgres_keywords)
    refold("facts", "text") + refold("episode_points", "text"),
    # CJK runs as their bigrams, as the turns' (postgres_keywords.cjk_bigrams)
    refold("facts", "text") + refold("episode_points", "text"),
    PENDING_VECTORS,
    SLOT_INDEX,
    lambda conn: fill_slots(_Connection(conn)),
]

#: the GIN index of the item values that a filter's equalities said as containments read
#: (:func:`.item_filter_sql.contained`)
VALUE_INDEX = "CREATE INDEX IF NOT EXISTS items_value ON items USING gin (items_value_jsonb(value) jsonb_path_ops)"

# the namespaced items of the LangGraph store (tiered_memory.layers.items)
ITEM_MIGRATIONS: list[str] = [
    f"""
    CREATE TABLE IF NOT EXISTS items (
        rowid BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        ns_path TEXT NOT NULL,
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        text TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}', COALESCE(text, ''))) STORED,
        UNIQUE (ns_path, key)
    );
    CREATE INDEX IF NOT EXISTS items_user ON items (user_id);
    CREATE INDEX IF NOT EXISTS items_tsv ON items USING GIN (tsv);
    """,
    # item TTL (LangGraph's TTLConfig): minutes, and when the item expires (epoch seconds)
    """
    ALTER TABLE items ADD COLUMN ttl_minutes DOUBLE PRECISION;
    ALTER TABLE items ADD COLUMN expires_at DOUBLE PRECISION;
    CREATE INDEX IF NOT EXISTS items_expiry ON items (expires_at) WHERE expires_at IS NOT NULL;
    """,
    refold("items", "COALESCE(text, '')"),
    refold("items", "COALESCE(text, '')"),  # CJK runs as their bigrams, as the turns'
    # the listing's order (a namespace prefix, newest first): a prefix is a range of ns_path, in
    # code-point order whatever the database's collation (the queries compare COLLATE "C" too)
    'CREATE INDEX IF NOT EXISTS items_listing ON items (ns_path COLLATE "C", updated_at DESC, rowid DESC);',
    # an item's value as jsonb for a filter decided in SQL (item_filter_sql), {} where another writer
    # left text that is not JSON: one unreadable row must not fail every filtered listing of the table
    """
    CREATE OR REPLACE FUNCTION items_value_jsonb(value TEXT) RETURNS JSONB
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
    BEGIN
        RETURN value::jsonb;
    EXCEPTION WHEN others THEN  -- not JSON, nested past jsonb's depth, ...
        RETURN '{}'::jsonb;
    END
    $fn$;
    """,
    # the listing of every namespace (the empty prefix) in the same order: read in the index's order
    # up to the page, where items_listing left a scan and a sort of the whole table for each page
    "CREATE INDEX IF NOT EXISTS items_recent ON items (updated_at DESC, rowid DESC);",
    # items_value_jsonb's EXCEPTION block is a subtransaction, which no parallel worker may start:
    # declared PARALLEL SAFE, a filtered read the planner gave to workers failed
    "ALTER FUNCTION items_value_jsonb(TEXT) PARALLEL UNSAFE;",
    # a filter's equalities as a containment of the value (item_filter_sql.contained): a GIN index finds
    # their rows, where a page of a selective filter parsed every row of the range (300 ms at 100,000
    # items); the planner needs the expression's statistics to choose it, gathered here, as autovacuum
    # gathers them later. The index holds items_value_jsonb's results: its body never changes without
    # a REINDEX in the same step
    f"{VALUE_INDEX}; ANALYZE items;",
]


def qmark_to_format(sql: str) -> str:
    """``?`` placeholders to psycopg's ``%s`` (pure; the layer SQL holds no literal ``?``)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Connection:
    """A psycopg connection taking ``?`` placeholders, like sqlite3's."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), *, prepare: bool | None = None) -> Any:
        return self.conn.execute(qmark_to_format(sql), list(params), prepare=prepare)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        cur = self.conn.cursor()
        cur.executemany(qmark_to_format(sql), [list(r) for r in rows])
        return cur


class PostgresLayerStore(LayerStore):
    """Layer rows in a :class:`PostgresRecordStore`, shared by every worker."""

    db: PostgresRecordStore
    dialect = "postgres"
    message_order = "seq"
    greatest = "GREATEST"
    row_lock = ROW_LOCK  # another worker's delete or edit of a held row waits for the commit
    merges_namespaces = lateral_merge = True  # a seek a namespace: the range was read whole past a cursor
    value_index = True  # items_value (ITEM_MIGRATIONS)

    def __init__(self, store: PostgresRecordStore) -> None:
        super().__init__(store)
        store.migrate("layers", LAYER_MIGRATIONS)
        store.migrate("items", ITEM_MIGRATIONS)
        self._by_values = threading.local()  # .on: this thread's statements are planned with their values

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        prepare = False if getattr(self._by_values, "on", False) else None  # None: as psycopg decides
        return self.db.query(qmark_to_format(sql), list(params), prepare=prepare)

    @contextmanager
    def _planned_with_values(self) -> Iterator[None]:
        """The statements this thread runs meanwhile are never prepared, so each is planned with its
        values. psycopg prepares a statement run five times on a connection, and PostgreSQL may then
        keep a generic plan, blind to the prefix's range and the filter's values: a listing page of a
        filter that keeps one item in 5,000 took 467 ms that way, 91 ms planned with its values
        (docs/langgraph_store.md). A point lookup keeps its prepared plan, the same for any key, and
        so does a page without a filter or a user: its seeks are the best plan for any prefix, and
        planning each took a third longer (0.45 ms a page)."""
        was = getattr(self._by_values, "on", False)
        self._by_values.on = True
        try:
            yield
        finally:
            self._by_values.on = was

    def items_page(self, prefix: Sequence[str], limit: int, after: ItemCursor | None = None,
                   live_at: float | None = None, filter: Mapping[str, Any] | None = None,
                   user_id: str | None = None) -> list[tuple[Item, ItemCursor]]:
        if not filter and user_id is None:  # seeks in the listing's order: one plan serves every prefix
            return super().items_page(prefix, limit, after, live_at, filter, user_id)
        with self._planned_with_values():  # the page's reads, and the count of the prefix's rows
            return super().items_page(prefix, limit, after, live_at, filter, user_id)

    def items_under(self, prefix: Sequence[str], ids: Sequence[str] | None = None,
                    live_at: float | None = None, filter: Mapping[str, Any] | None = None) -> list[Item]:
        if not filter:
            return super().items_under(prefix, ids, live_at, filter)
        with self._planned_with_values():  # a filtered search's candidates under the prefix
            return super().items_under(prefix, ids, live_at, filter)

    @contextmanager
    def transaction(self) -> Iterator[_Connection]:
        with self.db.transaction() as conn:
            yield _Connection(conn)

    def keyword(self, table: str, user_id: str, terms: Sequence[str], k: int, extra: str = "") -> Scored:
        """Full-text search of one user's rows; a user with few rows is matched row by row from the
        table's b-tree on ``user_id`` (as the turns are: :func:`.postgres_keywords.turn_matches`), a
        large one through the GIN index, planned with its values: the generic plan PostgreSQL kept once
        psycopg prepared it took the average user's rows (few, among many users) and read every
        row of the large user instead (a rare word among a user's 50,000 items: 29.6 ms a search, 4.5
        planned with its values; bench/item_plans.py, docs/langgraph_store.md). The row-by-row
        match reads the user's rows whatever the plan, and stays prepared."""
        text = tsquery_any(terms)
        if text is None:
            return []

        def run(conn: Any) -> list[tuple[Any, ...]]:
            cap = self.db.user_scan_rows
            fenced = scan_user_rows(self.db.user_rows(conn, table, user_id, cap), cap)
            source = f"(SELECT * FROM {table} WHERE user_id = ? OFFSET 0) AS t" if fenced else f"{table} t"
            sql = (f"SELECT t.id, ts_rank(t.tsv, q) AS s FROM {source}, {tsquery('?')} AS q"
                   f" WHERE t.tsv @@ q{'' if fenced else ' AND t.user_id = ?'} {extra}"
                   " ORDER BY s DESC, t.rowid DESC LIMIT ?")
            params = [user_id, text, k] if fenced else [text, user_id, k]
            return list(_Connection(conn).execute(sql, params, prepare=match_prepare(fenced)).fetchall())

        return [(r[0], float(r[1])) for r in self.db.read(run)]

    def lock_session(self, c: Any, user_id: str, session_id: str) -> None:
        c.execute("SELECT pg_advisory_xact_lock(?)", (lock_key(f"tiered-memory:session:{user_id}\x1f{session_id}"),))
