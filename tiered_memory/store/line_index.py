"""A scratch index of a file's lines, on disk: what the first pass of a JSONL import
(:mod:`tiered_memory.portable_import`) keeps of each line, so that its memory does not grow with
the file; and values held on disk to be read back in another order (:meth:`LineIndex.hold`: the
facts an import restores and their history, sorted on disk by each entry's place).

It is no store: a private temporary SQLite database (``sqlite3.connect("")``), which SQLite keeps
in its page cache up to :data:`CACHE_KIB` and spills to a temporary file past it, and deletes
as it closes. Nothing of the memory is ever in it.
"""

from __future__ import annotations

import sqlite3
from typing import Iterator

CACHE_KIB = 2000  # SQLite's page cache, in KiB: what the index holds in memory at most
HOLD_BYTES = 64 * 1024  # values held in memory before they are written to the index


class LineIndex:
    """Per line: its kind (a small int, the caller's), where it starts in the file and the
    number it is read back in the order of (the caller's; 0 by default); per record identity
    (a string, the caller's), the first line that holds it. Used from one thread."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("")
        self._db.executescript(
            f"PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-{CACHE_KIB};"
            "CREATE TABLE lines (n INTEGER PRIMARY KEY, kind INTEGER NOT NULL, at INTEGER NOT NULL,"
            " key REAL NOT NULL);"
            "CREATE TABLE seen (key TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;"
            # no declared types: a key is compared as the number or text it was held as
            "CREATE TABLE held (kind INTEGER NOT NULL, k0, k1, k2, value TEXT NOT NULL, blob BLOB);")
        self._pending: list[tuple[int, int, int, float]] = []
        self._holding: list[tuple[object, ...]] = []
        self._holding_bytes = 0

    def first_line(self, key: str, n: int) -> int | None:
        """The line that already holds ``key``; else ``None``, and line ``n`` holds it now."""
        if self._db.execute("INSERT OR IGNORE INTO seen VALUES (?, ?)", (key, n)).rowcount:
            return None
        return int(self._db.execute("SELECT n FROM seen WHERE key=?", (key,)).fetchone()[0])

    def add(self, n: int, kind: int, at: int, key: float = 0.0) -> None:
        """Line ``n``, of ``kind``, starts at byte ``at`` (lines are added in the file's order)."""
        self._pending.append((n, kind, at, key))
        if len(self._pending) >= 1000:
            self.flush()

    def flush(self) -> None:
        """Every line added so far written to the index (:meth:`of` reads only those)."""
        self._db.executemany("INSERT INTO lines VALUES (?, ?, ?, ?)", self._pending)
        self._pending.clear()

    def of(self, kind: int, *, by_key: bool = False) -> Iterator[tuple[int, int]]:
        """(line number, where it starts) of the lines of ``kind``, in the file's order (by
        ``key`` first with ``by_key``: a sort on disk)."""
        yield from self._db.execute(f"SELECT n, at FROM lines WHERE kind=? ORDER BY {'key, ' if by_key else ''}n",
                                    (kind,))

    def hold(self, kind: int, value: str, blob: bytes | None = None, keys: tuple[float, float, float] = (0, 0, 0)
             ) -> None:
        """Keep ``value`` (and ``blob``) of ``kind`` on disk, to be read back by :meth:`held` in the
        order of one of the first two ``keys``, then the third, then the order they were held in."""
        self._holding.append((kind, *keys, value, blob))
        self._holding_bytes += len(value) + len(blob or b"")
        if len(self._holding) >= 1000 or self._holding_bytes >= HOLD_BYTES:
            self._flush_held()

    def held(self, kind: int, *, by: int = 0) -> Iterator[tuple[str, bytes | None]]:
        """(value, blob) of what was held of ``kind``, by ``keys[by]`` (0 or 1), then ``keys[2]``,
        then the order held in: a sort on disk, read row by row."""
        self._flush_held()
        column = ("k0", "k1")[by]
        yield from self._db.execute(f"SELECT value, blob FROM held WHERE kind=? ORDER BY {column}, k2, rowid", (kind,))

    def _flush_held(self) -> None:
        self._db.executemany("INSERT INTO held VALUES (?, ?, ?, ?, ?, ?)", self._holding)
        self._holding.clear()
        self._holding_bytes = 0

    def close(self) -> None:
        self._db.close()
