"""The vector index is derived: it is repaired from the record store when they disagree."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest


from tiered_memory import TieredMemory

NOTES = [
    {"role": "user", "content": "My flight to Nairobi leaves on the 14th of August."},
    {"role": "assistant", "content": "Noted: Nairobi on August 14th."},
    {"role": "user", "content": "I prefer aisle seats and vegetarian meals on long flights."},
    {"role": "user", "content": "My brother Tomas lives in Mombasa."},
]


def _mark_unclean(folder) -> None:
    """What a crash leaves behind: the store still says it is open."""
    con = sqlite3.connect(folder / "records.sqlite3")
    con.execute("UPDATE meta SET value='open' WHERE key='state'")
    con.commit()
    con.close()


def _store_with_notes(make_memory, name="mem"):
    m = make_memory(name)
    ids = m.add_many(NOTES, session_id="trip", user_id="u1")
    m.flush()  # the vectors reach Chroma (written behind), where the tests then delete them
    return m, ids


def test_vectors_deleted_behind_our_back_are_restored_on_an_unclean_open(make_memory, tmp_path):
    m, ids = _store_with_notes(make_memory)
    m.index.collection.delete(ids=ids[:3])  # straight into Chroma
    assert m.index.count() == 1
    m.close()
    _mark_unclean(tmp_path / "mem")

    again = make_memory("mem")
    assert again.index.ids() == set(ids)
    assert again.search("where does my brother live?", user_id="u1", k=1)[0].id == ids[3]
    assert again.search("aisle seat meal preference", user_id="u1", k=4)[0].id == ids[2]


def test_lost_vectors_are_noticed_even_after_a_clean_close(make_memory, tmp_path):
    m, ids = _store_with_notes(make_memory)
    m.index.collection.delete(ids=ids[:2])
    m.close()  # state 'closed': the count check still sees 2 vectors for 4 indexed turns

    again = make_memory("mem")
    assert again.index.ids() == set(ids)


def test_vectors_the_store_does_not_hold_are_dropped_on_repair(make_memory, tmp_path):
    m, ids = _store_with_notes(make_memory)
    from tiered_memory.vector.base import VectorItem

    dim = len(m.embedder.embed_query("x"))  # the suite's embedder: 384 (MiniLM) or the static table's
    m.index.upsert([VectorItem(id="ghost", vector=[1.0] + [0.0] * (dim - 1), user_id="u1")])
    m.close()
    _mark_unclean(tmp_path / "mem")
    again = make_memory("mem")
    assert again.index.ids() == set(ids)
    assert "ghost" not in {h.id for h in again.search("flight", user_id="u1")}


def test_rebuild_index_recreates_every_vector(make_memory):
    m, ids = _store_with_notes(make_memory)
    m.add("user", "A second user's note about Lisbon.", session_id="s", user_id="u2")
    m.index.collection.delete(ids=ids)
    assert m.search("Nairobi flight", user_id="u1", k=1)[0].explanation["signals"].get("vector") is None
    report = m.rebuild_index()
    assert report["indexed"] == 5
    assert m.index.count() == 5 and m.index.ids("u1") == set(ids)
    hits = m.search("when is my flight to Nairobi?", user_id="u1", k=2)
    assert ids[0] in {h.id for h in hits}
    assert all("vector" in h.explanation["signals"] for h in hits)


async def test_arebuild_index_is_the_same_operation(make_memory):
    m, ids = _store_with_notes(make_memory)
    m.index.reset()
    assert m.index.count() == 0
    report = await m.arebuild_index()
    assert report["indexed"] == 4 and m.index.ids() == set(ids)


def test_messages_stored_but_not_indexed_are_indexed_on_next_open(make_memory, tmp_path):
    m, ids = _store_with_notes(make_memory)
    # a crash between the record commit and the vector upsert leaves rows unindexed
    m.store.reset_indexed_ids(ids[1:2])
    m.index.delete(ids[1:2])
    m.close()
    _mark_unclean(tmp_path / "mem")
    again = make_memory("mem")
    assert again.stats().indexed == 4 and again.index.ids() == set(ids)


def test_changing_the_embedder_rebuilds_the_index(make_memory, tmp_path):
    m, ids = _store_with_notes(make_memory)
    m.close()

    class Tiny:  # a different model: vectors must be recomputed, not mixed
        name = "tiny-test-embedder"

        def embed_documents(self, texts):
            return [[b - 127.5 for b in hashlib.sha256(t.encode()).digest()[:16]] for t in texts]

        def embed_query(self, text):
            return self.embed_documents([text])[0]

    with TieredMemory(tmp_path / "mem", embedder=Tiny()) as other:
        assert other.store.get_meta("embedder") == "tiny-test-embedder"
        assert other.index.ids() == set(ids)
        assert other.stats().duplicates == 0
        assert other.search("Mombasa", user_id="u1", k=1)[0].id == ids[3]


@pytest.mark.parametrize("others", [0, 80])
def test_search_survives_an_index_missing_a_vector_the_store_lists(make_memory, tmp_path, others) -> None:
    """Turn recall hands the index the user's ids; one it lacks (repair not run yet) must not
    break search: up to ``EXACT_AMONG_MAX`` ids the index reads the vectors it has and ranks
    them, beyond it asks the engine (whose query by ids, when it fails on the missing one,
    falls back to the metadata filter). (An index that never holds the user for the exact
    scan: once it holds them, no ids are passed, and whether the first search ran before the
    user's vectors loaded was a race.)"""
    from tiered_memory.vector.chroma import EXACT_AMONG_MAX, ChromaVectorIndex

    assert (3 + others > EXACT_AMONG_MAX) == bool(others)  # both paths

    memory = make_memory("ids", vector_store=ChromaVectorIndex(str(tmp_path / "ids-index"), exact_rows=0))
    ids = memory.add_many([{"role": "user", "content": t} for t in
                           ["I keep bees on the roof", "My sister lives in Oslo", "We adopted a cat"]
                           + [f"Filler note number {n} about the weather" for n in range(others)]],
                          user_id="u", session_id="s")
    memory.index.delete([ids[1]])  # behind the store's back: it still lists the turn as indexed
    hits = memory.search("where does my sister live?", user_id="u", k=3)
    assert hits[0].id == ids[1]  # found by its words: the record store still holds it
    assert {h.id for h in hits} <= set(ids)
    assert memory.search("bees on the roof", user_id="u", k=1)[0].id == ids[0]


def test_a_large_index_is_checked_by_its_count_at_a_clean_open(make_memory):
    """Past LIST_IDS_MAX vectors the clean-open check compares counts and lists no ids
    (listing pages by offset: minutes at a million); fewer vectors than turns is still a loss."""
    from tiered_memory.startup import index_lost_vectors

    m, ids = _store_with_notes(make_memory)
    listed: list[int] = []
    ids_of = m.index.ids
    m.index.ids = lambda *a, **k: listed.append(1) or ids_of(*a, **k)  # type: ignore[method-assign]
    assert index_lost_vectors(m.store, m.index) is False and listed == [1]  # small: counted exactly
    assert index_lost_vectors(m.store, m.index, list_ids_max=2) is False and listed == [1]  # large: count only
    m.index.collection.delete(ids=ids[:2])
    assert index_lost_vectors(m.store, m.index, list_ids_max=2) is True  # 2 vectors for 4 turns


def test_a_message_id_with_a_colon_is_repaired_like_any_other(make_memory, tmp_path):
    # only the prefixes of episode, fact and item vectors mark a vector the turn repair leaves
    # alone; a message id such as a chat app's "slack:C1:123" is repaired like any other: its
    # lost vector comes back, and a vector of one that no row holds is dropped
    m = make_memory("mem")
    ids = m.add_many([{**n, "id": f"slack:C1:{i}"} for i, n in enumerate(NOTES)], session_id="trip", user_id="u1")
    fact = m.add_fact("Tomas lives in Mombasa", user_id="u1")
    m.flush()
    m.index.collection.delete(ids=ids[:2])
    from tiered_memory.vector.base import VectorItem

    dim = len(m.embedder.embed_query("x"))  # the suite's embedder: 384 (MiniLM) or the static table's
    m.index.upsert([VectorItem(id="slack:C1:ghost", vector=[1.0] + [0.0] * (dim - 1), user_id="u1")])  # no row
    m.close()
    _mark_unclean(tmp_path / "mem")

    again = make_memory("mem")
    assert again.index.ids() == {*ids, f"fact:{fact.id}"}  # the lost two back, the ghost gone
    assert again.search("when does my flight leave?", user_id="u1", k=1)[0].id == "slack:C1:0"
