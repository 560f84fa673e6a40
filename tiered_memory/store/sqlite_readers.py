"""Read connections of one SQLite file, so that reads run beside each other and the writer.

In WAL mode a reader never waits for a writer, but one connection behind one lock made
every read wait for every other: four threads searching at once ran at 0.75-0.88x the
speed of one (``bench/scale.py``). Reads made outside a write transaction now take a
connection from this pool.

Invariants:

- A reader connection is read-only (``query_only``): it can never write.
- A read inside a write transaction does not come here: it uses the writer's connection,
  so it sees the transaction's own rows (the store decides, :class:`SQLiteRecordStore`).
- :meth:`Readers.snapshot` makes several reads of one thread see one state of the file
  (one read transaction), as one lock used to.
- After :meth:`Readers.close` no connection is opened again: a read raises ``StoreError``.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import StoreError


class Readers:
    """Args: ``path`` of the database (already created and migrated by its writer);
    ``cache_kib`` of page cache per connection."""

    def __init__(self, path: Path, *, cache_kib: int) -> None:
        self.path = path
        self.cache_kib = cache_kib
        self._free: list[sqlite3.Connection] = []
        self._every: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """A read connection for one read (this thread's snapshot's, inside :meth:`snapshot`)."""
        held: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        conn = self._take()
        try:
            yield conn
        finally:
            self._give(conn)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read of this thread inside the block sees the same committed state."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        conn = self._take()
        self._local.conn = conn
        try:
            conn.execute("BEGIN")
            yield
        finally:
            self._local.conn = None
            try:
                if conn.in_transaction:
                    conn.execute("COMMIT")  # a read transaction: ends the snapshot, writes nothing
            finally:
                self._give(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            every, self._every, self._free = self._every, [], []
        for conn in every:
            conn.close()

    def _take(self) -> sqlite3.Connection:
        with self._lock:
            if self._closed:
                raise StoreError("the record store is closed")
            if self._free:
                return self._free.pop()
        try:
            conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30)
            conn.execute("PRAGMA query_only=ON")
            conn.execute(f"PRAGMA cache_size=-{int(self.cache_kib)}")
        except sqlite3.Error as e:
            raise StoreError(f"could not open a read connection to {self.path}: {e}") from e
        with self._lock:
            if self._closed:
                conn.close()
                raise StoreError("the record store is closed")
            self._every.append(conn)
        return conn

    def _give(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed:
                self._free.append(conn)
