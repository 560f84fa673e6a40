"""Keeping the vector index in step with the record store: dedup, index, repair."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Sequence

import numpy as np

from ..embedding import Embedder, embed
from ..errors import VectorIndexError
from ..ids import LAYER_ID_PREFIXES
from ..guard import vector_errors_typed
from ..store.base import DuplicateSource, RecordStore, TextMatchSource
from ..store.pending_deletes import NO_USER, TURN, OwedVector
from ..types import StoredMessage
from ..vector.base import VectorIndex, VectorItem, WritesBehind
from .chunking import CHUNK_LAYER, chunk_id, chunk_spans, message_of, pooled_vector
from .forgetting import delete_owed, delete_strays
from .skipping import SkippingPass, raise_or_hand_on, summary_error

log = logging.getLogger("tiered_memory")

#: the VectorIndexError of a full repair (listing and deleting vectors) the index failed
UNREPAIRED = ("the vector index could not be brought in line with the records ({error}); the records are kept "
              "and the next open repairs it again, or rebuild_index() rebuilds it from them")
#: the VectorIndexError of a pass over rows stored pending (``{what}``: turn, fact) the index failed
LEFT_PENDING = ("{n} {what}(s) stored pending could not be indexed ({{error}}); they are kept, found by their "
                "words, and indexed by the next open or rebuild_index()")


def one_blas_thread(rows: int) -> contextlib.AbstractContextManager[Any]:
    """BLAS on one thread for a duplicate check of ``rows`` rows. OpenBLAS threads the large
    products and its idle threads then spin: in a bulk write of 100,000 messages that was 6 s
    of CPU for nothing (8.5 s on one thread, 14.8 s threaded, for the same 9 s), taken from
    the vector engine's own threads on a small machine."""
    if rows < 512:
        return contextlib.nullcontext()
    return _blas_pools().limit(limits=1, user_api="blas")  # type: ignore[no-any-return]


@functools.cache
def _blas_pools() -> Any:
    """The process's BLAS thread pools (threadpoolctl), found once."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def positions_by_user(users: Sequence[str]) -> dict[str, list[int]]:
    """Each user's positions in ``users``, in order (pure)."""
    out: dict[str, list[int]] = {}
    for i, user in enumerate(users):
        out.setdefault(user, []).append(i)
    return out


def find_duplicates(
    vectors: np.ndarray,
    users: Sequence[str],
    nearest: Sequence[tuple[str, float] | None],
    ids: Sequence[str],
    threshold: float,
) -> dict[str, str]:
    """Map id -> id of the memory it duplicates (pure).

    ``nearest[i]`` is the closest already-indexed memory of the same user (a memory with
    the same text counts as similarity 1). Within the batch, a row duplicates the first
    earlier non-duplicate row of the same user at ``threshold`` or above. The batch is
    compared in blocks of rows, so a batch of thousands costs matrix products, not a
    Python loop per pair.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    with one_blas_thread(len(vectors)):
        return _duplicates(vectors, users, nearest, ids, threshold)


def _duplicates(vectors: np.ndarray, users: Sequence[str], nearest: Sequence[tuple[str, float] | None],
                ids: Sequence[str], threshold: float) -> dict[str, str]:
    dup: dict[str, str] = {}
    known = {i: near[0] for i, near in enumerate(nearest)  # row -> the stored memory it duplicates
             if near is not None and near[0] != ids[i] and near[1] >= threshold}
    for idx in positions_by_user(users).values():
        own = vectors[idx] if len(vectors) else np.zeros((len(idx), 1), dtype=np.float32)
        for start in range(0, len(idx), 512):
            stop = min(start + 512, len(idx))
            close = (own[start:stop] @ own[:stop].T) >= threshold  # block rows against every earlier row
            close &= np.arange(stop)[None, :] < np.arange(start, stop)[:, None]  # earlier rows only
            # only a row close to an earlier one, or to a stored memory, can be a duplicate
            # (in order: whether an earlier row is one decides what a later one duplicates)
            for a in sorted(set(np.flatnonzero(close.any(axis=1)).tolist())
                            | {a for a in range(stop - start) if idx[start + a] in known}):
                i = idx[start + a]
                if i in known:
                    dup[ids[i]] = known[i]
                    continue
                for b in np.flatnonzero(close[a, :start + a]):
                    if ids[idx[b]] not in dup:
                        dup[ids[i]] = ids[idx[b]]
                        break
    return dup


def nearest_stored(rows: Sequence[StoredMessage], vectors: np.ndarray, *, store: RecordStore,
                   index: VectorIndex) -> list[tuple[str, float] | None]:
    """For each row, the closest already-indexed memory of its user: a message with the same
    text when the store can find it (no vector query), else the index's nearest turn."""
    nearest: list[tuple[str, float] | None] = [None] * len(rows)
    for user, idx in positions_by_user([r.user_id for r in rows]).items():
        if isinstance(store, TextMatchSource):
            same = store.same_text(user, [rows[i].content for i in idx])
            for i in idx:
                if rows[i].content in same:
                    nearest[i] = (same[rows[i].content], 1.0)
            continue
        found = index.query(vectors[idx], user_id=user, k=1, layers=["turn"])
        for i, res in zip(idx, found):
            nearest[i] = res[0] if res else None
    return nearest


