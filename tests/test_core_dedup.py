"""Near-duplicates are stored in the transcript but not indexed twice."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from tiered_memory import MemoryConfig
from tiered_memory.recall.indexing import find_duplicates
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_schema import MIGRATIONS, add_text_hash
from tiered_memory.types import StoredMessage


def unit(*xs: float) -> list[float]:
    v = np.asarray(xs, dtype=np.float32)
    return list(v / np.linalg.norm(v))


@pytest.mark.parametrize("vectors, users, nearest, expected", [
    # nothing indexed yet, two distinct rows
    ([unit(1, 0), unit(0, 1)], ["u", "u"], [None, None], {}),
    # the same row twice in one batch: the second duplicates the first
    ([unit(1, 0), unit(1, 0.01)], ["u", "u"], [None, None], {"b": "a"}),
    # ... unless the users differ
    ([unit(1, 0), unit(1, 0.01)], ["u", "v"], [None, None], {}),
    # close to an already-indexed memory of this user
    ([unit(1, 0), unit(0, 1)], ["u", "u"], [("old", 0.97), ("old2", 0.5)], {"a": "old"}),
    # a duplicate is never the original of a later row: c matches b (a dup), not indexed a
    ([unit(1, 0), unit(0, 1), unit(0, 1)], ["u", "u", "u"], [None, ("x", 0.99), None], {"b": "x"}),
])
def test_find_duplicates(vectors, users, nearest, expected):
    ids = ["a", "b", "c"][: len(vectors)]
    assert find_duplicates(np.asarray(vectors), users, nearest, ids, 0.95) == expected


def test_near_duplicate_is_kept_in_the_transcript_but_indexed_once(memory):
    first = memory.add("user", "I live in Lisbon", session_id="s", user_id="u")
    second = memory.add("user", "I live in Lisbon", session_id="s2", user_id="u")
    other = memory.add("user", "My favourite colour is green.", session_id="s", user_id="u")
    assert [m.id for m in memory.get_messages("s2", user_id="u")] == [second]
    assert memory.index.ids("u") == {first, other}
    s = memory.stats()
    assert (s.messages, s.vectors, s.duplicates) == (3, 2, 1)


def test_the_same_text_for_two_users_is_indexed_for_both(memory):
    a = memory.add("user", "I am allergic to penicillin.", session_id="s", user_id="a")
    b = memory.add("user", "I am allergic to penicillin.", session_id="s", user_id="b")
    assert memory.index.ids("a") == {a} and memory.index.ids("b") == {b}


def test_threshold_is_configurable(make_memory):
    memory = make_memory(config=MemoryConfig(dedup_threshold=1.01))  # above 1: never a duplicate
    memory.add_many([{"role": "user", "content": "same words"}, {"role": "user", "content": "same words"}],
                    session_id="s", user_id="u")
    assert memory.stats().vectors == 2 and memory.stats().duplicates == 0


def test_the_same_text_up_to_case_and_end_spaces_is_a_duplicate_across_calls(memory):
    first = memory.add("user", "Thanks, see you tomorrow!", session_id="s", user_id="u")
    again = memory.add("user", "  thanks, SEE you tomorrow!  ", session_id="s2", user_id="u")
    assert memory.index.ids("u") == {first}
    assert memory.get_messages("s2", user_id="u")[0].id == again  # kept in the transcript


def test_a_write_on_sqlite_makes_no_vector_query(make_memory, tmp_path):
    """The near-duplicate check is one indexed SQLite lookup: an index whose queries all
    fail does not stop writes, and duplicates are still found."""
    from tiered_memory.testing import FailingVectorIndex
    from tiered_memory.vector.chroma import ChromaVectorIndex

    index = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "v")), fail_on=["query"], times=None)
    memory = make_memory(vector_store=index)
    memory.add_many([{"role": "user", "content": f"note {i}"} for i in range(5)], session_id="s", user_id="u")
    memory.add_many([{"role": "user", "content": "note 3"}], session_id="s", user_id="u")
    assert index.failures == 0
    assert (memory.stats().vectors, memory.stats().duplicates) == (5, 1)


def test_find_duplicates_across_row_blocks():
    """Rows are compared in blocks of 512: a duplicate of a row of an earlier block is found."""
    rng = np.random.default_rng(0)
    v = rng.standard_normal((1100, 64)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    v[1000] = v[3]
    v[1050] = v[1000]  # a duplicate's duplicate names the original, not the duplicate
    ids = [f"m{i}" for i in range(1100)]
    assert find_duplicates(v, ["u"] * 1100, [None] * 1100, ids, 0.95) == {"m1000": "m3", "m1050": "m3"}
    # another user's row is never the original: m1000 and m1050 are w's, m3 is u's
    assert find_duplicates(v, ["u"] * 1000 + ["w"] * 100, [None] * 1100, ids, 0.95) == {"m1050": "m1000"}


def test_a_row_is_never_a_duplicate_of_itself():
    """Re-indexing a row whose vector is already in the index (a lost mark) keeps it."""
    assert find_duplicates(np.asarray([unit(1, 0)]), ["u"], [("a", 1.0)], ["a"], 0.95) == {}


def naive_duplicates(vectors, users, nearest, ids, threshold):
    """The rule of :func:`find_duplicates`, pair by pair (the reference)."""
    dup: dict[str, str] = {}
    for i in range(len(ids)):
        near = nearest[i]
        if near is not None and near[0] != ids[i] and near[1] >= threshold:
            dup[ids[i]] = near[0]
            continue
        for j in range(i):
            if users[j] == users[i] and ids[j] not in dup and float(vectors[i] @ vectors[j]) >= threshold:
                dup[ids[i]] = ids[j]
                break
    return dup


@pytest.mark.parametrize("seed", range(12))
def test_find_duplicates_matches_the_pairwise_rule(seed):
    """Only rows near an earlier row or a stored memory are walked; the result is the pairwise
    rule's, across blocks of 512 and users, with chains of duplicates."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 1300))
    centres = rng.standard_normal((int(rng.integers(1, 40)), 16)).astype(np.float32)
    v = centres[rng.integers(0, len(centres), n)] + rng.normal(0, 0.08, (n, 16)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    users = [f"u{k}" for k in rng.integers(0, 3, n)]
    ids = [f"m{k}" for k in range(n)]
    nearest = [(f"old{k}", float(rng.uniform(0.9, 1.0))) if rng.random() < 0.1 else None for k in range(n)]
    got = find_duplicates(v, users, nearest, ids, 0.97)
    assert got == naive_duplicates(v, users, nearest, ids, 0.97)
    assert got  # the clusters make duplicates: the comparison is not of two empty maps


def _stored(n: int, text: str, user: str = "u") -> StoredMessage:
    return StoredMessage(id=f"m{n}", user_id=user, session_id="s", role="user", content=text,
                         metadata={}, timestamp=float(n))


HEAD = "Remember that the meeting with the landlord is on "


def test_the_text_check_matches_whole_texts_up_to_case_and_end_spaces(tmp_path):
    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    try:
        store.insert_messages([_stored(0, HEAD + "Monday"), _stored(1, HEAD + "Tuesday"),
                               _stored(2, HEAD + "Friday", user="v")], indexed=True)
        asked = [HEAD + "Tuesday", "  " + HEAD.upper() + "Monday", HEAD + "Friday", HEAD[:12]]
        assert store.same_text("u", asked) == {asked[0]: "m1", asked[1]: "m0"}
    finally:
        store.close()


def test_a_store_with_the_whole_text_index_is_upgraded_and_finds_the_same_texts(tmp_path):
    path = tmp_path / "s.sqlite3"
    store = SQLiteRecordStore(path)
    store.insert_messages([_stored(0, HEAD + "Monday"), _stored(1, "short one")], indexed=True)
    store.close()
    con = sqlite3.connect(path, isolation_level=None)  # back to the schema before the hash index
    con.execute("DROP INDEX messages_user_text_hash")
    con.execute("UPDATE messages SET text_hash=NULL")
    con.execute("CREATE INDEX messages_user_text ON messages(user_id, lower(trim(content)))")
    since = MIGRATIONS.index(add_text_hash) + 1  # that step and the later ones run again
    con.execute("DELETE FROM schema_migrations WHERE name='core' AND version>=?", (since,))
    con.close()
    store = SQLiteRecordStore(path)
    try:
        assert store.schema_version() == len(MIGRATIONS)
        indexes = {r[0] for r in store.query("SELECT name FROM sqlite_master WHERE type='index'", ())}
        assert "messages_user_text_hash" in indexes and "messages_user_text" not in indexes
        assert store.same_text("u", [HEAD + "monday", "Short one ", HEAD]) == {HEAD + "monday": "m0",
                                                                               "Short one ": "m1"}
    finally:
        store.close()
