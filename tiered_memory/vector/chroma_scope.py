"""Chroma's one metadata key a vector: the user, and the layer unless a turn.

Each metadata key is a row Chroma writes, so the three keys of earlier versions (user,
layer, session) made a write about a fifth slower than one (bench/README.md). The session
comes from the record store (``ChromaVectorIndex.use_sessions``). A collection says it holds
one key in its own metadata (``SCOPED``); one of three keys is migrated on open. A user's
vectors are read back by that key, with the layer it names (:func:`user_vectors`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .base import CHUNK_SEPARATOR, LAYERS
from .exact import Held, best_among

#: the ids a query among many reads at a time when it scans them exactly
READ_PAGE = 2000

#: the collection's metadata key saying its vectors carry one metadata key (see scope_of)
SCOPED = "tiered_memory_scoped"
SCOPE_SEPARATOR = "\x1f"  # user ids never hold control characters (check_id)


def scope_of(user_id: str, layer: str) -> str:
    """The one metadata value of a vector: its user, and its layer unless a turn."""
    if layer not in LAYERS:
        raise ValueError(f"unknown vector layer {layer!r}")
    return user_id if layer == "turn" else f"{user_id}{SCOPE_SEPARATOR}{layer}"


def layer_of(scope: str) -> str:
    """The layer a :func:`scope_of` value names."""
    return scope.rpartition(SCOPE_SEPARATOR)[2] if SCOPE_SEPARATOR in scope else "turn"


def scopes_of(user_id: str, layers: Sequence[str] | None = None) -> list[str]:
    """The metadata values of the user's vectors (of ``layers``, else of every layer)."""
    return [scope_of(user_id, layer) for layer in (layers or LAYERS)]


def user_filter(user_id: str, layers: Sequence[str] | None = None) -> dict[str, Any]:
    """Chroma's ``where`` for the user's vectors (of ``layers``, else of every layer)."""
    scopes = scopes_of(user_id, layers)
    return {"user_id": scopes[0]} if len(scopes) == 1 else {"user_id": {"$in": scopes}}


def owned(got: Mapping[str, Any], scopes: Sequence[str]) -> list[int]:
    """The positions in a Chroma ``get`` result (or one query row's ``ids`` and ``metadatas``)
    of the vectors whose metadata is one of ``scopes``."""
    return [n for n, m in enumerate(got["metadatas"] or []) if m and m.get("user_id") in scopes]


def best_owned(collection: Any, ids: Sequence[str], scopes: Sequence[str], queries: np.ndarray,
               k: int) -> list[list[tuple[str, float]]]:
    """For each query, the best ``k`` (id, cosine) of the vectors named by ``ids`` whose metadata
    is one of ``scopes``, exactly: read :data:`READ_PAGE` ids at a time (ids the collection lacks
    are left out)."""
    best: list[list[tuple[str, float]]] = [[] for _ in queries]
    for start in range(0, len(ids), READ_PAGE):
        got = collection.get(ids=list(ids[start:start + READ_PAGE]), include=["embeddings", "metadatas"])
        keep = owned(got, scopes)
        page = best_among([got["ids"][n] for n in keep], [got["embeddings"][n] for n in keep] if keep else [],
                          queries, k)
        best = [sorted(b + p, key=lambda hit: -hit[1])[:k] for b, p in zip(best, page)]
    return best


def scope_collection(collection: Any) -> None:
    """Migrate a collection written with three metadata keys (``user_id``, ``layer``,
    ``session_id``) to the one :func:`scope_of` key: only vectors of another layer than
    ``turn`` change (a turn's key was its user already); then the collection says so.
    Safe to interrupt and run again."""
    meta = dict(collection.metadata or {})
    if meta.get(SCOPED):
        return
    offset = 0
    while True:
        page = collection.get(where={"layer": {"$ne": "turn"}}, include=["metadatas"], limit=5000, offset=offset)
        if not page["ids"]:
            break
        todo = [(i, m) for i, m in zip(page["ids"], page["metadatas"] or [])
                if m and SCOPE_SEPARATOR not in str(m.get("user_id", ""))]
        if todo:
            collection.update(ids=[i for i, _ in todo], metadatas=[
                {"user_id": scope_of(str(m["user_id"]), str(m.get("layer", "turn")))} for _, m in todo])
        offset += len(page["ids"])
    collection.modify(metadata={**meta, SCOPED: True})


def user_vectors(collection: Any, user_id: str, limit: int, known: Mapping[str, str] | None) -> Held | None:
    """Every vector of the user in ``collection`` with its layer and session, read in pages;
    ``None`` beyond ``limit``. ``known``: each message's session, from the record store (else
    the vector's own session key)."""
    ids: list[str] = []
    parts: list[np.ndarray] = []
    layers: list[str] = []
    sessions: list[str] = []
    page = 5000
    while True:
        res = collection.get(where=user_filter(user_id), include=["embeddings", "metadatas"],
                             limit=page, offset=len(ids))
        ids.extend(res["ids"])
        if len(res["ids"]):
            parts.append(np.asarray(res["embeddings"], dtype=np.float32))
            for vid, meta in zip(res["ids"], res["metadatas"] or []):
                meta = meta or {}
                layers.append(layer_of(str(meta.get("user_id", ""))))
                # (a vector written before the one key still holds its session)
                sessions.append(str(meta.get("session_id", "")) if known is None
                                else known.get(vid.split(CHUNK_SEPARATOR)[0], ""))
        if len(ids) > limit:
            return None
        if len(res["ids"]) < page:
            return ids, (np.concatenate(parts) if parts else np.zeros((0, 1), dtype=np.float32)), layers, sessions
