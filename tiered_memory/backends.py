"""Choosing and opening the backends a :class:`~tiered_memory.TieredMemory` runs on, from
configuration: the record store (:func:`open_record_store`), its layer repositories
(:func:`open_layer_store`) and the vector index (:func:`open_vector_index`); the start-up
check that then brings the index back in line with the store is :mod:`.startup`.

This is the one module that knows the concrete backends; everything else speaks the
protocols of :mod:`.store.base`, :mod:`.store.repositories` and :mod:`.vector.base`. An
embedded store folder is held by a :class:`FolderLock` for as long as the memory is open.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, TypeVar

from .arguments import check_engine, shown_setting
from .errors import ConfigurationError, VectorIndexError
from .folder_lock import FolderLock
from .memory_folder import check_no_embedded_records, prepare_folder
from .store.base import RecordStore, SessionSource
from .store.repositories import LayerRepository
from .vector.base import SessionSink, VectorIndex
from .vector.ownership import SAMPLE, OwnedCollection, judge_owner, refusal, turn_ids
from .vector.identity import INDEX_META, remembered_index
from .vector.server_url import server_address

log = logging.getLogger("tiered_memory")
T = TypeVar("T")


def configured_record_store() -> str | None:
    """Configuration without code: ``TIERED_MEMORY_RECORD_STORE`` (``sqlite`` or a postgresql:// URL)."""
    return os.environ.get("TIERED_MEMORY_RECORD_STORE") or None


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))

def open_record_store(path: Path, record_store: RecordStore | str | None, owner: object = None,
                      ) -> tuple[RecordStore, FolderLock | None]:
    """The record store to use, and the folder lock that an embedded one holds."""
    if record_store is not None and not isinstance(record_store, str):
        check_engine(record_store, RecordStore, "record_store", "'sqlite' or a postgresql:// URL")
        return record_store, None
    record_store = record_store or configured_record_store()
    if is_postgres_url(record_store):
        from .store.postgres import PostgresRecordStore

        return PostgresRecordStore(str(record_store)), None
    if record_store not in (None, "sqlite"):
        raise ConfigurationError(
            f"record_store must be a RecordStore, 'sqlite' or a postgresql:// URL, got {shown_setting(record_store)}")
    prepare_folder(path)
    lock = FolderLock(path, owner)
    from .store.sqlite import SQLiteRecordStore

    try:
        return SQLiteRecordStore(path / "records.sqlite3"), lock
    except BaseException:
        lock.release()
        raise


QDRANT_SCHEMES = ("qdrant+http://", "qdrant+https://")
STORE_ID = "store_id"  # meta: the record store's id, which its server collection is marked with


def configured_vector_store(vector_store: VectorIndex | str | None) -> VectorIndex | str:
    """The vector index given, or the setting to open: ``vector_store``, else
    ``TIERED_MEMORY_VECTOR_STORE``, else ``chroma``; a setting is checked here, before anything
    is opened or written (a server URL's ``?collection=NAME`` too, by the engine's name rules).

    Raises:
        ConfigurationError: an unknown setting, or a server URL with a bad query or collection.
    """
    if vector_store is not None and not isinstance(vector_store, str):
        check_engine(vector_store, VectorIndex, "vector_store", "'chroma', 'qdrant', 'pgvector' or a server URL")
        return vector_store
    kind = vector_store or os.environ.get(VECTOR_STORE_ENV) or "chroma"
    if kind.startswith(QDRANT_SCHEMES):
        server_address(kind[len("qdrant+"):], "qdrant")
    elif kind.startswith(("http://", "https://")):
        server_address(kind, "chroma")
    elif kind not in ("chroma", "qdrant", "pgvector"):
        raise ConfigurationError(
            "vector_store must be a VectorIndex, 'chroma', 'qdrant', 'pgvector', a Chroma http(s):// URL or a "
            f"qdrant+http(s):// URL (each may end in ?collection=NAME), got {shown_setting(kind)}")
    return kind


VECTOR_STORE_ENV = "TIERED_MEMORY_VECTOR_STORE"


