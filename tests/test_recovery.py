"""Recovery: a forget that always completes, a damaged index that never blocks the memory,
and a store that lost its records is not taken for a new one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered_memory import CorruptStoreError, TieredMemory, VectorIndexError
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.chroma import ChromaVectorIndex


def _fill(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": f"Note {n}: I collect vintage maps of {city}."}
                     for n, city in enumerate(["Lisbon", "Porto", "Braga"])], session_id="s", user_id="gone")
    memory.add("user", "I keep the other user's data", session_id="s", user_id="stays")


def test_a_forget_that_fails_half_way_is_finished_on_the_next_open(tmp_path: Path, embedder: Any) -> None:
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        _fill(memory)
    broken = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "chroma")), fail_on=["delete_user"], times=None)
    memory = TieredMemory(tmp_path, embedder=embedder, vector_store=broken)
    with pytest.raises(VectorIndexError, match="finished on the next open"):
        memory.forget_user("gone")
    assert memory.get_messages("s", user_id="gone") == []  # the rows went first
    assert broken.inner.ids("gone")  # ... the vectors are still there
    memory.close()
    with TieredMemory(tmp_path, embedder=embedder) as memory:  # the next open finishes the job
        assert memory.index.ids("gone") == set()
        assert memory.search("vintage maps", user_id="gone") == []
        assert [h.text for h in memory.search("other user's data", user_id="stays")]


def test_a_write_for_a_user_with_an_unfinished_forget_finishes_it_first(tmp_path: Path, embedder: Any) -> None:
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        _fill(memory)
    index = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "chroma")), fail_on=["delete_user"], times=1)
    with TieredMemory(tmp_path, embedder=embedder, vector_store=index) as memory:
        with pytest.raises(VectorIndexError):
            memory.forget_user("gone")
        memory.add("user", "A fresh start: I collect stamps now.", session_id="new", user_id="gone")
        texts = {h.text for h in memory.search("I collect", user_id="gone", k=10)}
        assert texts == {"A fresh start: I collect stamps now."}  # none of the forgotten maps came back
    with TieredMemory(tmp_path, embedder=embedder) as memory:  # and the new turn survives the next open
        assert [m.content for m in memory.get_messages("new", user_id="gone")] == [
            "A fresh start: I collect stamps now."]


def test_a_damaged_vector_index_is_moved_aside_and_rebuilt(tmp_path: Path, embedder: Any) -> None:
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        _fill(memory)
        memory.add_fact("User collects maps", user_id="gone")
    (tmp_path / "chroma" / "chroma.sqlite3").write_bytes(b"this is not a database" * 100)
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        assert "Porto" in memory.search("maps of Porto", user_id="gone", k=1)[0].text
        assert memory.search_facts("maps", user_id="gone")[0].fact.text == "User collects maps"
    assert [p.name.split("-")[0] for p in tmp_path.iterdir() if p.name.startswith("chroma.damaged")] == [
        "chroma.damaged"]


def test_records_replaced_by_an_empty_file_are_not_a_new_store(tmp_path: Path, embedder: Any) -> None:
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        _fill(memory)
    for name in ("records.sqlite3-wal", "records.sqlite3-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / "records.sqlite3").write_bytes(b"")
    with pytest.raises(CorruptStoreError, match="records were lost or replaced"):
        TieredMemory(tmp_path, embedder=embedder)
    with pytest.raises(CorruptStoreError):  # and it stays refused: nothing was taken for new data
        TieredMemory(tmp_path, embedder=embedder)


def test_switching_embedders_re_embeds_and_no_stored_vector_breaks_a_read(tmp_path: Path, embedder: Any) -> None:
    from tiered_memory import StaticEmbedder

    with TieredMemory(tmp_path, embedder=embedder) as memory:  # 384-d MiniLM vectors
        _fill(memory)
        memory.add_fact("User collects maps", user_id="gone")
        memory.add_fact("User collects old maps", user_id="gone")
        memory.working_memory("now", user_id="gone").remember("looking for a map of Braga", type="goal")
    with TieredMemory(tmp_path, embedder=StaticEmbedder()) as memory:  # 256-d: re-embedded at open
        ctx = memory.build_context("a map of Braga?", user_id="gone", session_id="now")
        assert "looking for a map of Braga" in ctx.to_text()
        assert "Braga" in memory.search("maps of Braga", user_id="gone", k=1)[0].text
        memory.consolidate("gone")  # merges facts by their stored vectors: none may be stale


def test_space_of_forgotten_vectors_is_reclaimed(tmp_path: Path) -> None:
    from tiered_memory import StaticEmbedder

    def size() -> int:  # the HNSW segment files, where deleted vectors keep their space
        return sum(f.stat().st_size for f in (tmp_path / "chroma").rglob("*") if f.is_file() and f.parent.name != "chroma")

    embedder = StaticEmbedder()
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        memory.add("user", "I am the one who stays: my cat is called Miso.", session_id="s", user_id="keeper")
        for cycle in range(60):  # add/forget churn: 6,000 vectors deleted
            memory.add_many([{"role": "user", "content": f"churn {cycle} note {n}"} for n in range(100)],
                            session_id="s", user_id=f"tmp{cycle}")
            memory.forget_user(f"tmp{cycle}")
    grown = size()
    with TieredMemory(tmp_path, embedder=embedder) as memory:  # more forgotten than live: compacted at open
        assert memory.store.get_meta("forgotten_vectors") == "0"
        assert "Miso" in memory.search("what is my cat called?", user_id="keeper", k=1)[0].text
        assert memory.index.count() == 1
    assert size() < grown / 2
