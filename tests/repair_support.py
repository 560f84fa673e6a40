"""The recall-repair tests' engine and memories: the real Chroma index, refusing chosen ids
(tests/test_recall_repair_skips.py, tests/test_layer_repair_skips.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.recall.indexing import repair
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex

class RefusingEngine:
    """The real Chroma index, written in step (no write-behind, as a server's is): its ``upsert``
    and ``delete`` fail a call holding the id ``refused`` (or one of a set: the whole call, as an
    engine does), and every call while ``down`` (``"upsert"``: every upsert); ``refusals`` counts
    the calls refused for ``refused``. ``writes_left``: the calls (upserts, deletes) it takes
    before it goes down for good (``down`` set), as a server that fails midway through a pass.
    ``upserted``: the ids of every vector it wrote, in order (how much a pass re-embeds);
    ``upserts``: those of each upsert call."""

    def __init__(self, inner: ChromaVectorIndex) -> None:
        self.inner, self.refusals = inner, 0
        self.refused: str | set[str] = ""
        self.down: bool | str = False
        self.refused_layer = ""  # "fact:": every fact vector refused
        self.writes_left: int | None = None
        self.upserted: list[str] = []
        self.upserts: list[list[str]] = []

    def upsert(self, items: list[VectorItem]) -> None:
        self._check([i.id for i in items], "upsert")
        self.inner.upsert(items)
        self.upserted += [i.id for i in items]
        self.upserts.append([i.id for i in items])

    def delete(self, ids: Sequence[str]) -> None:
        self._check(ids, "delete")
        self.inner.delete(ids)

    def _check(self, ids: Sequence[str], method: str) -> None:
        if self.writes_left == 0:
            self.down = True
        if self.down in (True, method):
            raise RuntimeError("the engine is down")
        refused = {self.refused} if isinstance(self.refused, str) else self.refused
        refused = refused | {i for i in ids if self.refused_layer and i.startswith(self.refused_layer)}
        if refused & set(ids):
            self.refusals += 1
            raise RuntimeError(f"the engine refuses {sorted(refused & set(ids))}")
        if self.writes_left is not None:
            self.writes_left -= 1

    def __getattr__(self, name: str) -> Any:
        if name in ("upsert_behind", "settle_behind"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def add_note(memory: TieredMemory, note_id: str, text: str) -> None:
    memory.add_many([{"id": note_id, "role": "user", "content": text}], session_id="s", user_id="u")


NOTES = {"note-1": "My bank PIN is 4921", "note-2": "I keep bees on the roof", "note-3": "My sister lives in Porto",
         "note-4": "I drink green tea at noon"}


def stored_pending(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                    ids: Sequence[str]) -> tuple[TieredMemory, RefusingEngine]:
    """A memory whose notes ``ids`` were stored while the engine was down (left pending)."""
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    index.down = True
    for note in ids:
        with pytest.raises(VectorIndexError):
            add_note(memory, note, NOTES[note])
    index.down = False
    return memory, index


def repair_now(memory: TieredMemory) -> dict[str, int]:
    return repair(store=memory.store, index=memory.index, embedder=memory.embedder,
                  threshold=memory.config.dedup_threshold, full=False)


def pending_ids(memory: TieredMemory) -> set[str]:
    return {r.id for r in memory.store.pending_index(100)}


def owed_ids(memory: TieredMemory) -> set[str]:
    return {e.item_id for e in memory.store.owed_rows.owed(100)}
