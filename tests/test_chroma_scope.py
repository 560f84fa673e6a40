"""Chroma's one metadata key (vector/chroma_scope.py): a vector carries its user and
layer in one value, its session comes from the record store, and a collection written
with the three keys of earlier versions is migrated on open."""

from __future__ import annotations

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings

from tiered_memory.vector.base import SessionSink, VectorItem
from tiered_memory.vector.chroma import COLLECTION, SCOPED, ChromaVectorIndex
from tiered_memory.vector.chroma_scope import scope_collection


def unit(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


ROWS = [  # id, user, layer, session
    ("t1", "ann", "turn", "s1"), ("t2", "ann", "turn", "s2"), ("t1\x1f0", "ann", "chunk", "s1"),
    ("fact:f1", "ann", "fact", ""), ("ep:e1:0", "ann", "episode", "s1"), ("item:i1", "ann", "item", ""),
    ("t3", "bob", "turn", "s1"), ("fact:f2", "bob", "fact", ""),
]
SESSIONS = {"ann": {"t1": "s1", "t2": "s2"}, "bob": {"t3": "s1"}}


def check_layers(index: ChromaVectorIndex) -> None:
    """Each layer's query finds the user's vectors of that layer only, and user-wide
    reads and deletes reach every layer of the user and nobody else's."""
    q = unit(0)[None, :]
    for user in ("ann", "bob"):
        for layer in ("turn", "chunk", "fact", "episode", "item"):
            want = {i for i, u, lay, _ in ROWS if u == user and lay == layer}
            assert {i for i, _ in index.query(q, user_id=user, k=10, layers=[layer])[0]} == want, (user, layer)
        assert index.ids(user) == {i for i, u, _, _ in ROWS if u == user}
    assert {i for i, _ in index.query(q, user_id="ann", k=10, layers=["turn", "fact"])[0]} == {"t1", "t2", "fact:f1"}
    index.delete_user("ann")
    assert index.ids("ann") == set() and index.ids("bob") == {"t3", "fact:f2"}


@pytest.mark.parametrize("exact_rows", [0, 200_000])
@pytest.mark.parametrize("told", [True, False])
def test_a_vector_carries_one_metadata_key_and_each_layer_is_found_apart(tmp_path, exact_rows, told):
    """With the record store telling sessions, one key; an index used on its own keeps the
    session in a second one."""
    index = ChromaVectorIndex(str(tmp_path / "v"), exact_rows=exact_rows)
    if told:
        index.use_sessions(lambda user, ids: SESSIONS.get(user, {}))
    try:
        index.upsert([VectorItem(id=i, vector=unit(n), user_id=u, layer=lay, session_id=s)
                      for n, (i, u, lay, s) in enumerate(ROWS)])
        metas = index.collection.get(include=["metadatas"])["metadatas"]
        keys = {"user_id"} if told else {"user_id", "session_id"}
        assert all(set(m) == keys for m in metas) and index.collection.metadata[SCOPED]
        check_layers(index)
    finally:
        index.close()


def test_a_memory_tells_its_chroma_index_the_sessions(make_memory):
    memory = make_memory()
    assert isinstance(memory.index, SessionSink)  # what attach_sessions looks for
    memory.add("user", "The boiler is serviced every March.", session_id="s1", user_id="ann")
    memory.flush()
    metas = memory.index.collection.get(include=["metadatas"])["metadatas"]
    assert metas == [{"user_id": "ann"}]
    assert [h.id for h in memory.search("boiler", user_id="ann", session_id="s1")] \
        and not memory.search("boiler", user_id="ann", session_id="s2")


def test_a_collection_of_three_keys_is_migrated_on_open_and_reads_the_same(tmp_path):
    client = chromadb.PersistentClient(path=str(tmp_path / "v"), settings=Settings(anonymized_telemetry=False))
    old = client.get_or_create_collection(COLLECTION, embedding_function=None, configuration={"hnsw": {"space": "cosine"}})
    old.add(ids=[r[0] for r in ROWS], embeddings=np.stack([unit(n) for n in range(len(ROWS))]),
            metadatas=[{"user_id": u, "layer": lay, "session_id": s} for _, u, lay, s in ROWS])
    client.close()
    from tiered_memory.vector.chroma_client import forget_cached_client
    forget_cached_client(str(tmp_path / "v"))
    index = ChromaVectorIndex(str(tmp_path / "v"), exact_rows=0)
    try:
        assert index.collection.metadata[SCOPED]
        scope_collection(index.collection)  # a second run (an interrupted one re-run) changes nothing
        check_layers(index)
    finally:
        index.close()


@pytest.mark.parametrize("exact_rows", [0, 200_000])
def test_a_session_scoped_query_finds_the_sessions_best_from_the_record_store(tmp_path, exact_rows):
    """Forty turns of another session rank above the two of the asked one: the engine is
    read further until the session's best k are found (the exact scan masks them)."""
    index = ChromaVectorIndex(str(tmp_path / "v"), exact_rows=exact_rows)
    q = unit(0)
    near = [q + 0.01 * unit(100 + n) for n in range(40)]
    sessions = {f"o{n}": "other" for n in range(40)} | {"mine1": "s", "mine2": "s"}
    index.use_sessions(lambda user, ids: sessions if user == "ann" else {})
    try:
        index.upsert([VectorItem(id=f"o{n}", vector=v / np.linalg.norm(v), user_id="ann", session_id="other")
                      for n, v in enumerate(near)]
                     + [VectorItem(id="mine1", vector=unit(1), user_id="ann", session_id="s"),
                        VectorItem(id="mine2", vector=unit(2), user_id="ann", session_id="s"),
                        VectorItem(id="mine1\x1f0", vector=unit(3), user_id="ann", layer="chunk", session_id="s")])
        if exact_rows:
            assert index.scans_exactly("ann", wait=True)
        found = index.query(q[None, :], user_id="ann", k=2, layers=["turn"], session_id="s")[0]
        assert {i for i, _ in found} == {"mine1", "mine2"}
        chunks = index.query(q[None, :], user_id="ann", k=3, layers=["chunk"], session_id="s")[0]
        assert [i for i, _ in chunks] == ["mine1\x1f0"]
        assert index.query(q[None, :], user_id="ann", k=2, layers=["turn"], session_id="other")[0][0][0] in sessions
    finally:
        index.close()


def test_the_record_store_tells_sessions_of_all_or_some_of_a_users_messages(tmp_path):
    from tiered_memory.store.sqlite import SQLiteRecordStore
    from tiered_memory.types import StoredMessage

    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    try:
        store.insert_messages([StoredMessage(id=i, user_id=u, session_id=s, role="user", content=i, metadata={},
                                             timestamp=0.0) for i, u, s in [("a", "ann", "s1"), ("b", "ann", "s2"),
                                                                            ("c", "bob", "s1")]])
        assert store.message_sessions("ann") == {"a": "s1", "b": "s2"}
        assert store.message_sessions("ann", ["b", "c", "nope", "b"]) == {"b": "s2"}  # never another user's
    finally:
        store.close()
