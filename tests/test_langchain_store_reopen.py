"""A LangGraph-store item whose vector write failed, after the memory is opened again."""

from __future__ import annotations

from pathlib import Path

import pytest

from langchain_tiered_memory import TieredMemoryStore
from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.chroma import ChromaVectorIndex


def test_an_item_whose_vectors_failed_is_ranked_by_the_memory_reopened(tmp_path: Path) -> None:
    # its row committed before its vectors (SQLite and Chroma); the memory's next open repaired the turns,
    # facts and episodes a failure left unindexed but not the item, which recall (include_items=True)
    # then never ranked: only rebuild_index(), a full repair or a TieredMemoryStore's first call restored it
    folder = tmp_path / "store"
    folder.mkdir()
    index = FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), fail_on=["upsert"], after=1, times=1)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as memory:
        store = TieredMemoryStore(memory, fields=["text"])
        store.put(("u1", "notes"), "bike", {"text": "Rides a red bicycle to work"})
        with pytest.raises(VectorIndexError, match="the next open"):
            store.put(("u1", "notes"), "tea", {"text": "Drinks green tea every morning"})
        assert index.failures == 1
    with TieredMemory(folder, embedder=StaticEmbedder()) as again:
        hits = again.search("green tea in the morning", user_id="u1", include_items=True, k=2)
        assert [(h.layer, h.text) for h in hits][:1] == [("item", "Drinks green tea every morning")]
        assert hits[0].explanation["similarity"] is not None
        assert len({i for i in again.index.ids("u1") if i.startswith("item:")}) == 2


def test_the_next_call_writes_what_a_failed_put_left_without_listing_the_index(tmp_path: Path) -> None:
    # the store object's next call restored them by a full repair, which lists every vector id of the
    # index (of every user and layer: slow at a big index's size); the memory recorded which items they are
    folder = tmp_path / "store"
    folder.mkdir()
    index = FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), fail_on=["upsert"], after=1, times=1)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as memory:
        store = TieredMemoryStore(memory, fields=["text"])
        store.put(("u1", "notes"), "bike", {"text": "Rides a red bicycle to work"})
        with pytest.raises(VectorIndexError):
            store.put(("u1", "notes"), "tea", {"text": "Drinks green tea every morning"})
        index.fail_on, index.failures, index.times = {"ids"}, 0, None
        hits = store.search(("u1",), query="green tea in the morning", limit=1)
        assert [(h.key, h.score is not None) for h in hits] == [("tea", True)] and index.failures == 0