def index_messages(
    rows: list[StoredMessage], *, store: RecordStore, index: VectorIndex,
    embedder: Embedder, threshold: float, behind: bool = True,
) -> dict[str, str]:
    """Embed, skip near-duplicates, upsert, then mark rows indexed. Returns the duplicates.

    A row is a duplicate of an earlier memory of its user with the same text (a store
    offering :class:`~tiered_memory.store.base.TextMatchSource` finds it in one indexed
    lookup; other stores ask the vector index for the nearest turn, at ``threshold``),
    or of an earlier row of the same batch at ``threshold`` cosine or above. With a
    ``threshold`` above 1 nothing is a duplicate. ``behind=False``: written in step even by an
    index that writes behind, so a failure is raised here (the repair skips what fails)."""
    if not rows:
        return {}
    items, dup = turn_items(rows, store=store, index=index, embedder=embedder, threshold=threshold)
    if behind and isinstance(index, WritesBehind):
        # marked indexed before the engine has them: a crash leaves the memory unclean, and
        # the next open's full repair re-embeds what the engine lacks (vector/write_behind.py)
        index.upsert_behind(items)
    else:
        index.upsert(items)
    store.mark_indexed([r.id for r in rows], dup)
    return dup


def index_orphans(store: RecordStore, index: VectorIndex, embedder: Embedder, user_id: str, threshold: float) -> int:
    """Index again the user's messages stored as duplicates of a message since forgotten,
    cleared or archived: a duplicate has no vector of its own, so it was found by its
    original's and, that one gone, by its words only. The oldest of the same text becomes
    the original (the rest its duplicates again). Call after deleting messages; returns how
    many were released. Should indexing fail, they stay pending and are indexed on the next
    open or by ``rebuild_index()``."""
    if not isinstance(store, DuplicateSource):
        return 0
    rows = store.release_duplicates(user_id)
    with vector_errors_typed(f"{len(rows)} messages that duplicated a deleted one could not be indexed again "
                             "({error}); they are indexed on the next open or by rebuild_index()"):
        index_messages(rows, store=store, index=index, embedder=embedder, threshold=threshold)
    return len(rows)


def store_and_index(
    rows: list[StoredMessage], *, store: RecordStore, index: VectorIndex,
    embedder: Embedder, threshold: float, sync: bool = True,
) -> Exception | None:
    """Store ``rows`` and index them (:func:`index_messages`). A failure of the store is
    raised; a failure to index is returned, and the rows are then stored pending, to be
    indexed on the next open or by ``rebuild_index()``. ``sync``: see
    :meth:`~tiered_memory.store.base.RecordStore.insert_messages`.

    An index that writes behind gets the rows stored already marked, in the one
    transaction of their insert: the vectors are embedded first and queued after the
    commit (a bulk write of 100,000 messages made 200 commits and 100,000 updates of
    marks otherwise, about a fifth of the library's part of it)."""
    if not rows:
        return None
    if not isinstance(index, WritesBehind):
        store.insert_messages(rows, sync=sync)
        try:
            index_messages(rows, store=store, index=index, embedder=embedder, threshold=threshold)
        except Exception as e:
            return e
        return None
    try:
        items, dup = turn_items(rows, store=store, index=index, embedder=embedder, threshold=threshold)
    except Exception as e:
        store.insert_messages(rows, sync=sync)
        return e
    store.insert_messages(rows, indexed=True, duplicates=dup, sync=sync)
    try:
        index.upsert_behind(items)
    except Exception as e:
        store.reset_indexed_ids([r.id for r in rows])  # back to pending, for the repair
        return e
    return None


