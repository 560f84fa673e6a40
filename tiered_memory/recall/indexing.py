"""Keeping the vector index in step with the record store: dedup, index, repair."""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ..embedding import Embedder, embed
from ..store.base import RecordStore
from ..types import StoredMessage
from ..vector.base import VectorIndex, VectorItem
from .chunking import CHUNK_LAYER, chunk_id, chunk_spans, message_of

log = logging.getLogger("tiered_memory")


def find_duplicates(
    vectors: np.ndarray,
    users: Sequence[str],
    nearest: Sequence[tuple[str, float] | None],
    ids: Sequence[str],
    threshold: float,
) -> dict[str, str]:
    """Map id -> id of the memory it duplicates (pure).

    ``nearest[i]`` is the closest already-indexed memory of the same user. Within
    the batch, a row duplicates an earlier non-duplicate row of the same user.
    """
    dup: dict[str, str] = {}
    sims = vectors @ vectors.T if len(vectors) else np.zeros((0, 0))
    for i, mid in enumerate(ids):
        near = nearest[i]
        if near is not None and near[1] >= threshold:
            dup[mid] = near[0]
            continue
        for j in range(i):
            if users[j] == users[i] and ids[j] not in dup and sims[i, j] >= threshold:
                dup[mid] = ids[j]
                break
    return dup


def index_messages(
    rows: list[StoredMessage], *, store: RecordStore, index: VectorIndex,
    embedder: Embedder, threshold: float,
) -> dict[str, str]:
    """Embed, skip near-duplicates, upsert, then mark rows indexed. Returns the duplicates."""
    if not rows:
        return {}
    vectors = embed(embedder, [r.content for r in rows])
    nearest: list[tuple[str, float] | None] = [None] * len(rows)
    if threshold <= 1.0:
        by_user: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_user.setdefault(r.user_id, []).append(i)
        for user, idx in by_user.items():
            found = index.query(vectors[idx], user_id=user, k=1, layers=["turn"])
            for i, res in zip(idx, found):
                nearest[i] = res[0] if res else None
    dup = find_duplicates(vectors, [r.user_id for r in rows], nearest, [r.id for r in rows], threshold)
    kept = [r for r in rows if r.id not in dup]
    index.upsert([
        VectorItem(id=r.id, vector=vectors[i], user_id=r.user_id, layer="turn",
                   session_id=r.session_id, timestamp=r.timestamp)
        for i, r in enumerate(rows) if r.id not in dup
    ] + chunk_items(kept, embedder))
    store.mark_indexed([r.id for r in rows], dup)
    return dup


def chunk_items(rows: Sequence[StoredMessage], embedder: Embedder) -> list[VectorItem]:
    """One vector per chunk of each long message (:mod:`.chunking`), embedded in one batch."""
    parts = [(r, n, r.content[s:e]) for r in rows for n, (s, e) in enumerate(chunk_spans(r.content))]
    if not parts:
        return []
    vectors = embed(embedder, [text for _, _, text in parts])
    return [VectorItem(id=chunk_id(r.id, n), vector=vectors[i], user_id=r.user_id, layer=CHUNK_LAYER,
                       session_id=r.session_id, timestamp=r.timestamp)
            for i, (r, n, _) in enumerate(parts)]


def repair(
    *, store: RecordStore, index: VectorIndex, embedder: Embedder, threshold: float,
    full: bool, batch: int = 256,
) -> dict[str, int]:
    """Index pending rows; with ``full``, also drop vectors the store no longer holds and
    re-index rows marked indexed whose vector is missing (after a crash)."""
    report = {"indexed": 0, "removed": 0, "restored": 0}
    if full:
        want = store.indexed_ids()
        every = {i for i in index.ids() if not _is_layer_id(i)}
        chunks = {i for i in every if message_of(i)[1] is not None}
        have = every - chunks
        # a chunk stays while its message is indexed; a missing message vector re-indexes
        # the message, which rewrites its chunks
        extra = sorted((have - want) | {i for i in chunks if message_of(i)[0] not in want})
        index.delete(extra)
        report["removed"] = len(extra)
        missing_ids = want - have
        if missing_ids:
            report["restored"] = len(missing_ids)
            store.reset_indexed_ids(sorted(missing_ids))
    while True:
        pending = store.pending_index(batch)
        if not pending:
            break
        index_messages(pending, store=store, index=index, embedder=embedder, threshold=threshold)
        report["indexed"] += len(pending)
    if any(report.values()):
        log.info("vector index repaired: %s", report)
    return report


def _is_layer_id(memory_id: str) -> bool:
    """Ids of episode / fact vectors carry a prefix; repair of turns leaves them alone."""
    return ":" in memory_id

