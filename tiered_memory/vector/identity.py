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
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from .base import VectorIndex

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
        where = f"the memory folder's {path.relative_to(folder).as_posix()}"
    return f"{engine} at {where}, collection {collection}"
