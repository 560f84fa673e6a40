"""Two apps given one vector collection by mistake are told so at open, before either writes:
a Chroma or Qdrant collection records the record store that owns it (a store id kept in the
store's meta table), a collection of another store is a ConfigurationError naming
``?collection=``, a collection of an earlier version (no owner yet) is claimed by the store
whose vectors it holds, and the workers of one PostgreSQL app share theirs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered_memory import ConfigurationError, StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.vector.chroma import ChromaVectorIndex
from tiered_memory.vector.qdrant import QdrantVectorIndex

OWNER_KEY = "tiered_memory_owner"  # (tiered_memory.vector.ownership.OWNER_KEY)
NOTES = [
    {"role": "user", "content": "I grow chillies on my balcony in Valencia."},
    {"role": "assistant", "content": "Chillies love the Valencian sun."},
    {"role": "user", "content": "My partner Ines is a marine biologist."},
]


def _chroma_collection(chroma_url: str, name: str) -> Any:
    import chromadb

    host, port = chroma_url.removeprefix("http://").rsplit(":", 1)
    return chromadb.HttpClient(host=host, port=int(port)).get_collection(name, embedding_function=None)


def _snapshot(collection: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Chroma collection's metadata and every vector's metadata, by id."""
    got = collection.get(include=["metadatas"])
    return dict(collection.metadata or {}), dict(zip(got["ids"], got["metadatas"]))


def _refused_and_untouched(tmp_path: Path, url: str, chroma_url: str, name: str, match: str) -> Any:
    """Open a second app on ``url``: it must be refused (``match``) and leave the collection as it was."""
    before = _snapshot(_chroma_collection(chroma_url, name))
    with pytest.raises(ConfigurationError, match=match) as refused:
        TieredMemory(tmp_path / "app2", embedder=StaticEmbedder(), vector_store=url)
    assert _snapshot(_chroma_collection(chroma_url, name)) == before
    return refused.value


@pytest.mark.servers
def test_a_second_app_on_a_chroma_collection_is_refused_and_writes_nothing(
        tmp_path: Path, chroma_url: str, chroma_collection: str) -> None:
    url = f"{chroma_url}?collection={chroma_collection}"
    with TieredMemory(tmp_path / "app1", embedder=StaticEmbedder(), vector_store=url) as app1:
        ids = app1.add_many(NOTES, session_id="s", user_id="u1")
    assert set(ids) <= set(_snapshot(_chroma_collection(chroma_url, chroma_collection))[1])
    refused = _refused_and_untouched(tmp_path, url, chroma_url, chroma_collection, r"\?collection=")
    assert chroma_collection in str(refused)
    # the owner opens it as before, after a rebuild and a compaction too
    with TieredMemory(tmp_path / "app1", embedder=StaticEmbedder(), vector_store=url) as app1:
        app1.rebuild_index()
        assert isinstance(app1.index, ChromaVectorIndex)
        app1.index.compact()
        assert app1.search("what does my partner do?", user_id="u1", k=1)[0].id == ids[2]
    _refused_and_untouched(tmp_path, url, chroma_url, chroma_collection, r"\?collection=")
    with TieredMemory(tmp_path / "app1", embedder=StaticEmbedder(), vector_store=url) as app1:
        assert app1.index.ids() == set(ids)


@pytest.mark.servers
def test_a_chroma_collection_of_an_earlier_version_is_claimed_by_the_store_whose_vectors_it_holds(
        tmp_path: Path, chroma_url: str, chroma_collection: str) -> None:
    url = f"{chroma_url}?collection={chroma_collection}"
    with TieredMemory(tmp_path / "app1", embedder=StaticEmbedder(), vector_store=url) as app1:
        ids = app1.add_many(NOTES, session_id="s", user_id="u1")
    collection = _chroma_collection(chroma_url, chroma_collection)
    mark = dict(collection.metadata or {}).pop(OWNER_KEY)
    collection.modify(metadata={k: v for k, v in (collection.metadata or {}).items() if k != OWNER_KEY})
    assert OWNER_KEY not in (_chroma_collection(chroma_url, chroma_collection).metadata or {})  # as an older version left it
    _refused_and_untouched(tmp_path, url, chroma_url, chroma_collection, r"none of .* vectors")  # a new app holds none
    with TieredMemory(tmp_path / "app1", embedder=StaticEmbedder(), vector_store=url) as app1:
        assert app1.index.ids() == set(ids)
    assert _chroma_collection(chroma_url, chroma_collection).metadata[OWNER_KEY] == mark


