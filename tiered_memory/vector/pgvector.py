"""pgvector index: the vectors in a table of the record store's own PostgreSQL schema.

One table, ``vectors`` (id, user_id, layer, session_id, timestamp, embedding), with an
HNSW index on the embedding (``vector_cosine_ops``) and a b-tree on
``(user_id, layer, session_id)``. Turns, facts, episode points and store items share it,
as they share a Chroma collection. The column's dimension is the embedder's, fixed when
the first vector is written (``reset`` drops the table, so ``rebuild_index`` with a new
embedder starts over).

Filtering by user: every query carries ``user_id = ...``, and the user's size picks the
plan (a count bounded by :func:`exact_limit` of the table's size). A user with fewer rows
is read through the b-tree and sorted exactly (no other user's vector is touched, index
scans off for that query); a larger one goes through HNSW with
``hnsw.iterative_scan = relaxed_order``, which keeps walking the graph until it has ``k``
rows of that user instead of returning fewer (pgvector 0.8). ``among`` (ids the record
store already scoped) is an exact scan of those rows by primary key. ``bench/backends.py``
measures both paths; see "Running at scale".

Atomic writes: the index runs every statement through the database object it is given
(``write`` / ``read``). When that object is the record store itself, a
:meth:`~tiered_memory.store.postgres_db.PostgresDatabase.together` unit makes rows and
vectors commit together; ``forget_user`` of the record store deletes this table's rows
with the user's other rows, because the table carries ``user_id``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Protocol, Sequence, TypeVar

import numpy as np

from ..errors import ConfigurationError, TieredMemoryError, VectorIndexError
from .base import VectorItem, refuse_bad_queries, refuse_bad_vectors

TABLE = "vectors"
# the schema's plain name (regnamespace::text quotes one that needs it, and sql.Identifier quotes again)
_EXTENSION_SCHEMA = ("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
                     " WHERE e.extname = 'vector'")
LOCK_KEY = 0x7467_7663  # advisory lock around creating the table (any constant shared by all workers)
T = TypeVar("T")


class Database(Protocol):
    """What the index needs of a PostgreSQL database (``PostgresDatabase`` has it)."""

    def write(self, fn: Callable[[Any], Any], *, retries: int = 3, detached: bool = False) -> Any: ...

    def read(self, fn: Callable[[Any], Any]) -> Any: ...

    def close(self) -> None: ...


#: How much dearer one vector visited on the HNSW graph is than one read by the exact scan
#: (fitted at 1,000,000 memories, where a 10,000-vector user's exact scan was 1.3x faster at
#: p95 than PostgreSQL's HNSW choice; bench/README.md).
HNSW_VISIT_COST = 1.3


# pgvector's largest hnsw.ef_search; a larger k is still filled by the iterative scan, which
# keeps walking the graph until it has k rows (or hnsw.max_scan_tuples)
MAX_EF_SEARCH = 1000


def exact_limit(total: float, ef_search: int, visit_cost: float = HNSW_VISIT_COST) -> int:
    """The user size from which HNSW beats an exact scan of the user's vectors (pure).

    To find ``k`` rows of one user, the filtered HNSW walk (iterative scan) visits about
    ``ef_search / share`` vectors, where ``share = rows / total`` is the user's part of the
    table; the exact scan reads the user's ``rows``. Exact is cheaper while
    ``rows * rows < visit_cost * ef_search * total``: the limit grows with the square root of
    the table, so a 10,000-vector user is scanned exactly among 1,000,000 vectors and walks
    HNSW among 200,000 (both measured)."""
    return max(1, math.ceil(math.sqrt(visit_cost * ef_search * max(total, 0.0))))


def exact_scan(rows: int, limit: int) -> bool:
    """Whether to scan a user's ``rows`` vectors exactly rather than walk HNSW (pure): true
    below ``limit`` (see :func:`exact_limit`). ``rows`` may be counted only up to ``limit``."""
    return rows < limit


def cosine_ids(rows: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """(id, cosine distance) rows -> (id, similarity), best first (pure). An iterative scan in
    ``relaxed_order`` may return rows slightly out of order; ties keep the id order stable."""
    return sorted(((i, 1.0 - float(d)) for i, d in rows), key=lambda t: (-t[1], t[0]))


class PgVectorIndex:
    """Cosine index in PostgreSQL with pgvector.

    Args:
        db: the database to write through: the record store (so rows and vectors can share
            a transaction), or a ``PostgresDatabase`` of its own.
        owns_db: close ``db`` on :meth:`close` (when the index opened it).
        ef_search: HNSW candidate list size (``hnsw.ef_search``); raised to ``k`` per query,
            up to pgvector's largest, 1,000.
        exact_below: a user with fewer vectors than this (in the queried layers and session)
            is searched exactly through the b-tree, from this size on through HNSW; by
            default :func:`exact_limit` of the table's size (PostgreSQL's row estimate).
    """

    #: the user filter is an indexed column: turn search need not send the user's id list
    #: (measured: sending 10,000 ids made a search ~1.4x slower, bench/README.md)
    cheap_user_filter = True

    def __init__(self, db: Database, *, owns_db: bool = False, ef_search: int = 100,
                 exact_below: int | None = None) -> None:
        try:
            from psycopg import sql
        except ImportError as e:  # pragma: no cover - the record store needs it first
            from ..errors import missing

            raise missing("psycopg", "postgres") from e
        self._sql = sql
        self.db = db
        self._owns_db = owns_db
        self.ef_search = ef_search
        self.exact_below = exact_below
        self._dim: int | None = None
        self._ext = self._extension_schema()

    def location(self) -> tuple[str, str, str]:
        """Where the vectors are (:mod:`.identity`): a table of the record store's own schema."""
        return "pgvector", "the record store's schema", TABLE

    # ---- set-up --------------------------------------------------------------
    def _extension_schema(self) -> str:
        def run(conn: Any) -> str:
            found = conn.execute(_EXTENSION_SCHEMA).fetchone()
            if found is None:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
                found = conn.execute(_EXTENSION_SCHEMA).fetchone()
            return str(found[0])

        try:
            return str(self.db.write(run, detached=True))
        except TieredMemoryError as e:
            raise ConfigurationError(
                f"the PostgreSQL server has no usable pgvector extension ({e}). Install pgvector on the "
                "server (or use a managed PostgreSQL that offers it) and let the user run "
                "CREATE EXTENSION vector once, or choose another vector_store.") from e

    def _q(self, text: str) -> Any:
        """SQL with ``{vec}`` (the vector type) and ``{dist}`` (the cosine distance operator)
        qualified by the extension's schema: the connection's search_path is the store's schema."""
        ext = self._sql.Identifier(self._ext)
        return self._sql.SQL(text).format(
            vec=self._sql.SQL("{}.vector").format(ext),
            ops=self._sql.SQL("{}.vector_cosine_ops").format(ext),
            dist=self._sql.SQL("OPERATOR({}.<=>)").format(ext))

    def _table_dim(self, conn: Any) -> int | None:
        found = conn.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'embedding'",
            (TABLE,)).fetchone()
        return int(found[0]) if found else None

    def _ready(self, conn: Any) -> bool:
        if self._dim is None:
            self._dim = self._table_dim(conn)
        return self._dim is not None

    def _ensure(self, dim: int) -> None:
        """Create the table for ``dim``-dimensional vectors if it is missing, in its own committed
        transaction (a unit that rolls back must not take the table with it)."""
        def create(conn: Any) -> int:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            have = self._table_dim(conn)
            if have is not None:
                return have
            conn.execute(self._q(
                f"CREATE TABLE {TABLE} (id TEXT PRIMARY KEY, user_id TEXT NOT NULL, layer TEXT NOT NULL,"
                " session_id TEXT NOT NULL, timestamp DOUBLE PRECISION NOT NULL,"
                f" embedding {{vec}}({int(dim)}) NOT NULL)"))
            conn.execute(f"CREATE INDEX {TABLE}_user ON {TABLE} (user_id, layer, session_id)")
            conn.execute(self._q(f"CREATE INDEX {TABLE}_hnsw ON {TABLE} USING hnsw (embedding {{ops}})"))
            return dim

        if self._dim is None:
            self._dim = int(self.db.write(create, detached=True))
        self._check_dim(dim)

    def _check_dim(self, dim: int) -> None:
        if self._dim is not None and self._dim != dim:
            raise VectorIndexError(
                f"the pgvector table holds {self._dim}-dimensional vectors, but this embedder makes {dim}: "
                "the embedder changed. Workers sharing a store must use the same embedder: if another "
                "worker rebuilt the index with a new one, open this one with that embedder too; else call "
                "rebuild_index() from one process (the other workers stopped) to re-embed everything.")

    # ---- the protocol ------------------------------------------------------------
    def upsert(self, items: list[VectorItem]) -> None:
        if items:
            refuse_bad_vectors(items)
            self._fresh(lambda: self._upsert(items))

    def _upsert(self, items: list[VectorItem]) -> None:
        self._ensure(len(items[0].vector))
        rows = sorted(((i.id, i.user_id, i.layer, i.session_id, float(i.timestamp),
                        np.asarray(i.vector, dtype=np.float64).tolist()) for i in items),
                      key=lambda r: r[0])  # one lock order for every worker
        statement = self._q(
            f"INSERT INTO {TABLE} (id, user_id, layer, session_id, timestamp, embedding)"
            " VALUES (%s, %s, %s, %s, %s, %s::float8[]::{vec}) ON CONFLICT (id) DO UPDATE SET"
            " user_id = EXCLUDED.user_id, layer = EXCLUDED.layer, session_id = EXCLUDED.session_id,"
            " timestamp = EXCLUDED.timestamp, embedding = EXCLUDED.embedding")

        def run(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.executemany(statement, rows)

        self._run(self.db.write, run, "upsert")

    def query(
        self, vectors: np.ndarray, *, user_id: str, k: int,
        layers: Sequence[str] | None = None, session_id: str | None = None,
        among: Sequence[str] | None = None,
    ) -> list[list[tuple[str, float]]]:
        refuse_bad_queries(vectors)
        if among is not None and not among:
            return [[] for _ in range(len(vectors))]
        return self._fresh(lambda: self._query(vectors, user_id=user_id, k=k, layers=layers,
                                               session_id=session_id, among=among))

    def _query(
        self, vectors: np.ndarray, *, user_id: str, k: int, layers: Sequence[str] | None,
        session_id: str | None, among: Sequence[str] | None,
    ) -> list[list[tuple[str, float]]]:
        where, params = "user_id = %s", list[Any]([user_id])
        if layers:
            where, params = where + " AND layer = ANY(%s)", [*params, list(layers)]
        if session_id is not None:
            where, params = where + " AND session_id = %s", [*params, session_id]
        if among is not None:
            where, params = where + " AND id = ANY(%s)", [*params, list(among)]
        statement = self._q(
            f"SELECT id, embedding {{dist}} %s::float8[]::{{vec}} AS d FROM {TABLE}"
            f" WHERE {where} ORDER BY d LIMIT %s")

        counted = f"SELECT count(*) FROM (SELECT 1 FROM {TABLE} WHERE {where} LIMIT %s) AS r"

        def run(conn: Any) -> list[list[tuple[str, float]]]:
            if not self._ready(conn):
                return [[] for _ in range(len(vectors))]
            self._check_dim(int(np.shape(vectors)[1]))
            # among: the primary key already narrows to those rows; otherwise the user's size
            # decides (a bounded count on the b-tree), not the planner's guess from statistics
            limit = self._limit(conn)
            exact = among is not None or exact_scan(int(conn.execute(counted, [*params, limit]).fetchone()[0]), limit)
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false),"
                         " set_config('hnsw.ef_search', %s, false),"
                         " set_config('enable_indexscan', %s, false)",
                         (str(min(MAX_EF_SEARCH, max(self.ef_search, k))), "off" if exact else "on"))
            try:
                # never a prepared statement: its generic plan, made without knowing the user, would
                # pick one path (exact sort or HNSW) for small and large users alike
                return [cosine_ids(conn.execute(statement, [np.asarray(v, dtype=np.float64).tolist(), *params, k],
                                                prepare=False).fetchall()) for v in vectors]
            finally:
                if exact:  # the pooled connection serves other queries next: index scans back on
                    conn.execute("RESET enable_indexscan")

        out: list[list[tuple[str, float]]] = self._run(self.db.read, run, "query")
        return out

    def _limit(self, conn: Any) -> int:
        """The user size from which queries walk HNSW, for the table as it is now."""
        if self.exact_below is not None:
            return self.exact_below
        found = conn.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", (TABLE,)).fetchone()
        total = float(found[0]) if found else -1.0  # none: dropped since it was noted (the count fails)
        if total < 0:  # never analysed yet (a new table): count it
            total = float(conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])
        return exact_limit(total, self.ef_search)

    def delete(self, ids: list[str]) -> None:
        if ids:
            self._when_ready(self.db.write, lambda conn: conn.execute(
                f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (sorted(set(ids)),)), "delete")

    def delete_user(self, user_id: str) -> None:
        self._when_ready(self.db.write, lambda conn: conn.execute(
            f"DELETE FROM {TABLE} WHERE user_id = %s", (user_id,)), "delete")

    def ids(self, user_id: str | None = None) -> set[str]:
        where, params = ("WHERE user_id = %s", (user_id,)) if user_id is not None else ("", ())
        found = self._when_ready(self.db.read, lambda conn: conn.execute(
            f"SELECT id FROM {TABLE} {where}", params).fetchall(), "read")
        return {r[0] for r in found or []}

    def count(self, user_id: str | None = None) -> int:
        where, params = ("WHERE user_id = %s", (user_id,)) if user_id is not None else ("", ())
        found = self._when_ready(self.db.read, lambda conn: conn.execute(
            f"SELECT count(*) FROM {TABLE} {where}", params).fetchone(), "read")
        return int(found[0]) if found else 0

    def reset(self) -> None:
        self._run(self.db.write, lambda conn: conn.execute(f"DROP TABLE IF EXISTS {TABLE}"), "reset")
        self._dim = None

    def close(self) -> None:
        if self._owns_db:
            self.db.close()

    # ---- plumbing ------------------------------------------------------------------
    def _when_ready(self, via: Callable[[Callable[[Any], Any]], Any], fn: Callable[[Any], Any], what: str) -> Any:
        """``fn(conn)`` if the table exists (before the first vector there is nothing to read or delete)."""
        return self._fresh(lambda: self._run(via, lambda conn: fn(conn) if self._ready(conn) else None, what))

    def _fresh(self, call: Callable[[], T]) -> T:
        """``call()``, run once more when it failed because the table changed under this index's
        note of it: another worker's ``rebuild_index()`` dropped it, or wrote it again at another
        embedder's dimension. The second run looks again, so it reads an empty index, creates the
        table, or is refused by :meth:`_check_dim`'s typed error; without it, the first call after
        such a rebuild failed with the engine's own error. Nothing is written at a wrong dimension:
        PostgreSQL refuses it, and the first run failed whole (inside a joint unit, its savepoint
        rolled back; a failed read there leaves the unit failed, and the unit's caller retries)."""
        noted = self._dim
        try:
            return call()
        except VectorIndexError:
            if noted is None or self._look_again(noted) == noted:
                raise
            return call()

    def _look_again(self, noted: int) -> int | None:
        """The table's dimension now (``None``: no table), noted; ``noted`` if the database
        cannot say (then the call's own error stands)."""
        try:
            self._dim = self.db.read(self._table_dim)
        except TieredMemoryError:
            return noted
        return self._dim

    def _run(self, via: Callable[[Callable[[Any], Any]], Any], fn: Callable[[Any], Any], what: str) -> Any:
        try:
            return via(fn)
        except TieredMemoryError as e:  # the database's StoreError: here it is the vector engine's
            self._dim = None  # the table may have changed (another process's reset): look again
            if isinstance(e, VectorIndexError):
                raise
            raise VectorIndexError(f"pgvector {what} failed: {e}") from e