def write_chunks(rows: Sequence[StoredMessage], size: int,
                 write: Callable[[list[StoredMessage], int, bool], None], *,
                 store: RecordStore, progress: Callable[[int], None] | None = None) -> None:
    """``write(part, start, last)`` for each chunk of ``size`` rows (``start``: its first row's
    position in ``rows``), in order, then ``progress(len(part))``.

    Only the last chunk is to wait for the disk (``last``); its synced commit makes the
    chunks before it durable. When an error stops the loop after a chunk was written, the
    store is synced before the error goes on: the chunks it reports as stored are on disk.
    """
    done = 0
    try:
        for start in range(0, len(rows), size):
            part = list(rows[start:start + size])
            write(part, start, start + size >= len(rows))
            done += len(part)
            if progress is not None:
                progress(len(part))
    finally:
        if 0 < done < len(rows):
            with contextlib.suppress(Exception):  # the error on its way out is the one to report
                store.sync()


def turn_items(rows: list[StoredMessage], *, store: RecordStore, index: VectorIndex,
               embedder: Embedder, threshold: float) -> tuple[list[VectorItem], dict[str, str]]:
    """The vectors to write for ``rows`` (each kept turn and each chunk of a long one) and
    the duplicates (see :func:`index_messages`). Reports a failed background write first."""
    settle_background_writes(store, index, wait=False)
    vectors, chunks = embed_messages(rows, embedder)
    dup: dict[str, str] = {}
    if threshold <= 1.0:
        nearest = nearest_stored(rows, vectors, store=store, index=index)
        dup = find_duplicates(vectors, [r.user_id for r in rows], nearest, [r.id for r in rows], threshold)
    kept = [i for i, r in enumerate(rows) if r.id not in dup]
    # the chunks first: the engine writes in this order (in calls of a few thousand), so a write
    # cut between two calls never leaves a message's vector without its chunks, which the
    # repair would not restore (it finds a message by its own vector)
    return [
        VectorItem(id=chunk_id(rows[i].id, n), vector=v, user_id=rows[i].user_id, layer=CHUNK_LAYER,
                   session_id=rows[i].session_id, timestamp=rows[i].timestamp)
        for i in kept for n, v in enumerate(chunks[i])
    ] + [
        VectorItem(id=rows[i].id, vector=vectors[i], user_id=rows[i].user_id, layer="turn",
                   session_id=rows[i].session_id, timestamp=rows[i].timestamp)
        for i in kept
    ], dup


