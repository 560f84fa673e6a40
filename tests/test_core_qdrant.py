"""The facade on Qdrant local mode: swapping the vector engine is a one-argument change."""

from __future__ import annotations

import sqlite3
import threading
import warnings

import numpy as np

from tiered_memory.vector.qdrant import QdrantVectorIndex

NOTES = [
    {"role": "user", "content": "I grow chillies on my balcony in Valencia."},
    {"role": "assistant", "content": "Chillies love the Valencian sun."},
    {"role": "user", "content": "My partner Ines is a marine biologist."},
]


def test_qdrant_local_mode_stores_searches_and_survives_a_restart(make_memory, tmp_path):
    m = make_memory("q", vector_store="qdrant")
    assert isinstance(m.index, QdrantVectorIndex)
    ids = m.add_many(NOTES, session_id="s", user_id="u1")
    other = m.add("user", "Ines is also my sister's name.", session_id="s", user_id="u2")
    assert m.search("what does my partner do?", user_id="u1", k=1)[0].id == ids[2]
    assert {h.id for h in m.search("Ines", user_id="u2", k=5)} == {other}
    m.close()
    assert (tmp_path / "q" / "qdrant").is_dir() and not (tmp_path / "q" / "chroma").exists()

    again = make_memory("q", vector_store="qdrant")
    assert again.index.ids() == set(ids) | {other}
    assert again.search("plants on the balcony", user_id="u1", k=1)[0].id == ids[0]


def test_qdrant_forget_user_and_repair(make_memory, tmp_path):
    m = make_memory("q", vector_store="qdrant")
    ids = m.add_many(NOTES, session_id="s", user_id="u1")
    keep = m.add("user", "unrelated note", session_id="s", user_id="u2")
    assert m.forget_user("u1") == 3
    assert m.index.ids("u1") == set() and m.index.ids() == {keep}
    assert m.search("chillies", user_id="u1") == []

    ids = m.add_many(NOTES, session_id="s", user_id="u1")
    m.index.delete(ids[:2])  # the index loses entries
    m.close()
    con = sqlite3.connect(tmp_path / "q" / "records.sqlite3")
    con.execute("UPDATE meta SET value='open' WHERE key='state'")
    con.commit()
    con.close()
    again = make_memory("q", vector_store="qdrant")
    assert again.index.ids("u1") == set(ids)


def test_switching_engines_reindexes_from_the_record_store(make_memory):
    m = make_memory("both")  # Chroma
    ids = m.add_many(NOTES, session_id="s", user_id="u1")
    m.close()
    q = make_memory("both", vector_store="qdrant")  # an empty Qdrant index: rebuilt from records
    assert q.index.ids() == set(ids)
    assert q.search("marine biology", user_id="u1", k=1)[0].id == ids[2]


def _query_while_upserting(writer, reader, monkeypatch) -> bool:
    """Whether ``reader.query`` from another thread entered the local engine while
    ``writer.upsert`` was inside it."""
    from qdrant_client.local.qdrant_local import QdrantLocal

    from tiered_memory.vector.base import VectorItem

    for index in (writer, reader):
        index.upsert([VectorItem(id="a", vector=[1.0, 0.0], user_id="u")])
    upserting = threading.Event()
    overlapped: list[bool] = []
    threads: list[threading.Thread] = []
    query_points, upsert = QdrantLocal.query_points, QdrantLocal.upsert

    def watched_query(self, *args, **kwargs):
        overlapped.append(upserting.is_set())
        return query_points(self, *args, **kwargs)

    def upsert_with_a_query_meanwhile(self, *args, **kwargs):
        upserting.set()
        other = threading.Thread(target=reader.query, args=(np.array([[1.0, 0.0]]),),
                                 kwargs={"user_id": "u", "k": 1})
        threads.append(other)
        other.start()
        other.join(2.0)  # unsafe code lets it run to the end here; safe code holds it back
        upserting.clear()
        return upsert(self, *args, **kwargs)

    monkeypatch.setattr(QdrantLocal, "query_points", watched_query)
    monkeypatch.setattr(QdrantLocal, "upsert", upsert_with_a_query_meanwhile)
    writer.upsert([VectorItem(id="b", vector=[0.0, 1.0], user_id="u")])
    threads[0].join()
    assert len(overlapped) == 1
    assert writer.ids("u") == {"a", "b"}
    return overlapped[0]


def test_local_mode_lets_one_thread_into_the_engine_at_a_time(tmp_path, monkeypatch):
    """Qdrant's local engine is not thread-safe: a query running while an upsert grows the
    collection raised "operands could not be broadcast together" (found by a stress run)."""
    index = QdrantVectorIndex(str(tmp_path / "q"), exact_rows=0)  # every query reaches the engine
    assert not _query_while_upserting(index, index, monkeypatch)
    index.close()