def unnamed_index(store: RecordStore, *, records_in_folder: bool) -> str:
    """The index an open that names none (no ``vector_store=``, no ``TIERED_MEMORY_VECTOR_STORE``)
    opens: the one the records were last indexed into (:func:`~.vector.identity.remembered_index`).

    Raises:
        ConfigurationError: no setting makes it (a server, another folder's, an object).
    """
    from .store.postgres import PostgresRecordStore

    return remembered_index(store.get_meta(INDEX_META), records_in_folder=records_in_folder,
                            postgres=isinstance(store, PostgresRecordStore))


def open_vector_index(path: Path, vector_store: VectorIndex | str | None, store: RecordStore,
                      lock: FolderLock | None, owner: object = None) -> tuple[VectorIndex, FolderLock | None]:
    """The vector index to use, and the folder lock (taken here for an embedded index beside a
    record store elsewhere, shared or the caller's own: the index folder still serves one memory)."""
    kind = configured_vector_store(vector_store)
    if not isinstance(kind, str):
        claim_collection(kind, store)  # (the caller's index: left open when refused)
        return kind, lock
    if kind in ("chroma", "qdrant") and lock is None:  # the record store is not the folder's own
        prepare_folder(path, index_only=getattr(store, "shared", False))
        lock = FolderLock(path, owner)
    if kind in ("chroma", "qdrant"):  # in the memory's folder: one store's, no mark needed
        return (open_embedded_chroma(path / "chroma") if kind == "chroma" else open_local_qdrant(path)), lock
    if lock is None and getattr(store, "shared", False):  # no folder needed: the path's own records would go unread
        check_no_embedded_records(path)
    index = open_pgvector(store) if kind == "pgvector" else open_server_index(kind)
    try:
        claim_collection(index, store)
    except BaseException:
        index.close()
        raise
    return index, lock


def open_server_index(url: str) -> VectorIndex:
    """The index of a Chroma (``http(s)://``) or Qdrant (``qdrant+http(s)://``) server URL."""
    if url.startswith(QDRANT_SCHEMES):
        from .vector.qdrant import QdrantVectorIndex

        return QdrantVectorIndex.from_url(url[len("qdrant+"):], api_key=os.environ.get("QDRANT_API_KEY"))
    from .vector.chroma import ChromaVectorIndex

    return ChromaVectorIndex.from_url(url)


def open_local_qdrant(path: Path) -> VectorIndex:
    from .vector.qdrant import QdrantVectorIndex

    return QdrantVectorIndex(str(path / "qdrant"))


def store_identity(store: RecordStore) -> str:
    """The record store's id (meta ``store_id``): ours write it once, when created (a migration,
    under PostgreSQL's migration lock, so every worker reads the same); another store gets one
    here, on first use."""
    found = store.get_meta(STORE_ID)
    if found is None:
        store.set_meta(STORE_ID, uuid.uuid4().hex)
        found = store.get_meta(STORE_ID)
    return str(found)


def claim_collection(index: VectorIndex, store: RecordStore) -> None:
    """Open ``index``'s collection as ``store``'s (:mod:`.vector.ownership`): its own as before,
    a new or unmarked one claimed, another store's refused before anything is written to it.

    Raises:
        ConfigurationError: the collection belongs to another record store.
    """
    if not isinstance(index, OwnedCollection):
        return
    me, mark = store_identity(store), index.owner()
    turns = turn_ids(index.first_ids(SAMPLE)) if mark is None else set()
    verdict = judge_owner(mark, me, turns, store.existing_ids(sorted(turns)) if turns else set())
    if verdict in ("foreign", "unmarked-foreign"):
        raise ConfigurationError(refusal(verdict, index.collection_name(), sampled=len(turns)))
    index.mark_owner(me, written=verdict == "mine")
    if verdict == "claim":
        if index.owner() not in (None, me):  # another app claimed it at the same moment
            raise ConfigurationError(refusal("foreign", index.collection_name()))
        log.info("the vector collection %r is now marked as this record store's", index.collection_name())


def attach_sessions(index: VectorIndex, store: RecordStore) -> None:
    """Give an index that keeps no sessions of its own (embedded or served Chroma) the
    record store's: each message's session."""
    if isinstance(index, SessionSink) and isinstance(store, SessionSource):
        index.use_sessions(store.message_sessions)


