"""A PostgreSQL database for tiered-memory: pool, own schema, transactions, versioned migrations.

:class:`PostgresDatabase` is the plumbing under :class:`~.postgres.PostgresRecordStore`:
a ``psycopg_pool`` pool whose connections use the store's schema (``tiered_memory`` by
default, so tables never collide with an application's), one transaction per write
(retried whole on deadlock or serialization failure), and migrations recorded in the
``schema_migrations`` version table under an advisory lock, so workers starting
together apply each exactly once.

:meth:`PostgresDatabase.together` is the seam for writes that must commit as one: while
it runs on a thread, every ``write``, ``transaction``, ``query`` and ``read`` of this
database on that thread joins its transaction (each write in a savepoint), so another
component sharing the database, such as the pgvector index, commits with the records or
not at all. Other threads keep using their own pooled connections.

A restart of the server needs nothing of the caller: the pool checks a connection before
handing it out and replaces a dead one, and a call whose connection the server or the network
ends midway runs once more on a fresh one (a read; a write not yet committing, which the server
rolled back whole; see ``_unit``); while the server is down a call waits at most
``connect_timeout`` (twice when the server answers again meanwhile) and fails with a
``StoreError`` naming the server, and the same object works again once it answers. A server
that goes silent without closing its connections (:data:`~.postgres_url.NETWORK_DEFAULTS`)
fails a call with a ``StoreError`` within about a minute instead of holding it for hours. What a
failed write means (run again, or which typed error) is :mod:`.postgres_failures`'s.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, Union

from ..errors import ConfigurationError, CorruptStoreError, StoreError, missing
from ..guard import check_process
from .base import warn_if_later
from .postgres_connect import attempt, check_refused, unreachable, wait_for_server
from .postgres_failures import commit_failed, conflicted, write_failed
from .postgres_url import checked_wait, connect_wait, libpq_settings, network_settings, redact

APP_ID = "tiered-memory"
DEFAULT_SCHEMA = "tiered_memory"
#: seconds a store waits for its server when neither the code nor libpq's settings say
DEFAULT_WAIT = 10.0
#: what ends a query whose rows a transaction holds till it commits (another writer of them waits):
#: the owed deletions a payment holds, the facts a consolidation merge holds
ROW_LOCK = " FOR UPDATE"
#: added to :data:`ROW_LOCK`: rows another transaction holds are left out instead of waited for (a
#: payment over everything owed leaves the entries another payer holds to it)
SKIP_LOCKED = " SKIP LOCKED"

# A migration step is SQL text (may hold several statements) or a function of the
# connection, run inside the step's transaction. Append, never edit.
Step = Union[str, Callable[[Any], None]]


def lock_key(name: str) -> int:
    """A stable 32-bit advisory-lock key (the same in every process)."""
    return zlib.crc32(name.encode("utf-8"))


class PostgresDatabase:
    """Pooled connections to one schema of a PostgreSQL database (thread- and process-safe).

    Args:
        url: a libpq URL, ``postgresql://user:password@host:5432/dbname``; the keepalive and
            ``tcp_user_timeout`` settings neither it nor its service file sets are
            :data:`~.postgres_url.NETWORK_DEFAULTS`.
        schema: the PostgreSQL schema holding the tables; created when missing.
        min_size: connections the pool keeps open.
        max_size: most connections this process opens.
        connect_timeout: seconds to wait for the first connection before failing, and for a
            connection later: a call made while the server is down fails after it with a
            ``StoreError`` naming the server; once it answers again the pool reconnects. When
            not given, libpq's ``connect_timeout`` of the URL or its service file, else
            ``PGCONNECT_TIMEOUT`` (:func:`~.postgres_url.connect_wait`), else 10; given, it wins
            over theirs (which each connection attempt of libpq still keeps).

    Raises:
        ConfigurationError: a URL that cannot be read, or whose ``connect_timeout`` is no number
            of seconds or no limit (0 or less); a ``connect_timeout`` argument that is not a finite
            number above 0; a database, role or password the server refuses.
        StoreError: the server did not answer within ``connect_timeout``.
    """

    def __init__(
        self, url: str, *, schema: str = DEFAULT_SCHEMA, min_size: int = 1, max_size: int = 8,
        connect_timeout: float | None = None,
    ) -> None:
        try:
            import psycopg
            from psycopg import sql
            from psycopg.conninfo import conninfo_to_dict
            from psycopg_pool import ConnectionPool
        except ImportError as e:  # the one not installed: psycopg alone may be (an app's own dependency)
            raise missing("psycopg-pool" if e.name == "psycopg_pool" else "psycopg", "postgres") from e
        self._psycopg = psycopg
        self._joined = threading.local()  # .conn: the connection of this thread's `together` unit
        self._pid, self._closed = os.getpid(), False
        self.url = url
        self.schema = schema
        try:  # a malformed URL never reaches the pool, whose log lines would quote it whole
            given = conninfo_to_dict(url)
        except psycopg.Error as e:
            raise ConfigurationError(
                f"the PostgreSQL URL {redact(url, url)} cannot be read ({redact(str(e).strip(), url)}); "
                "the form is postgresql://user:password@host:5432/dbname") from None  # the cause quotes it
        # as connection arguments beside the URL, which stays as given (its password is hidden by
        # what quotes it); the settings of the URL and of its service file win
        settings = libpq_settings(url, given)
        self._network: dict[str, Any] = network_settings(settings)
        wait = connect_wait(url, settings)  # checked even when the argument wins: each connection reads it
        connect_timeout = checked_wait(connect_timeout) if connect_timeout is not None \
            else DEFAULT_WAIT if wait is None else wait
        search_path = sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))

        def configure(conn: Any) -> None:
            conn.execute(search_path)

        # the pool starts once the server answers (wait_for_server): a server that refuses for good
        # (no such database or role, a wrong password) fails the open at once, and no pool logs
        # its tries while the open waits
        why = wait_for_server(psycopg, url, self._network, connect_timeout)
        check_refused(url, why)
        if why is not None:
            raise unreachable(url, connect_timeout, why)
        # reconnect_timeout: the pool's own reconnection attempts back off exponentially (after a
        # 90 s outage the next one came a minute after the server was back); bounded here, the
        # next call asks for a connection again instead
        self.timeout = connect_timeout
        self.pool = ConnectionPool(
            url, min_size=min_size, max_size=max_size, open=False, configure=configure,
            kwargs={"autocommit": True, **self._network}, check=ConnectionPool.check_connection,
            name="tiered-memory", timeout=connect_timeout, reconnect_timeout=connect_timeout,
        )
        try:
            self.pool.open(wait=True, timeout=connect_timeout)
        except Exception as e:  # the server answered just now, and then not (or refuses now)
            self.pool.close()
            why = self._why(connect_timeout)
            check_refused(url, why)
            raise unreachable(url, connect_timeout, why or str(e)) from e
        try:
            self._bootstrap()
        except BaseException:
            self.pool.close()
            raise

    # ---- plumbing -------------------------------------------------------
    def _why(self, timeout: float) -> str | None:
        """Why a connection fails, from one direct attempt (:func:`~.postgres_connect.attempt`):
        the pool only says it timed out."""
        return attempt(self._psycopg, self.url, self._network, timeout)

    def _checkout(self) -> Any:
        """A pooled connection that answers (the pool replaces dead ones first); a ``StoreError``
        naming the server if none comes within ``connect_timeout``. A server that answers again
        by then gets one more wait: the pool may still be backing off from the outage."""
        from psycopg_pool import PoolTimeout

        try:
            return self.pool.getconn()
        except PoolTimeout as e:
            why = self._why(self.timeout)
            if why is None:
                try:
                    return self.pool.getconn()
                except PoolTimeout as busy:  # the server answers, yet no connection came free
                    raise StoreError(
                        f"no connection to PostgreSQL at {redact(self.url, self.url)} came free within "
                        f"{2 * self.timeout}s: all {self.pool.max_size} are busy. Give the store a larger "
                        "max_size or connect_timeout.") from busy
            raise StoreError(
                f"PostgreSQL at {redact(self.url, self.url)} is unreachable: no connection within "
                f"{self.timeout}s ({redact(why, self.url)}), so this step wrote nothing. The memory "
                "reconnects by itself once the server answers: retry the call then.") from e

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        conn = self._checkout()
        try:
            with conn:  # as the pool's own connection(): a failed unit rolls back
                yield conn
        finally:
            self.pool.putconn(conn)

    def _bootstrap(self) -> None:
        from psycopg import sql

        def run(conn: Any) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("tiered-memory:schema"),))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT NOT NULL,"
                " version INTEGER NOT NULL, applied_at DOUBLE PRECISION NOT NULL,"
                " PRIMARY KEY (name, version))")
            found = conn.execute("SELECT value FROM meta WHERE key='app'").fetchone()
            if found is None:
                others = conn.execute("SELECT count(*) FROM meta").fetchone()[0]
                if others:
                    raise CorruptStoreError(
                        f"schema {self.schema!r} holds a 'meta' table that tiered-memory did not "
                        "create. Use another schema (PostgresRecordStore(url, schema=...)).")
                conn.execute("INSERT INTO meta VALUES ('app', %s)", (APP_ID,))
            elif found[0] != APP_ID:
                raise CorruptStoreError(
                    f"schema {self.schema!r} belongs to {found[0]!r}, not tiered-memory. "
                    "Use another schema.")

        self.write(run)

    def check_usable(self) -> None:
        """Raise ``UsageError`` if this pool was closed or opened in another process
        (inherited through ``fork``); every read and write checks it first."""
        check_process(self._pid, self._closed)

    def _ambient(self) -> Any:
        return getattr(self._joined, "conn", None)

    def write(self, fn: Callable[[Any], Any], *, retries: int = 3, detached: bool = False) -> Any:
        """Run ``fn(conn)`` in one transaction, run again as :meth:`_unit` says. Inside
        :meth:`together` it runs in a savepoint of that unit's transaction instead, unless
        ``detached`` (set-up such as creating a table, which must not roll back with the unit)."""
        self.check_usable()
        joined = None if detached else self._ambient()
        if joined is not None:
            try:
                with joined.transaction():
                    return fn(joined)
            except self._psycopg.Error as e:
                raise write_failed(e) from e
        return self._unit(fn, retries)

    def together(self, fn: Callable[[], Any], *, retries: int = 3) -> Any:
        """Run ``fn()`` as one transaction: every write of this database that ``fn`` makes on
        this thread (through any component sharing the database) commits with the others or,
        if ``fn`` raises, none does. Run again whole as :meth:`_unit` says (so ``fn`` must be
        safe to run again: it only writes through this database). Nested calls join the outer
        unit."""
        self.check_usable()
        if self._ambient() is not None:
            return fn()

        def joined(conn: Any) -> Any:
            self._joined.conn = conn
            try:
                return fn()
            finally:
                self._joined.conn = None

        return self._unit(joined, retries)

    def _unit(self, fn: Callable[[Any], Any], retries: int) -> Any:
        """``fn(conn)`` in one transaction of a pooled connection, run again whole on a conflict
        between workers (deadlock, serialization failure: up to ``retries`` times) and once when
        the server or the network ended the connection before the commit (``pg_terminate_backend``,
        a restart, a proxy): the server rolled that transaction back, so running it again stores it
        once. A connection lost during the commit is not run again: the commit may have been made."""
        conflicts, lost = 0, False
        while True:
            conn, committing = None, False
            try:
                with self._connection() as conn, conn.transaction():
                    result = fn(conn)
                    self._alive(conn)
                    committing = True
                return result
            except Exception as e:
                cause = e if isinstance(e, self._psycopg.Error) else e.__cause__
                if conflicted(cause) and conflicts < retries:
                    time.sleep(0.01 * 2**conflicts)
                    conflicts += 1
                    continue
                if conn is not None and conn.broken and not committing and not lost:
                    lost = True
                    continue
                if isinstance(e, self._psycopg.Error):
                    raise commit_failed(e, conn, committing) from e
                raise

    def _alive(self, conn: Any) -> None:
        """Raise if ``conn`` broke under the code that ran in its transaction (which caught the
        error): psycopg would skip the COMMIT without a word, and nothing would be stored."""
        if conn.broken:
            raise self._psycopg.OperationalError("the connection to PostgreSQL was lost before the commit")

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A connection inside one transaction, for other layers' multi-statement writes (not run
        again when its connection is lost: the caller's code runs inside it)."""
        self.check_usable()
        joined = self._ambient()
        conn, committing = None, False
        try:
            if joined is not None:
                with joined.transaction():
                    yield joined
                return
            with self._connection() as conn, conn.transaction():
                yield conn
                self._alive(conn)
                committing = True
        except self._psycopg.Error as e:
            raise commit_failed(e, conn, committing) from e

    def read(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(conn)`` on one connection, outside a transaction (several reads, one round
        trip each, that share session settings), once more on a fresh connection if the server or
        the network ended the first; inside :meth:`together`, on its connection."""
        self.check_usable()
        joined = self._ambient()
        for attempt in range(2):
            conn = None
            try:
                if joined is not None:
                    return fn(joined)
                with self._connection() as conn:
                    return fn(conn)
            except self._psycopg.Error as e:
                if attempt == 0 and conn is not None and conn.broken:
                    continue
                raise StoreError(f"record store read failed: {e}") from e
        raise AssertionError("unreachable")

    def query(self, sql: Any, params: Sequence[Any] | dict[str, Any] = (), *,
              prepare: bool | None = None) -> list[tuple[Any, ...]]:
        """The rows of one statement (:meth:`read`). ``prepare`` is psycopg's: ``None`` prepares
        a statement once this connection ran it five times, ``False`` never (planned with its values)."""
        rows: list[tuple[Any, ...]] = self.read(lambda conn: conn.execute(sql, params, prepare=prepare).fetchall())
        return rows

    def migrate(self, name: str, steps: Sequence[Step]) -> None:
        """Apply the ``steps`` not yet recorded for ``name`` in ``schema_migrations``. Each step runs
        in its own transaction under an advisory lock, so workers starting together apply it exactly
        once; a store a later version migrated further opens with a warning (``warn_if_later``)."""
        now = self.schema_version(name)
        warn_if_later(f"the PostgreSQL schema {self.schema!r}", name, now, len(steps))
        if now >= len(steps):
            return
        for version, step in enumerate(steps, start=1):
            def run(conn: Any, version: int = version, step: Step = step) -> None:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(f"tiered-memory:{name}"),))
                done = conn.execute(
                    "SELECT 1 FROM schema_migrations WHERE name=%s AND version=%s", (name, version)
                ).fetchone()
                if done:
                    return
                if callable(step):
                    step(conn)
                else:
                    conn.execute(step)  # no parameters: several statements are allowed
                conn.execute("INSERT INTO schema_migrations VALUES (%s, %s, %s)",
                             (name, version, time.time()))

            self.write(run, retries=0, detached=True)  # a unit that rolls back keeps the tables

    def user_rows(self, conn: Any, table: str, user_id: str, cap: int) -> int:
        """How many rows of ``user_id`` ``table`` holds, counted only up to ``cap`` (a bounded
        walk of the table's b-tree on ``user_id``, whatever the user's size)."""
        from psycopg import sql

        found = conn.execute(sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE user_id = %s LIMIT %s) AS r")
                             .format(sql.Identifier(table)), (user_id, cap)).fetchone()
        return int(found[0])

    def schema_version(self, name: str = "core") -> int:
        return int(self.query(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations WHERE name=%s", (name,))[0][0])

    def get_meta(self, key: str) -> str | None:
        found = self.query("SELECT value FROM meta WHERE key=%s", (key,))
        return found[0][0] if found else None

    def set_meta(self, key: str, value: str) -> None:
        self.change_meta(key, lambda _: value)

    def change_meta(self, key: str, change: Callable[[str | None], str]) -> str:
        def run(c: Any) -> str:  # the key's lock first: a worker reads it once the last change committed
            c.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(f"tiered-memory:meta:{key}"),))
            found = c.execute("SELECT value FROM meta WHERE key=%s", (key,)).fetchone()
            value = change(found[0] if found else None)
            c.execute("INSERT INTO meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value=EXCLUDED.value",
                      (key, value))
            return value

        return str(self.write(run))

    def close(self) -> None:
        self._closed = True
        self.pool.close()
