"""A SQLite database for tiered-memory: one connection, its settings, transactions, versioned
migrations, the meta table and durability.

:class:`SQLiteDatabase` is the plumbing under :class:`~.sqlite.SQLiteRecordStore`, as
:class:`~.postgres_db.PostgresDatabase` is under the PostgreSQL store: one connection
behind a re-entrant lock (thread-safe; one process per file), in WAL mode with
``synchronous=FULL``, so a commit is on the disk when it returns, unless a bulk write
asks for ``_synced(False)`` and calls :meth:`SQLiteDatabase.sync` at its end, or a mark
that the next open redoes if it is lost commits through
:meth:`SQLiteDatabase.unsynced_transaction` (a row's vectors written). A file that
tiered-memory did not create is refused before anything in it changes.

Opened ``read_only``, the file is read beside the process that writes it (the CLI's read
commands while an application holds the folder): SQLite's ``mode=ro``, so no statement can
write; WAL readers see committed transactions and never block the writer. Nothing is set up
or migrated: a schema older than this code is refused (:meth:`SQLiteDatabase.migrate`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..errors import CorruptStoreError, StoreError, UsageError
from ..guard import check_process
from .base import warn_if_later
from .sqlite_schema import Step, split_sql
from .stored_values import lenient_text
from .text_search import fts5_text, keyword_text, user_tag

APP_ID = "tiered-memory"

# 32 MiB of page cache per connection (SQLite's default is 2): re-reading FTS5 posting lists
# cost ~25% of a keyword search at 24,000 memories (measured while they held every user's rows)
CACHE_KIB = 32768
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default; none between unsynced commits (see _synced)
WAL_LIMIT_BYTES = 64 << 20  # a WAL grown by a long bulk write is cut back to this once checkpointed


# SQLite keeps whatever bytes another writer gave a TEXT value (a lone surrogate's, a cut
# multi-byte letter's), which Python's default decoding refuses, failing the whole statement.
# Read leniently (stored_values.lenient_text: U+FFFD instead) it costs a Python call per value
# (0.2 ms more for 400 rows of 6 text columns, one-off), so a read (SQLiteDatabase.query) takes
# it only when the default decoding failed; transactions and snapshots (writes, repair,
# export) take it throughout.
UNDECODABLE = "Could not decode to UTF-8"  # sqlite3's error for such a value


#: The SQL function, registered on every connection, that writes a text's CJK runs as their
#: bigrams (:func:`~.text_search.fts5_text`): the migration of the layer tables' keyword indexes to
#: bigrams calls it (``sqlite_layers.cjk_words``), and the triggers and views it leaves do until the
#: migration to per-user keywords replaces them (on a store that had not run either yet).
CJK_GRAMS = "tm_cjk_grams"

#: The SQL function, registered on every connection, that gives the keywords of a layer row
#: (facts, episode key points, items): ``tm_keyword_text(tag number, text)`` is
#: :func:`~.text_search.keyword_text` of the user's tag; their triggers call it
#: (``sqlite_layers.tagged_index``).
KEYWORD_TEXT = "tm_keyword_text"


def _cjk_grams(value: str | bytes | int | float | None) -> str | bytes | int | float | None:
    """:func:`~.text_search.fts5_text` as SQL: given a text's bytes (an undecodable byte
    read as U+FFFD), or a text; any other value as it is."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return fts5_text(value) if isinstance(value, str) else value


def _keyword_text(number: int | None, value: str | bytes | int | float | None) -> str | None:
    """:func:`~.text_search.keyword_text` as SQL: the user's tag number and a text's bytes (an
    undecodable byte read as U+FFFD), or a text; no keywords (an empty entry) for no text or
    no tag."""
    if value is None or number is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return keyword_text(user_tag(int(number)), text)


def register_functions(conn: sqlite3.Connection) -> None:
    """Give ``conn`` the SQL functions the layer tables' keyword triggers call
    (:data:`KEYWORD_TEXT`) and their earlier migrations call (:data:`CJK_GRAMS`). Every
    connection of the library has them. Another program that inserts into the facts, episode
    points or items tables, or changes a row's text, registers them the same way, or gets "no
    such function"; reading the tables, and their FTS5 indexes, needs nothing."""
    conn.create_function(CJK_GRAMS, 1, _cjk_grams, deterministic=True)
    conn.create_function(KEYWORD_TEXT, 2, _keyword_text, deterministic=True)