@pytest.mark.servers
def test_workers_of_one_postgres_app_share_their_chroma_collection(
        make_postgres_url: Any, chroma_url: str, chroma_collection: str) -> None:
    pg, other_pg = make_postgres_url(), make_postgres_url()
    url = f"{chroma_url}?collection={chroma_collection}"
    first = TieredMemory(record_store=pg, vector_store=url, embedder=StaticEmbedder())
    second = TieredMemory(record_store=pg, vector_store=url, embedder=StaticEmbedder())
    try:
        mid = first.add("user", "I keep bees on the roof in Lisbon", user_id="u1", session_id="s")
        assert [h.id for h in second.search("where are the bees?", user_id="u1")] == [mid]
        second.rebuild_index()
        with TieredMemory(record_store=pg, vector_store=url, embedder=StaticEmbedder()) as third:
            assert third.index.ids() == {mid}
        assert _chroma_collection(chroma_url, chroma_collection).metadata[OWNER_KEY] == first.store.get_meta("store_id")
        with pytest.raises(ConfigurationError, match=r"\?collection="):  # another database: another app
            TieredMemory(record_store=other_pg, vector_store=url, embedder=StaticEmbedder())
        assert second.index.ids() == {mid}
    finally:
        first.close()
        second.close()


def test_a_second_app_on_a_qdrant_collection_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")  # one engine, two apps (a server serves them alike)

    def open_app(name: str) -> TieredMemory:
        return TieredMemory(tmp_path / name, embedder=StaticEmbedder(),
                            vector_store=QdrantVectorIndex(client=client, collection="shared"))

    with open_app("app1") as app1:
        ids = app1.add_many(NOTES, session_id="s", user_id="u1")
        app1.rebuild_index()  # drops and recreates the collection: still app1's
    points = client.count("shared").count
    with pytest.raises(ConfigurationError, match=r"\?collection="):
        open_app("app2")
    assert client.count("shared").count == points
    with open_app("app1") as app1:
        assert app1.index.ids() == set(ids)


def test_an_app_that_met_no_qdrant_collection_does_not_write_into_one_made_meanwhile(tmp_path: Path) -> None:
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    app1 = TieredMemory(tmp_path / "app1", embedder=StaticEmbedder(),
                        vector_store=QdrantVectorIndex(client=client, collection="shared"))
    app2 = TieredMemory(tmp_path / "app2", embedder=StaticEmbedder(),  # no collection yet: nothing to refuse
                        vector_store=QdrantVectorIndex(client=client, collection="shared"))
    try:
        ids = app1.add_many(NOTES, session_id="s", user_id="u1")  # made here, app1's
        with pytest.raises(VectorIndexError, match=r"\?collection="):  # the row is kept, left unindexed
            app2.add("user", "an unrelated note", session_id="s", user_id="u1")
        assert app1.index.ids() == set(ids)
        assert app2.stats().messages == 1
    finally:
        app1.close()
        app2.close()
    with pytest.raises(ConfigurationError, match=r"\?collection="):
        TieredMemory(tmp_path / "app2", embedder=StaticEmbedder(),
                     vector_store=QdrantVectorIndex(client=client, collection="shared"))


@pytest.mark.parametrize(("mark", "turns", "held", "verdict"), [
    ("me", set(), set(), "mine"),
    ("other", set(), set(), "foreign"),
    ("other", {"m1"}, {"m1"}, "foreign"),  # a mark decides: the ids are not read
    (None, set(), set(), "claim"),  # new, or only fact / episode / item vectors
    (None, {"m1", "m2"}, {"m1"}, "claim"),  # an upgraded app whose collection lags its store
    (None, {"m1", "m2"}, set(), "unmarked-foreign"),
])
def test_judge_owner(mark: str | None, turns: set[str], held: set[str], verdict: str) -> None:
    from tiered_memory.vector.ownership import judge_owner, turn_ids

    assert judge_owner(mark, "me", turns, held) == verdict
    assert turn_ids(["m1", "m2\x1f0", "fact:f1", "item:i1#2", "episode:e1"]) == {"m1", "m2"}
