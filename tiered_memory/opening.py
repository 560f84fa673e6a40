"""Opening a :class:`~tiered_memory.TieredMemory`: its record store, its vector index and
the start-up repair that brings the index back in line with the store.

A mixin, so ``memory.py`` stays small (like :mod:`.facade_layers`). ``TieredMemory.__init__``
calls :meth:`OpeningMethods._open_store`, :meth:`OpeningMethods._open_index` and
:meth:`OpeningMethods._startup_repair` in that order; an embedded store folder is held by a
:class:`FolderLock` for as long as the memory is open.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import traceback
import weakref
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
    """An exclusive lock on an embedded store folder; the OS drops it if the process dies.

    A second open of the folder from another process gets :class:`StoreLockedError` at
    once. A second open from this same process (a re-run notebook cell) is refused too,
    with a message naming the object that still holds the folder and ``close()``: closing
    that object behind its back would break whoever still uses it. An earlier object that
    is no longer referenced is collected first, so ``del memory`` is enough.
    """

    _held: "dict[str, tuple[weakref.ref[FolderLock], str]]" = {}  # folder -> (lock, who opened it)

    def __init__(self, folder: Path, owner: object = None) -> None:
        self.key = str(folder.resolve())
        self.file = open(folder / ".lock", "a+")
        try:
            self._acquire()
        except OSError as e:
            holder = self._holder()
            if holder is not None:
                gc.collect()  # an unreferenced earlier memory releases its lock when collected
                holder = self._holder()
            if holder is None:
                try:
                    self._acquire()
                except OSError:
                    pass
                else:
                    self._register(owner)
                    return
            self.file.close()
            if holder is not None:
                raise StoreLockedError(
                    f"{folder} is already open in this process, by {holder}, which was not closed. "
                    "Call close() on that object first (for example memory.close()), or reuse it; "
                    "`with TieredMemory(path) as memory:` closes it for you.") from e
            raise StoreLockedError(
                f"{folder} is open in another process. The embedded store serves one process; "
                "for many workers use a PostgreSQL record store and a vector server "
                "(see 'Running at scale' in the README)."
            ) from e
        self._register(owner)

    def _acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no cross-process protection
            return
        fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _holder(self) -> str | None:
        """Who holds this folder in this process, if a live lock of ours does."""
        held = FolderLock._held.get(self.key)
        if held is None:
            return None
        lock = held[0]()
        return held[1] if lock is not None and not lock.file.closed else None

    def _register(self, owner: object) -> None:
        FolderLock._held[self.key] = (weakref.ref(self), f"{_describe(owner)} opened at {_caller()}")

    def release(self) -> None:
        held = FolderLock._held.get(self.key)
        if held is not None and held[0]() is self:
            del FolderLock._held[self.key]
        self.file.close()


def _describe(owner: object) -> str:
    if owner is None:
        return "an object"
    return f"the {type(owner).__name__} object at {id(owner):#x}"


def _caller() -> str:
    """The first frame outside this package: the line of user code that opened the folder
    (``notebook cell In[3], line 1`` inside IPython or Jupyter)."""
    package = str(Path(__file__).resolve().parent) + os.sep
    for frame in reversed(traceback.extract_stack()):
        if not str(Path(frame.filename).resolve()).startswith(package):
            cell = _notebook_cell(frame.filename)
            return f"notebook cell {cell}, line {frame.lineno}" if cell else f"{frame.filename}:{frame.lineno}"
    return "an unknown place"


def _notebook_cell(filename: str) -> str | None:
    """``In[3]`` when ``filename`` is a cell of the running IPython shell (never imports IPython)."""
    shell_module = sys.modules.get("IPython")
    try:
        shell = shell_module.get_ipython() if shell_module else None
        label = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # another IPython version: the file name is still said
        return None
    return str(label[1]) if label else None


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
        self._lock = FolderLock(self.path, owner=self)
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
            self._lock = FolderLock(self.path, owner=self)
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
            log.warning("embedder changed (%s -> %s): rebuilding the vector index", previous, name)
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