class SQLiteDatabase:
    """One SQLite file opened for tiered-memory (created with its ``meta`` table when empty).

    Args:
        path: the database file.
        read_only: read an existing file without writing to it (see the module's docstring).
    """

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        # a read-only reader of a file no connection has open makes its -wal and -shm (SQLite
        # does, for any WAL reader) and cannot remove them: close() lets SQLite do it
        self._made_wal = read_only and not _wal(self.path).exists()
        self.lock = threading.RLock()
        self._pid, self._closed = os.getpid(), False
        conn: sqlite3.Connection | None = None
        try:
            # a read-only WAL reader still maps the -shm file, which the writer keeps (or SQLite
            # creates) beside the database: only the database file itself is opened read-only
            where = f"{self.path.resolve().as_uri()}?mode=ro" if read_only else str(self.path)
            self.conn = conn = sqlite3.connect(
                where, uri=read_only, check_same_thread=False, isolation_level=None, timeout=30
            )
            register_functions(conn)
            # identify the file before changing anything in it (WAL mode is persistent)
            self._check_identity()
            if not read_only:
                self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            # freed pages are zeroed, so forgotten text does not linger in the file
            self.conn.execute("PRAGMA secure_delete=ON")
            self.conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            self.conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        except sqlite3.DatabaseError as e:
            if conn is not None:
                conn.close()
            raise CorruptStoreError(
                f"{self.path} is not a readable tiered-memory database ({e}). "
                "Point `path` at an empty or tiered-memory folder."
            ) from e
        except CorruptStoreError:
            if conn is not None:
                conn.close()
            raise

    def _check_identity(self) -> None:
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables and self.read_only:
            raise CorruptStoreError(f"{self.path} holds no tables yet: there is nothing to read")
        if not tables:
            with self.transaction() as c:
                c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                c.execute("INSERT INTO meta VALUES ('app', ?)", (APP_ID,))
            return
        app = None
        if "meta" in tables:
            found = self.conn.execute("SELECT value FROM meta WHERE key='app'").fetchone()
            app = found[0] if found else None
        if app != APP_ID:
            raise CorruptStoreError(
                f"{self.path} is a SQLite database that tiered-memory did not create "
                f"(tables: {sorted(tables)[:5]}). Use another path."
            )

    def check_usable(self) -> None:
        """Raise ``UsageError`` if this connection was closed or opened in another process
        (inherited through ``fork``); every read and write checks it first."""
        check_process(self._pid, self._closed)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.check_usable()
        if self.read_only:
            raise UsageError(f"{self.path} was opened read-only: nothing may be written through it")
        with self.lock, self._lenient():
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException as e:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise StoreError(f"record store write failed: {e}") from e
                raise

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read inside sees one state of the file (one read transaction): an export
        taken while another process writes is consistent. Nothing may be written inside."""
        self.check_usable()
        with self.lock, self._lenient():
            self.conn.execute("BEGIN")  # deferred: it stays a read transaction
            try:
                yield
            finally:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")

    @contextmanager
    def _lenient(self) -> Iterator[None]:
        """Text read with :func:`~.stored_values.lenient_text` meanwhile (the caller holds the lock)."""
        before = self.conn.text_factory
        self.conn.text_factory = lenient_text
        try:
            yield
        finally:
            self.conn.text_factory = before

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        self.check_usable()
        with self.lock:
            try:
                try:
                    return self.conn.execute(sql, tuple(params)).fetchall()
                except sqlite3.OperationalError as e:
                    if UNDECODABLE not in str(e):
                        raise
                    with self._lenient():  # a value another writer left undecodable: read it again
                        return self.conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"record store read failed: {e}") from e

    def migrate(self, name: str, steps: Sequence[Step]) -> None:
        """Apply the ``steps`` not yet recorded for ``name`` in ``schema_migrations``, with their
        version rows, in one transaction: all or none of them, and one commit (one wait for the
        disk) where a step each made a new store's open wait for 28. Opened read-only, pending
        steps are refused instead: the code's queries may need them.

        A store a later version migrated further opens, with a warning (``warn_if_later``).

        Raises:
            StoreError: read-only, and the store's schema is older than this code."""
        if self.read_only:
            current = self.schema_version(name)
            warn_if_later(self.path, name, current, len(steps))
            if current < len(steps):
                raise StoreError(
                    f"{self.path} has an older schema than this version of tiered-memory ({name!r} at "
                    f"version {current} of {len(steps)}), and a read-only open cannot migrate it. Open it "
                    "once with this version, with the folder to itself (stop the application that holds "
                    "it, or upgrade the application), then read it again.")
            return
        table = self.query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'")
        current = self.schema_version(name)
        warn_if_later(self.path, name, current, len(steps))
        if table and current >= len(steps):
            return  # not a write transaction on every open
        with self.transaction() as c:
            c.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT NOT NULL,"
                      " version INTEGER NOT NULL, applied_at REAL NOT NULL, PRIMARY KEY (name, version))")
            for version, step in enumerate(steps[current:], start=current + 1):
                if callable(step):
                    step(c)
                else:
                    for statement in split_sql(step):
                        c.execute(statement)
                c.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", (name, version, time.time()))

    def schema_version(self, name: str = "core") -> int:
        """The last migration applied for ``name`` (earlier stores kept it in ``meta``); 0 for none."""
        recorded = 0
        if self.query("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'"):
            found = self.query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations WHERE name=?", (name,))
            recorded = int(found[0][0])
        return max(recorded, int(self.get_meta(f"schema_version:{name}") or 0))

    def get_meta(self, key: str) -> str | None:
        found = self.query("SELECT value FROM meta WHERE key=?", (key,))
        return found[0][0] if found else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as c:
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def change_meta(self, key: str, change: Callable[[str | None], str]) -> str:
        with self.transaction() as c:  # BEGIN IMMEDIATE: no other writer, of any process, meanwhile
            found = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            value = change(found[0] if found else None)
            c.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            return value

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self.conn.close()
            if self._made_wal:
                _remove_reader_files(self.path)

    @contextmanager
    def _synced(self, sync: bool) -> Iterator[None]:
        """Commits inside wait for the disk (``synchronous=FULL``, the default) or not
        (``NORMAL``: in WAL mode a crash of the process keeps them, a power cut may lose
        them until the next FULL commit, whose sync of the WAL covers every frame before it)."""
        self.check_usable()
        with self.lock:
            if sync:
                yield
                return
            # and no checkpoint between them: each would sync the database file (a bulk write's
            # chunks checkpointed at nearly every commit); the next FULL commit checkpoints
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
            try:
                yield
            finally:
                self.conn.execute("PRAGMA synchronous=FULL")
                self.conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")

    @contextmanager
    def unsynced_transaction(self) -> Iterator[sqlite3.Connection]:
        """A transaction whose commit does not wait for the disk (:meth:`_synced`), for a mark
        whose loss to a power cut only leaves work the next open does again (a row's vectors
        written: the rows stay pending and are indexed again, idempotently); the next durable
        commit syncs it with everything before it."""
        with self._synced(False), self.transaction() as c:
            yield c

    def sync(self) -> None:
        # every commit is in the WAL, in order: syncing the file is what a FULL commit does
        wal = self.path.with_name(self.path.name + "-wal")
        with self.lock:
            try:
                fd = os.open(wal, os.O_RDONLY)
            except FileNotFoundError:
                return  # checkpointed and removed: the database file holds it all
            try:
                os.fsync(fd)
            except OSError as e:
                raise StoreError(f"record store sync failed: {e}") from e
            finally:
                os.close(fd)


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _remove_reader_files(path: Path) -> None:
    """Remove the empty -wal and the -shm a read-only reader of ``path`` made, the way SQLite
    does: the last connection to close a WAL database deletes both, and only when it is the
    last (it takes the database's exclusive lock for that), so a writer or reader that opened
    it meanwhile keeps them. A -wal that holds frames (a writer came and went) is left for
    the writer's next open; nothing is written to the database file."""
    try:
        if _wal(path).stat().st_size:
            return
        conn = sqlite3.connect(str(path), timeout=0)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # joins the WAL, reads only
        finally:
            conn.close()
    except (OSError, sqlite3.Error):  # gone already, a folder we may not write, busy: they stay
        pass
