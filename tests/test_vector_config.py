"""A vector engine configured wrongly or gone away: a typed error naming the fix, no secret in it,
and a memory that still opens (records kept, vectors written once the engine takes them)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex
from tiered_memory.vector.qdrant import QdrantVectorIndex

from servers import free_port

SECRET = "qk-s3cret-api-key"


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
def test_an_unreachable_qdrant_server_is_a_typed_error_without_the_api_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QDRANT_API_KEY", SECRET)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(VectorIndexError) as info:
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store=f"qdrant+{url}")
    assert url in str(info.value) and "check the URL" in str(info.value)
    assert SECRET not in str(info.value)
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder()) as m:  # the folder was let go
        assert m.stats().messages == 0


def test_an_unreachable_chroma_server_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(VectorIndexError, match="could not reach a Chroma server at http://127.0.0.1:"):
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store=url)
    with pytest.raises(VectorIndexError) as info:
        ChromaVectorIndex.from_url(f"http://app:{SECRET}@127.0.0.1:{free_port()}/chroma?collection=app1")
    assert SECRET not in str(info.value)


def test_a_qdrant_server_gone_away_gives_typed_errors_on_every_call() -> None:
    from qdrant_client import QdrantClient

    index = QdrantVectorIndex(client=QdrantClient(location=":memory:"))
    index.upsert([VectorItem(id="a", vector=[1.0, 0.0, 0.0], user_id="u")])
    index.client = QdrantClient(url=f"http://127.0.0.1:{free_port()}", check_compatibility=False)  # went away
    for call in (index.ids, index.count, lambda: index.ids("u"), lambda: index.count("u"), index.reset):
        with pytest.raises(VectorIndexError):
            call()


def _other_width(tmp_path: Path, engine: str) -> Any:
    """An index (a new client each call) whose collection, the memory's at ``tmp_path / "m"``
    (marked with its record store's id), already holds a 3-dimensional vector, another
    embedder's."""
    def make() -> Any:
        if engine == "chroma":
            import chromadb

            return ChromaVectorIndex(client=chromadb.PersistentClient(str(tmp_path / "v")))
        return QdrantVectorIndex(str(tmp_path / "v"))

    index = make()
    (tmp_path / "m").mkdir()
    store = SQLiteRecordStore(tmp_path / "m" / "records.sqlite3")
    index.mark_owner(str(store.get_meta("store_id")))
    store.close()
    index.upsert([VectorItem(id="theirs", vector=[1.0, 0.0, 0.0], user_id="someone")])
    return index, make


@pytest.mark.parametrize("engine", ["chroma", "qdrant"])
def test_a_collection_of_another_dimension_is_an_error_naming_the_fix(tmp_path: Path, engine: str) -> None:
    embedder = StaticEmbedder()
    index, _ = _other_width(tmp_path, engine)
    with TieredMemory(tmp_path / "m", embedder=embedder, vector_store=index) as m:
        with pytest.raises(VectorIndexError) as info:
            m.add("user", "I keep bees on the roof.", session_id="s", user_id="u")
        assert "stored but not indexed" in str(info.value)
        assert (f"the collection 'tiered_memory' holds 3-dimensional vectors and the embedder gives "
                f"{len(embedder.embed_query('x'))}") in str(info.value)
        assert "rebuild_index()" in str(info.value)


@pytest.mark.parametrize("engine", ["chroma", "qdrant"])
def test_an_engine_refusing_the_start_up_repair_leaves_the_memory_openable(
        tmp_path: Path, engine: str, caplog: pytest.LogCaptureFixture) -> None:
    embedder = StaticEmbedder()
    index, make = _other_width(tmp_path, engine)
    with TieredMemory(tmp_path / "m", embedder=embedder, vector_store=index) as m:
        with pytest.raises(VectorIndexError):
            m.add("user", "I keep bees on the roof.", session_id="s", user_id="u")
    index.close()
    # reopened with the message pending: the start-up repair cannot index it, the memory opens anyway
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        again = TieredMemory(tmp_path / "m", embedder=embedder, vector_store=make())
    with again:
        assert "could not be repaired at open" in caplog.text
        assert [h.text for h in again.search("bees", user_id="u")] == ["I keep bees on the roof."]  # by keyword
        assert again.rebuild_index()["indexed"] == 1  # the fix the error names
        assert again.index.ids() == again.index.ids("u") != set()
        assert again.search("honey from the hives", user_id="u", k=1)


@pytest.mark.servers
def test_rebuild_index_restores_a_collection_the_server_lost(
        tmp_path: Path, chroma_url: str, chroma_collection: str) -> None:
    """A Chroma server that lost the collection (restarted without its data, or the collection
    deleted by hand) answers each call with "Collection ... does not exist"; rebuild_index(),
    the README's fix for a lost index, failed the same way when it dropped the collection, and
    its message said to run it again, which failed again."""
    import chromadb

    url = f"{chroma_url}?collection={chroma_collection}"
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store=url) as memory:
        mid = memory.add("user", "I keep bees on the roof in Lisbon", user_id="u", session_id="s")
        host, port = chroma_url.removeprefix("http://").rsplit(":", 1)
        chromadb.HttpClient(host=host, port=int(port)).delete_collection(chroma_collection)
        with pytest.raises(VectorIndexError, match=r"does not exist.*call rebuild_index\(\)"):
            memory.search("where are the bees?", user_id="u")
        memory.rebuild_index()
        assert memory.index.ids() == {mid}
        assert [h.id for h in memory.search("where are the bees?", user_id="u")] == [mid]
