"""Which vector index a record store's records were last indexed into (pure).

The record store is the source of truth and an index is derived from it, but only the index
it writes to stays in step: one left behind when the configuration names another (Chroma ->
Qdrant -> Chroma in one folder, pgvector -> a server collection -> pgvector) misses what was
written meanwhile and still holds what was forgotten or edited, often with as many vectors as
the records expect, which the start-up check counts. So the store keeps the name of its
index (meta ``vector_index``), written when an open or ``rebuild_index()`` brings that index
in line, and an open on another index rebuilds it, or, for a store many workers share, says
to (``startup.startup_repair``).

An index says where its vectors are (:class:`LocatedIndex`): the engine, its folder or
server (no password, API key or query value) and the collection, so the same collection
has the same name whether it was given as a setting or as an object, and a wrapper that
forwards to an index (``testing.FailingVectorIndex``) is that index. A folder inside the
memory folder is named relative to it, so a moved memory folder is the same store.

An open that names no index (no ``vector_store=``, no ``TIERED_MEMORY_VECTOR_STORE``) opens the
one the records were last indexed into (:func:`remembered_index`) when a setting can make it
(the folder's Chroma or Qdrant, pgvector), rather than build a second, Chroma, index beside
it; one it cannot make (a server, another folder's, an object) is a ``ConfigurationError``
that names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from ..errors import ConfigurationError
from .base import VectorIndex

IN_FOLDER = "the memory folder's "  # how index_name writes a folder inside the memory folder

#: meta key: the :func:`index_name` of the index the records were last indexed into
INDEX_META = "vector_index"


@runtime_checkable
class LocatedIndex(Protocol):
    """An index that says where its vectors are (optional; Chroma, Qdrant, pgvector)."""

    def location(self) -> tuple[str, str, str]:
        """The engine, where it is (a folder's absolute path, or a server, with no password
        or key) and the collection."""
        ...


def index_name(index: VectorIndex, *, folder: Path, records_in_folder: bool) -> str:
    """The name the record store keeps of ``index``: its :meth:`~LocatedIndex.location`, a
    folder inside the memory ``folder`` relative to it when the records live there too (an
    index of another class: the class's name)."""
    if not isinstance(index, LocatedIndex):
        return f"a {type(index).__name__}"
    engine, where, collection = index.location()
    path = Path(where)
    if records_in_folder and path.is_absolute() and path.is_relative_to(folder):
        where = f"{IN_FOLDER}{path.relative_to(folder).as_posix()}"
    return f"{engine} at {where}, collection {collection}"


def remembered_index(recorded: str | None, *, records_in_folder: bool, postgres: bool) -> str:
    """The ``vector_store`` setting that opens ``recorded`` (the store's :data:`INDEX_META`),
    for an open that names no index: ``"chroma"`` when nothing is recorded; the embedded
    engine of the memory's folder (with the records elsewhere: of any folder, each worker's
    own); ``"pgvector"`` in a PostgreSQL store (pure).

    Raises:
        ConfigurationError: no setting makes it (a server, which its URL and key name; an
            index elsewhere, given as an object): the message names it and how to open it.
    """
    if recorded is None:
        return "chroma"
    engine, at, rest = recorded.partition(" at ")
    where = rest.rpartition(", collection ")[0] if at else ""
    if engine in ("chroma", "qdrant"):
        if records_in_folder and where == f"{IN_FOLDER}{engine}":
            return engine
        if not records_in_folder and Path(where).is_absolute() and Path(where).name == engine:
            return engine
    if engine == "pgvector" and postgres:
        return "pgvector"
    if engine == "qdrant" and "://" in where:
        how = f"the qdrant+http(s):// URL of that server ending in ?collection=NAME (its key in $QDRANT_API_KEY)"
    elif engine == "chroma" and at and not Path(where).is_absolute():
        how = "the http(s):// URL of that Chroma server ending in ?collection=NAME"
    else:
        how = "vector_store=<that index>, the object it was opened with"
    raise ConfigurationError(
        f"this memory's records were last indexed into {recorded}, and the open names no vector index: pass "
        f"vector_store= ({how}; or set TIERED_MEMORY_VECTOR_STORE), or vector_store='chroma' to index them into "
        "the memory folder's own Chroma instead (rebuilt from the records)")