def test_two_collections_on_one_local_client_share_its_lock(monkeypatch):
    """Two apps on one in-process engine (see test_vector_collections) take turns in it too."""
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")
    one, two = (QdrantVectorIndex(client=client, collection=c, exact_rows=0) for c in ("one", "two"))
    assert not _query_while_upserting(one, two, monkeypatch)
    client.close()


def test_an_index_opened_before_its_collection_was_made_sees_it_once_made():
    """Workers of one app on a Qdrant server each open the collection; the first write of any
    of them makes it. A worker that opened it before then (a fresh deployment) took it for
    absent until it wrote itself: its queries found nothing and its deletes (forget,
    forget_user) deleted nothing. Two indexes on one engine play the two workers."""
    from qdrant_client import QdrantClient

    from tiered_memory.vector.base import VectorItem

    client = QdrantClient(location=":memory:")
    writer, reader = (QdrantVectorIndex(client=client, collection="app", exact_rows=0) for _ in range(2))
    writer.upsert([VectorItem(id=i, vector=v, user_id="u") for i, v in (("a", [1.0, 0.0]), ("b", [0.0, 1.0]))])
    assert reader.count() == 2 and reader.ids("u") == {"a", "b"}
    assert [i for i, _ in reader.query(np.array([[1.0, 0.0]]), user_id="u", k=1)[0]] == ["a"]
    reader.delete(["a"])
    assert writer.ids() == {"b"}
    reader.delete_user("u")
    assert writer.ids() == set()
    client.close()


def test_a_new_local_memory_warns_of_nothing(make_memory):
    """``vector_store="qdrant"`` printed qdrant-client's UserWarning "Payload indexes have no
    effect in the local Qdrant ... Please use server Qdrant if you need payload indexes" on the
    first write of every new folder: the collection was given the server's payload indexes, which
    the local engine ignores. (The suite turns warnings into errors, and the index swallowed that
    error, so only a warning recorder sees it.)"""
    m = make_memory("q", vector_store="qdrant")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.add_many(NOTES, session_id="s", user_id="u1")
        m.rebuild_index()  # makes the collection anew
    assert [str(w.message) for w in caught] == []
    assert len(m.search("chillies", user_id="u1", k=3)) == 3


def test_switching_back_to_an_index_left_behind_rebuilds_it(make_memory):
    m = make_memory("both")  # Chroma
    kept, forgotten = m.add_many(NOTES[:2], session_id="s", user_id="u1")
    m.close()
    q = make_memory("both", vector_store="qdrant")
    q.forget(forgotten, user_id="u1")
    new = q.add("user", "My sister plays the cello in an orchestra.", session_id="s", user_id="u1")
    q.close()
    back = make_memory("both", vector_store="chroma")  # the index left behind: as many vectors as turns, not the same
    assert back.index.ids() == {kept, new}


def test_a_folder_indexed_into_qdrant_reopens_on_qdrant_when_no_index_is_named(make_memory, tmp_path, caplog,
                                                                                monkeypatch):
    """Opened without vector_store= (and without TIERED_MEMORY_VECTOR_STORE), a folder whose
    records were last indexed into its Qdrant got a second index, a Chroma one rebuilt beside
    it, at every such open (the CLI's always). The records remember their index: it opens again."""
    import io
    import json
    import logging

    from tiered_memory.cli import main

    monkeypatch.delenv("TIERED_MEMORY_VECTOR_STORE", raising=False)
    m = make_memory("q", vector_store="qdrant")
    ids = m.add_many(NOTES, session_id="s", user_id="u1")
    m.close()
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        again = make_memory("q")
        assert isinstance(again.index, QdrantVectorIndex)
        assert again.search("what does my partner do?", user_id="u1", k=1)[0].id == ids[2]
        again.close()
        out, err = io.StringIO(), io.StringIO()
        assert main(["--path", str(tmp_path / "q"), "stats", "--json"], stdout=out, stderr=err) == 0, err.getvalue()
    assert json.loads(out.getvalue())["vectors"] == 3
    assert not (tmp_path / "q" / "chroma").exists()
    assert not [r for r in caplog.records if "vector index changed" in r.getMessage()]
    monkeypatch.setenv("TIERED_MEMORY_VECTOR_STORE", "chroma")  # named: the move is asked for, and rebuilt
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        moved = make_memory("q")
    assert not isinstance(moved.index, QdrantVectorIndex) and moved.index.count() == 3
    assert [r for r in caplog.records if "vector index changed" in r.getMessage()]