def open_pgvector(store: RecordStore) -> VectorIndex:
    """The pgvector index in the PostgreSQL record store's own schema, writing through the
    store's pool (so :func:`joint_writes` can put rows and vectors in one transaction)."""
    from .store.postgres import PostgresRecordStore
    from .vector.pgvector import PgVectorIndex

    if not isinstance(store, PostgresRecordStore):
        raise ConfigurationError(
            "vector_store='pgvector' keeps the vectors beside the records, so it needs a PostgreSQL record "
            "store: record_store='postgresql://...' (or TIERED_MEMORY_RECORD_STORE), got "
            f"{type(store).__name__}")
    return PgVectorIndex(store)


def joint_writes(store: RecordStore, index: VectorIndex) -> Callable[[Callable[[], T]], T] | None:
    """How to run a write of rows and vectors as one transaction, or ``None`` when the two live
    in different engines (then the rows commit first and the index follows, repaired if it lags)."""
    from .store.postgres import PostgresRecordStore
    from .vector.pgvector import PgVectorIndex

    if isinstance(index, PgVectorIndex) and isinstance(store, PostgresRecordStore) and index.db is store:
        return store.together
    return None


def is_embedded_index(vector_store: VectorIndex | str | None) -> bool:
    """Whether the configured index lives in the memory's folder (Chroma or Qdrant local mode)."""
    kind = configured_vector_store(vector_store)
    return isinstance(kind, str) and kind in ("chroma", "qdrant")


def check_index_folder(folder: Path, vector_store: VectorIndex | str | None) -> None:
    """The embedded Chroma takes its folder's path as UTF-8 (its engine is Rust), so a folder
    whose name is not (a byte Python reads as a lone surrogate, ``caf\\udce9`` from a Latin-1
    name) is refused before anything is made; SQLite and Qdrant's local mode take it (pure)."""
    if configured_vector_store(vector_store) != "chroma":
        return
    try:
        os.path.abspath(folder).encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"the embedded Chroma index cannot open a folder whose path is not UTF-8 "
            f"({os.path.abspath(folder)!r}): use another path, or pass vector_store='qdrant' "
            "(Qdrant's local mode takes it)") from None


def open_embedded_chroma(folder: Path) -> VectorIndex:
    """The Chroma index in ``folder``. The index is derived data: when it cannot be opened
    (a damaged file), it is moved aside to ``chroma.damaged-<time>`` and a new one is
    created, which the start-up repair fills from the records."""
    from .vector.chroma import ChromaVectorIndex
    from .vector.chroma_client import forget_cached_client

    try:
        return ChromaVectorIndex(str(folder))
    except VectorIndexError as e:
        if not folder.exists():
            raise
        aside = folder.with_name(f"{folder.name}.damaged-{int(time.time())}")
        folder.rename(aside)
        forget_cached_client(str(folder))
        log.warning("the vector index in %s could not be opened (%s); it was moved to %s and is rebuilt "
                    "from the records (delete that folder once you no longer need it)", folder, e, aside)
        return ChromaVectorIndex(str(folder))


def supports_layers(store: Any) -> bool:
    """Whether :func:`open_layer_store` has layer repositories for this record store: ours
    (SQLite, PostgreSQL), or a custom store that implements
    :class:`~.store.repositories.LayerRepository` itself."""
    from .store.postgres import PostgresRecordStore
    from .store.sqlite import SQLiteRecordStore

    return isinstance(store, (SQLiteRecordStore, PostgresRecordStore, LayerRepository))


def open_layer_store(store: Any) -> LayerRepository:
    """The layer repositories of ``store``, their tables created or migrated on first use; a
    record store that implements :class:`~.store.repositories.LayerRepository` is its own."""
    from .store.postgres import PostgresRecordStore
    from .store.sqlite import SQLiteRecordStore

    if isinstance(store, LayerRepository):
        return store
    if isinstance(store, SQLiteRecordStore):
        from .store.sqlite_layers import SQLiteLayerStore

        return SQLiteLayerStore(store)
    if isinstance(store, PostgresRecordStore):
        from .store.postgres_layers import PostgresLayerStore

        return PostgresLayerStore(store)
    raise ConfigurationError(
        "episodic, semantic and working memory need a SQLite or PostgreSQL record store, or one that "
        f"implements tiered_memory.store.repositories.LayerRepository; got {type(store).__name__}")