def embed_messages(rows: Sequence[StoredMessage], embedder: Embedder) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each message's vector and its chunks' vectors (none for a short one), in one batch.

    A short message is embedded whole; a long one (:mod:`.chunking`) only by its chunks, its
    own vector pooled from theirs (:func:`~.chunking.pooled_vector`): each character goes
    through the embedder once (embedding the whole text as well made ``add`` of a
    90,000-character message about twice as slow with MiniLM: ``bench/long_messages.py``)."""
    spans = [chunk_spans(r.content) for r in rows]
    texts = [t for r, own in zip(rows, spans)
             for t in ([r.content[s:e] for s, e in own] if own else [r.content])]
    embedded = embed(embedder, texts)
    vectors = np.empty((len(rows), embedded.shape[1]), dtype=np.float32)
    chunks: list[np.ndarray] = []
    at = 0
    for i, own in enumerate(spans):
        if own:
            chunks.append(embedded[at:at + len(own)])
            vectors[i] = pooled_vector(chunks[-1], own)
        else:
            chunks.append(embedded[at:at])
            vectors[i] = embedded[at]
        at += max(1, len(own))
    return vectors, chunks


def settle_background_writes(store: RecordStore, index: VectorIndex, *, wait: bool) -> None:
    """Put the rows whose vectors a background write lost back to pending, and say so.

    Raises:
        VectorIndexError: a background write failed; its rows are stored and are indexed on
            the next open or by ``rebuild_index()``.
    """
    if not isinstance(index, WritesBehind):
        return
    lost, error = index.settle_behind(wait=wait)
    if not lost:
        return
    messages = sorted({message_of(i)[0] for i in lost})
    store.reset_indexed_ids(messages)
    raise VectorIndexError(f"the vectors of {len(messages)} stored messages could not be written in the "
                           f"background ({error}); the messages stay stored and are indexed on the next open "
                           "or by rebuild_index()")


def repair(
    *, store: RecordStore, index: VectorIndex, embedder: Embedder, threshold: float,
    full: bool, batch: int = 256, skipped: list[VectorIndexError] | None = None,
) -> dict[str, int]:
    """Index pending rows (:func:`index_pending_turns`); with ``full``, first drop vectors the
    store no longer holds and re-index rows marked indexed whose vector is missing (after a crash).
    A vector the index refuses to drop is owed (:func:`~.forgetting.delete_strays`: the next
    payment drops it; ``report["stray_owed"]`` counts them) and holds back no other pass.
    ``skipped``: the error of what the index refused (the rest done) goes there, not raised,
    for a caller with more passes to run first.

    Raises:
        VectorIndexError: the index failed; what is not indexed stays pending, what is not
            dropped owed.
    """
    report = {"indexed": 0, "removed": 0, "restored": 0}
    left: list[VectorIndexError | None] = []  # what the index refused: raised (or handed on) once every pass ran
    if full:
        want = store.indexed_ids()
        with vector_errors_typed(UNREPAIRED):
            every = {i for i in index.ids() if not _is_layer_id(i)}
        chunks = {i for i in every if message_of(i)[1] is not None}
        have = every - chunks
        # a chunk stays while its message is indexed; a missing message vector re-indexes
        # the message, which rewrites its chunks
        extra = sorted((have - want) | {i for i in chunks if message_of(i)[0] not in want})
        # one the index refuses is owed (its message's id: stored again, it is paid first), not in the way
        report["removed"], refused = delete_strays(store.owed_rows, index, extra,
                                                   lambda i: OwedVector(NO_USER, TURN, message_of(i)[0]))
        if refused is not None:
            report["stray_owed"] = len(extra) - report["removed"]
            left.append(refused)
        missing_ids = want - have
        if missing_ids:
            report["restored"] = len(missing_ids)
            store.reset_indexed_ids(sorted(missing_ids))
        if isinstance(store, DuplicateSource):  # a crash after deleting or archiving an original, before
            report["released"] = len(store.release_duplicates(None))  # its duplicates were indexed again
    left.append(index_pending_turns(store=store, index=index, embedder=embedder, threshold=threshold, batch=batch,
                                    report=report))
    if any(report.values()):
        log.info("vector index repaired: %s", report)
    raise_or_hand_on(left, skipped)
    return report


def index_pending_turns(*, store: RecordStore, index: VectorIndex, embedder: Embedder, threshold: float,
                        batch: int, report: dict[str, int]) -> VectorIndexError | None:
    """Index the pending rows in batches, each row's id paid first of what its earlier rows owe the
    index (:func:`~.forgetting.pay_before_storing`: else a payment after this, another worker's in
    flight meanwhile, deletes the new vectors). A row whose payment or vector the index refuses
    is skipped (:class:`~.skipping.SkippingPass`), kept pending for the next pass, and the others
    are indexed: one bad row does not hold back the rows after it. Adds to ``report["indexed"]``;
    returns the error of the rows skipped, if any (they stay pending).

    Raises:
        VectorIndexError: the engine is down (:data:`~.skipping.DOWN_AFTER`); what is not indexed
            stays pending.
    """
    with contextlib.suppress(VectorIndexError):  # what a background write lost goes back to pending, for this pass
        settle_background_writes(store, index, wait=True)
    paying = SkippingPass[str](what="turn (its id's earlier vectors still owed)", name=repr)
    turns = SkippingPass[StoredMessage](what="turn", name=lambda r: repr(r.id))

    def indexed(rows: Sequence[StoredMessage]) -> None:
        with vector_errors_typed(LEFT_PENDING.format(n=len(rows), what="turn")):
            index_messages(list(rows), store=store, index=index, embedder=embedder, threshold=threshold,
                           behind=False)  # in step: a failure is this call's, and its rows can be told apart
        report["indexed"] += len(rows)

    def paid(entries: list[OwedVector]) -> None:
        delete_owed(store.owed_rows, index, entries, what="rows stored again under ids whose earlier rows were")

    while True:
        left = {*paying.skipped, *(r.id for r in turns.skipped)}  # this pass's skips: read past, not again
        pending = [r for r in store.pending_index(batch + len(left)) if r.id not in left][:batch]
        if not pending:
            break
        owed: dict[str, list[OwedVector]] = {}
        for entry in store.owed_rows.owed_for(turns=[r.id for r in pending]):
            owed.setdefault(entry.item_id, []).append(entry)
        paying.write(sorted(owed), lambda ids: paid([e for i in ids for e in owed[i]]))
        owing = set(paying.skipped)
        turns.write([r for r in pending if r.id not in owing], indexed)
    if (first := paying.error or turns.error) is None:
        return None
    return summary_error(LEFT_PENDING.format(n=len(paying.skipped) + len(turns.skipped), what="turn"), first)


def _is_layer_id(memory_id: str) -> bool:
    """Ids of episode, fact and item vectors carry a prefix no message id may start with; repair
    of turns leaves them alone (a message id may hold ``:`` anywhere else: ``slack:C1:123``)."""
    return memory_id.startswith(LAYER_ID_PREFIXES)

