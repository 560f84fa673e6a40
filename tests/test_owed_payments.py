"""Paying what the vector index owes, against the writes around it (SQLite beside Chroma).

An id deleted while the index failed and stored again: ``add_many`` and ``import_jsonl`` both
store it pending and say so (one behaviour) (``tiered_memory.recall.forgetting``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.chroma import ChromaVectorIndex


def _chroma(tmp_path: Path) -> ChromaVectorIndex:
    return ChromaVectorIndex(str(tmp_path / "index"))


def _note(memory: TieredMemory, note_id: str, text: str, user_id: str = "u") -> None:
    memory.add_many([{"id": note_id, "role": "user", "content": text}], session_id="s", user_id=user_id)


def _owed(memory: TieredMemory) -> set[str]:
    return {e.item_id for e in memory.store.owed_rows.owed(100)}


def test_add_many_and_import_both_store_an_owed_id_pending_and_say_so(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Paying an id's old vectors fails (the index still down) as the id is stored again: ``add_many``
    stored it pending with a logged warning only, ``import_jsonl`` stopped without storing it. Both
    store it now, pending, and raise VectorIndexError saying so; the next write indexes it."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    _note(memory, "note-1", "My bank PIN is 4921")
    _note(memory, "note-2", "My locker code is 7755", user_id="v")
    dump = tmp_path / "v.jsonl"
    memory.export_jsonl(dump, user_id="v")
    index.fail_on = {"delete"}  # the server goes down
    for note, user in (("note-1", "u"), ("note-2", "v")):
        with pytest.raises(VectorIndexError):
            memory.forget(note, user_id=user)
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):
        _note(memory, "note-1", "I moved to Porto")
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):
        memory.import_jsonl(dump)
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["I moved to Porto"]
    assert [m.content for m in memory.get_messages("s", user_id="v")] == ["My locker code is 7755"]
    assert {"note-1", "note-2"} <= index.inner.ids()  # the old vectors, still owed
    index.healthy()
    memory.add("user", "Another note", session_id="s", user_id="u")  # pays, then indexes what is pending
    assert _owed(memory) == set() and memory.store.pending_index(10) == []
    assert "note-1" in index.inner.ids("u") and "note-2" in index.inner.ids("v")
    assert memory.import_jsonl(dump).skipped_existing == 1  # stored once

