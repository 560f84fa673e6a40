"""The start-up check: at open, bring the vector index in line with the record store, its
source of truth (:func:`startup_repair`): a full repair after an unclean close or a lost
index, a rebuild after an embedder change or a move to another index
(:mod:`.vector.identity`), and a compaction once deleted vectors outnumber live ones.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from .embedding import Embedder, embedder_name, reopen_with
from .errors import CorruptStoreError, VectorIndexError
from .store.base import RecordStore
from .vector.base import CHUNK_SEPARATOR, VectorIndex
from .vector.identity import INDEX_META

log = logging.getLogger("tiered_memory")


def startup_repair(store: RecordStore, index: VectorIndex, embedder: Embedder, *,
                   repair: Callable[[bool], object], rebuild: Callable[[], object],
                   index_in_folder: bool = False, name: str | None = None) -> None:
    """Bring the index in line with the store at open: a full repair after an unclean
    close or a lost index, a rebuild after an embedder change or when ``name`` (the index's
    :func:`~.vector.identity.index_name`) is not the one the records were last indexed into
    (``repair(full)`` and ``rebuild()`` are the memory's, which hold its write lock; a
    rebuild records ``name``). ``index_in_folder``: the index is embedded in the memory's
    locked folder, so this process alone writes it.

    Raises:
        CorruptStoreError: the record store is new or empty while the embedded index
            holds vectors (the records were lost or replaced).
    """
    repair = _kept_open(repair)  # a failed rebuild still fails the open: the embedder's name is not recorded
    embedder_id = embedder_name(embedder)
    previous = store.get_meta("embedder")
    if index_in_folder and previous is None and store.counts()["messages"] == 0:
        vectors = index.count()
        if vectors:
            raise CorruptStoreError(
                f"the record store is empty or new, but the vector index beside it holds {vectors} vectors: "
                "the records were lost or replaced (records.sqlite3 is the source of truth; the index "
                "cannot restore them). Restore records.sqlite3 from a backup, or import an export "
                "(tiered-memory import FILE) into a new folder; to start empty here, delete the chroma/ "
                "(or qdrant/) folder.")
    was = store.get_meta(INDEX_META)
    due = store.get_meta(REPAIR_DUE) == "full"  # a full repair cut short: compared in full again
    moved = name is not None and was is not None and was != name  # the records' index is elsewhere
    if getattr(store, "shared", False):
        # Many workers share this store: a crash flag and a full start-up repair would race with
        # their writes, so that is an explicit step (rebuild_index) from one process.
        if previous is None:
            store.set_meta("embedder", embedder_id)
        elif previous != embedder_id and not index_in_folder:
            log.warning("embedder %s differs from the shared store's %s: call rebuild_index() "
                        "from one process to re-embed", embedder_id, previous)
        if moved and not index_in_folder:
            log.warning("the vector index (%s) is not the one this shared store's records were indexed into "
                        "(%s): it lacks what was written there and holds what was forgotten meanwhile; call "
                        "rebuild_index() from one process to index the records into it", name, was)
        elif was is None and name is not None and not index_in_folder:
            store.set_meta(INDEX_META, name)
        if index_in_folder:  # ... unless this process owns the index: then it repairs it
            if previous is not None and previous != embedder_id:
                log.warning("embedder changed (%s -> %s): rebuilding this process's vector index",
                            previous, embedder_id)
                rebuild()
            elif moved:
                _rebuild_moved(rebuild, was, name)
            else:
                repair(due or index_lost_vectors(store, index))
                _note_index(store, was, name)
        elif previous is None or previous == embedder_id:
            # the turns a failed vector write left pending (a partial index finds them): two workers
            # indexing the same turn write the same vector under the same id
            repair(False)
        return
    unclean = store.get_meta("state") == "open"
    store.set_meta("state", "open")
    if index_in_folder:  # with the store marked open: a compaction cut short is repaired in full next time
        compact_if_worth_it(store, index)
    if previous is not None and previous != embedder_id:
        log.warning("embedder changed (%s -> %s): re-embedding the stored turns, facts, episodes and "
                    "working-memory items (into a new vector index); to keep the old vectors, open the "
                    "store with the old embedder (%s)", previous, embedder_id, reopen_with(previous))
        rebuild()
    elif moved:
        _rebuild_moved(rebuild, was, name)
    else:
        repair(unclean or due or index_lost_vectors(store, index))
        _note_index(store, was, name)
    if previous != embedder_id:  # (the same name again would cost a commit, a wait for the disk, every open)
        store.set_meta("embedder", embedder_id)


def _rebuild_moved(rebuild: Callable[[], object], was: str | None, name: str | None) -> None:
    """Rebuild an index that is not the one the records were last indexed into: one left behind
    by an earlier configuration misses what was written meanwhile and holds what was forgotten
    or edited, with as many vectors as index_lost_vectors expects (a new one is filled alike)."""
    log.warning("the vector index changed (%s -> %s): rebuilding it from the records (an index "
                "left behind holds none of what was written or forgotten meanwhile)", was, name)
    rebuild()


def _note_index(store: RecordStore, was: str | None, name: str | None) -> None:
    """Record ``name`` as the index the records are now in line with (``was`` recorded before)."""
    if name is not None and was != name:
        store.set_meta(INDEX_META, name)


def _kept_open(step: Callable[..., object]) -> Callable[..., object]:
    """``step``, the start-up repair, whose vector-engine failure leaves the memory openable:
    the records stay (found by keyword search), what is unindexed stays pending, and the next
    open or ``rebuild_index()`` writes the vectors (an engine that refuses them, such as a
    collection of another dimension, would otherwise lock the memory out of that fix). Not the
    rebuild after an embedder change: opened after a failed one, the memory would record the
    new embedder over vectors of the old."""
    def run(*args: Any) -> object:
        try:
            return step(*args)
        except VectorIndexError as e:
            log.warning("the vector index could not be repaired at open (%s); the records are kept and "
                        "searched by keyword, and their vectors are written on the next open or by "
                        "rebuild_index()", e)
            return None
    return run


#: meta: ``"full"`` from the start of a full repair until it has compared the turns', layers' and
#: store items' vectors with their rows (what it could not write is then pending or owed): one cut
#: short (an engine failing) is run in full again by the next open, else a clean open never looks
#: for the vectors it had not compared yet
REPAIR_DUE = "repair_due"

FORGOTTEN_VECTORS = "forgotten_vectors"  # meta: vectors deleted since the index was last compacted


def compact_if_worth_it(store: RecordStore, index: VectorIndex, *, minimum: int = 5_000) -> None:
    """Reclaim the space of deleted vectors once there are more of them than live ones
    (and at least ``minimum``): an index that can compact copies the live vectors anew."""
    compact = getattr(index, "compact", None)
    forgotten = int(store.get_meta(FORGOTTEN_VECTORS) or 0)
    if compact is None or forgotten < minimum or forgotten < index.count():
        return
    kept = compact()
    store.set_meta(FORGOTTEN_VECTORS, "0")
    log.info("vector index compacted: %s live vectors kept, the space of %s deleted ones reclaimed", kept, forgotten)


def note_forgotten(store: RecordStore, n: int) -> None:
    """Count vectors deleted from the index (for :func:`compact_if_worth_it`)."""
    if n:
        store.set_meta(FORGOTTEN_VECTORS, str(int(store.get_meta(FORGOTTEN_VECTORS) or 0) + n))


#: Above this many vectors a clean open compares counts only: listing an embedded Chroma's
#: ids pages by offset, which costs time quadratic in the vectors (1,000,000: an 8-minute open)
LIST_IDS_MAX = 100_000


def index_lost_vectors(store: RecordStore, index: VectorIndex, *, list_ids_max: int = LIST_IDS_MAX) -> bool:
    """Cheap check on a clean open: fewer vectors than indexed turns means the index
    lost entries (a restored backup, a deleted folder); a full repair finds which.

    Fewer vectors of any kind than indexed turns is a loss; an index of at most
    ``list_ids_max`` vectors has its turn vectors counted exactly (facts, episodes and
    chunks of long messages also hold vectors). A larger one that lost only some turn
    vectors while holding as many others is repaired by ``rebuild_index()``."""
    c = store.counts()
    expected = c["indexed"] - c["duplicates"]
    try:
        total = index.count()
        if total < expected or total > list_ids_max:
            return total < expected
        # only turn vectors count: fact / episode / item vectors carry a ':' in their id, the
        # chunks of long messages a chunk separator
        turns = sum(1 for i in index.ids() if ":" not in i and CHUNK_SEPARATOR not in i)
        return turns < expected
    except Exception:  # an index that cannot count is repaired in full
        return True
