"""Which vector index a record store's records were last indexed into (pure).

The record store is the source of truth and an index is derived from it, but only the index
it writes to stays in step: one left behind when the configuration names another (Chroma ->
Qdrant -> Chroma in one folder, pgvector -> a server collection -> pgvector) misses what was
written meanwhile and still holds what was forgotten or edited, often with as many vectors as
the records expect, which the start-up check counts. So the store keeps the name of its
index (meta ``vector_index``), written when an open or ``rebuild_index()`` brings that index
in line, and an open naming another index rebuilds it, or, for a store many workers share,
says to (``backends.startup_repair``).

A name says where the vectors are without any password, API key or query value: the engine,
and the folder, server and collection. An index object passed in is named by its class and
collection; a name that differs only because the same collection was given once as an object
and once as a URL costs one needless rebuild, never a stale index.
"""

from __future__ import annotations

from pathlib import Path

from .base import VectorIndex, shown_url
from .ownership import OwnedCollection
from .server_url import server_address

#: meta key: the :func:`index_name` of the index the records were last indexed into
INDEX_META = "vector_index"


def index_name(index: VectorIndex | str, *, folder: Path, records_in_folder: bool) -> str:
    """The name of the configured ``index`` (a setting of ``configured_vector_store``, or an
    index object): ``chroma`` or ``qdrant`` in the memory folder (with the folder when the
    records live elsewhere, since each folder then holds an index of its own), the server and
    collection of a server URL, ``pgvector``, or an object's class and collection."""
    if not isinstance(index, str):
        collection = f" collection {index.collection_name()}" if isinstance(index, OwnedCollection) else ""
        return f"{type(index).__name__}{collection}"
    if index in ("chroma", "qdrant"):
        return index if records_in_folder else f"{index} in {folder}"
    if index == "pgvector":
        return index
    engine, url = ("qdrant", index[len("qdrant+"):]) if index.startswith("qdrant+") else ("chroma", index)
    where = server_address(url, engine)
    return f"{engine} server {shown_url(where.url)} collection {where.collection}"
