"""Restoring facts as they were exported, with their history (:meth:`.semantic.SemanticMemory.restore`,
an import's), in memory that does not grow with their number.

The facts come in batches (:data:`FactBatch`), and go through three steps:

1. Each batch's facts are embedded and held on disk with their vectors, and every history entry
   with its place, in a scratch index (:class:`~..store.line_index.LineIndex`, deleted at the end).
2. One transaction writes the facts, in the order given, then the history in the order a user's
   read when exported, sorted on disk (:func:`history_key`): read back from the scratch index row
   by row, never all at once. Facts and history are one write, as before they streamed: an
   interrupted restore stored none of them, so the import run again writes them all.
3. After it, the vectors go into the index :data:`INDEX_BATCH` at a time (the old vectors an id still owes
   deleted first), and those facts are settled; until then their rows are pending, so a failure
   or a crash leaves them to the pending pass (:func:`~.layer_repair.index_pending_facts`).

No resolution runs: ids, times, validity and access counts are kept, and a fact exported without
a key goes in the slot its words name (:func:`~.resolution.slotted`).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any, Iterable, Iterator, Sequence

from ..embedding import Embedder, embed_batched
from ..recall import forgetting
from ..records import Fact, FactChange
from ..store.layer_codec import from_blob, to_blob
from ..store.line_index import LineIndex
from ..store.pending_deletes import OwedRows
from ..store.repositories import FactRepository
from ..vector.base import VectorIndex
from .layer_repair import write_fact_vectors
from .resolution import slotted

Entry = tuple[str, int | None, FactChange]  # (user, its place in the user's exported history if known, entry)
#: the facts to write, the entries of their history, and those of the history of facts no longer stored
FactBatch = tuple[Sequence[Fact], Sequence[Entry], Sequence[Entry]]
INDEX_BATCH = 1024  # facts whose vectors go into the index at once (a call to the index costs, each)
_FACTS, _HISTORY = 0, 1  # what the scratch index holds


def history_key(place: int | None, at: float, trail: bool) -> tuple[float, float, float]:
    """An entry's sort keys: (its place, its time, after the facts' entries if ``trail``). The
    history is written by place when every entry has one (a dump groups the history by fact;
    entries of one time, such as an edit and the invalidation it causes, and entries written out of
    time order keep theirs), else (an export from before entries said it) by time; either way the
    entries of stored facts before those of facts no longer stored, then in the order given
    (pure)."""
    return (place if place is not None else 0, at, 1 if trail else 0)


def restore_facts(rows: FactRepository, index: VectorIndex, embedder: Embedder, owed: OwedRows,
                  writing: AbstractContextManager[Any], batches: Iterable[FactBatch]) -> int:
    """Write the facts of ``batches`` and their history, and the history of facts no longer stored
    (the caller skips ids already stored), as the module's docstring says, holding ``writing`` (the
    write lock) while it writes; returns how many facts.

    Raises:
        VectorIndexError or what a custom index raises: the facts and history are stored, their
            vectors pending (written by the next open's pending pass).
    """
    scratch = LineIndex()
    try:
        facts, entries, numbered = _hold(scratch, embedder, batches)
        if not facts and not entries:
            return 0
        with writing:
            with rows.unit() as u:
                for fact, vector in _facts(scratch):
                    u.insert_fact(fact, vector)
                for value, _ in scratch.held(_HISTORY, by=0 if numbered else 1):
                    user, change = json.loads(value)
                    u.record_history(user, FactChange(**change))
            part: list[tuple[Fact, Any]] = []
            for held in _facts(scratch):
                part.append(held)
                if len(part) >= INDEX_BATCH:
                    _index(rows, index, owed, part)
                    part = []
            _index(rows, index, owed, part)
        return facts
    finally:
        scratch.close()


def _hold(scratch: LineIndex, embedder: Embedder, batches: Iterable[FactBatch]) -> tuple[int, int, bool]:
    """Step 1: every batch's facts (embedded) and history held in ``scratch``; returns how many
    facts and entries, and whether every entry has its place."""
    facts = entries = 0
    numbered = True
    for batch, history, trails in batches:
        batch = [slotted(f) for f in batch]
        for fact, vector in zip(batch, embed_batched(embedder, [f.text for f in batch])):
            scratch.hold(_FACTS, json.dumps(vars(fact)), to_blob(vector))  # its fields, as JSON
        for trail, some in ((False, history), (True, trails)):
            for user, place, change in some:
                numbered = numbered and place is not None
                scratch.hold(_HISTORY, json.dumps([user, vars(change)]),
                             keys=history_key(place, change.at, trail))
        facts, entries = facts + len(batch), entries + len(history) + len(trails)
    return facts, entries, numbered


def _facts(scratch: LineIndex) -> Iterator[tuple[Fact, Any]]:
    for value, blob in scratch.held(_FACTS):
        yield Fact(**json.loads(value)), from_blob(blob)


def _index(rows: FactRepository, index: VectorIndex, owed: OwedRows, part: list[tuple[Fact, Any]]) -> None:
    """Step 3 for one batch: the vectors of its valid facts written (what their ids owe paid
    first), and those facts settled."""
    if not part:
        return
    forgetting.pay_before_storing(owed, index, vectors=[f"fact:{f.id}" for f, _ in part])  # old first
    # an invalid fact has no vector: its row was stored settled (insert_fact)
    write_fact_vectors(rows, index, [(f, v) for f, v in part if f.valid])
