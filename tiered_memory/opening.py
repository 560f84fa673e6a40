"""Opening a :class:`~tiered_memory.TieredMemory`: its record store, its vector index and
the start-up repair that brings the index back in line with the store.

A mixin, so ``memory.py`` stays small (like :mod:`.facade_layers`). ``TieredMemory.__init__``
calls :meth:`OpeningMethods._open_store`, :meth:`OpeningMethods._open_index` and
:meth:`OpeningMethods._startup_repair` in that order; an embedded store folder is held by a
:class:`FolderLock` for as long as the memory is open.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .embedding import Embedder, embedder_name
from .errors import ConfigurationError, StoreLockedError
from .store.base import RecordStore
from .vector.base import VectorIndex

log = logging.getLogger("tiered_memory")

STORE_ENTRIES = frozenset({"records.sqlite3", "records.sqlite3-wal", "records.sqlite3-shm",
                           "records.sqlite3-journal", ".lock", "chroma", "qdrant"})


def foreign_entries(folder: Path) -> list[str]:
    """Names in ``folder`` that are not ours, when it holds no store yet (a user's
    unrelated folder must not be filled with database files)."""
    if (folder / "records.sqlite3").exists():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in STORE_ENTRIES and not p.name.startswith("."))  # .DS_Store, .gitkeep



def configured_record_store() -> str | None:
    """Configuration without code: ``TIERED_MEMORY_RECORD_STORE`` (``sqlite`` or a postgresql:// URL)."""
    return os.environ.get("TIERED_MEMORY_RECORD_STORE") or None


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))

class FolderLock:
    """An exclusive lock on an embedded store folder; the OS drops it if the process dies."""

    def __init__(self, folder: Path) -> None:
        self.file = open(folder / ".lock", "a+")
        try:
            import fcntl

            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no cross-process protection
            pass
        except OSError as e:
            self.file.close()
            raise StoreLockedError(
                f"{folder} is open in another process. The embedded store serves one process; "
                "for many workers use a PostgreSQL record store and a vector server "
                "(see 'Running at scale' in the README)."
            ) from e

    def release(self) -> None:
        self.file.close()


class OpeningMethods:
    """Store and index opening and start-up repair on :class:`~tiered_memory.TieredMemory`."""

    path: Path
    embedder: Embedder
    store: RecordStore
    index: VectorIndex
    _lock: FolderLock | None

    if TYPE_CHECKING:  # defined by TieredMemory, next to the write path they share a lock with
        def _repair(self, *, full: bool) -> dict[str, int]: ...

        def _rebuild(self) -> dict[str, int]: ...

    def _open_store(self, record_store: RecordStore | str | None) -> RecordStore:
        if record_store is not None and not isinstance(record_store, str):
            return record_store
        record_store = record_store or configured_record_store()
        if is_postgres_url(record_store):
            from .store.postgres import PostgresRecordStore

            return PostgresRecordStore(record_store)
        if record_store not in (None, "sqlite"):
            raise ConfigurationError(
                f"record_store must be a RecordStore, 'sqlite' or a postgresql:// URL, got {record_store!r}")
        if self.path.exists() and not self.path.is_dir():
            raise ConfigurationError(f"path {self.path} is a file; tiered-memory needs a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigurationError(f"cannot create memory folder {self.path}: {e}") from e
        if not os.access(self.path, os.R_OK | os.W_OK | os.X_OK):
            raise ConfigurationError(f"memory folder {self.path} is not readable and writable")
        foreign = foreign_entries(self.path)
        if foreign:
            raise ConfigurationError(
                f"{self.path} already holds files that are not a tiered-memory store "
                f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}). "
                "Point `path` at an empty or new folder, or at an existing memory folder.")
        self._lock = FolderLock(self.path)
        from .store.sqlite import SQLiteRecordStore

        try:
            return SQLiteRecordStore(self.path / "records.sqlite3")
        except BaseException:
            self._lock.release()
            raise

    def _open_index(self, vector_store: VectorIndex | str | None) -> VectorIndex:
        if vector_store is not None and not isinstance(vector_store, str):
            return vector_store
        kind = vector_store or os.environ.get("TIERED_MEMORY_VECTOR_STORE") or "chroma"
        if kind in ("chroma", "qdrant") and self._lock is None and getattr(self.store, "shared", False):
            # a shared record store with an embedded index: the index folder still serves one process
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = FolderLock(self.path)
        if kind.startswith(("qdrant+http://", "qdrant+https://")):
            from .vector.qdrant import QdrantVectorIndex

            return QdrantVectorIndex(url=kind[len("qdrant+"):], api_key=os.environ.get("QDRANT_API_KEY"))
        if kind.startswith(("http://", "https://")):
            from .vector.chroma import ChromaVectorIndex

            return ChromaVectorIndex.from_url(kind)
        if kind == "chroma":
            from .vector.chroma import ChromaVectorIndex

            return ChromaVectorIndex(str(self.path / "chroma"))
        if kind == "qdrant":
            from .vector.qdrant import QdrantVectorIndex

            return QdrantVectorIndex(str(self.path / "qdrant"))
        raise ConfigurationError(
            f"vector_store must be a VectorIndex, 'chroma', 'qdrant', a Chroma http(s):// URL or a "
            f"qdrant+http(s):// URL, got {kind!r}")

    def _startup_repair(self) -> None:
        name = embedder_name(self.embedder)
        previous = self.store.get_meta("embedder")
        if getattr(self.store, "shared", False):
            # Many workers share this store: a crash flag and a start-up repair would race with
            # their writes, so repair is an explicit step (rebuild_index) from one process.
            if previous is None:
                self.store.set_meta("embedder", name)
            elif previous != name:
                log.warning("embedder %s differs from the shared store's %s: call rebuild_index() "
                            "from one process to re-embed", name, previous)
            return
        unclean = self.store.get_meta("state") == "open"
        self.store.set_meta("state", "open")
        if previous is not None and previous != name:
            log.warning("embedder changed (%s -> %s): re-embedding the stored turns, facts and episodes "
                        "into a new vector index; to keep the old vectors, open the store with the old "
                        "embedder (embedder=..., or TIERED_MEMORY_EMBEDDER=minilm)", previous, name)
            self._rebuild()
        else:
            self._repair(full=unclean or self._index_lost_vectors())
        self.store.set_meta("embedder", name)

    def _index_lost_vectors(self) -> bool:
        """Cheap check on a clean open: fewer vectors than indexed turns means the index
        lost entries (a restored backup, a deleted folder); a full repair finds which."""
        c = self.store.counts()
        try:
            # only turn vectors count: fact / episode / item vectors carry a ':' in their id
            turns = sum(1 for i in self.index.ids() if ":" not in i)
            return turns < c["indexed"] - c["duplicates"]
        except Exception:  # an index that cannot count is repaired in full
            return True
