"""SQLite's keyword index of per-user tagged words (store/sqlite_keywords.py): the pure
splitting and tagging, users kept apart, the migration of a store written by the previous
schema, and the bulk write's trigger guard, with FTS5's own integrity check after each."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered_memory.store.sqlite import APP_ID, SQLiteRecordStore
from tiered_memory.store.sqlite_schema import MIGRATIONS, split_sql
from tiered_memory.store.sqlite_keywords import tag_of
from tiered_memory.store.text_search import LENGTH_PAD, keyword_text, tagged_phrases, user_tag
from tiered_memory.types import StoredMessage


# ---- pure: words, tags, phrases ------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("Hello, world!", "7qHello 7qworld"),
    ("snake_case and don't", "7qsnake 7qcase 7qand 7qdon 7qt"),  # '_' and "'" separate, as in unicode61
    ("Café 用户 naïve", "7qCafé 7q用户 7qnaïve"),  # case and diacritics are left to FTS5
    ("2024-05-01 at 10:30", "7q2024 7q05 7q01 7qat 7q10 7q30"),
    ("   ...  ", ""),
    ("", ""),
])
def test_keyword_text(text, expected):
    pad = ["7q"] * LENGTH_PAD  # the bare tag, then the words
    assert keyword_text(user_tag(7), text) == " ".join(pad + ([expected] if expected else []))


@pytest.mark.parametrize("terms, expected", [
    (["violin", "new york"], ['"3qviolin"', '"3qnew 3qyork"']),
    ('"zq7x"', ['"3qzq7x"']),  # one term given as a string: one phrase, not its characters
    (['a"b OR c', "NEAR(x y)"], ['"3qa 3qb 3qOR 3qc"', '"3qNEAR 3qx 3qy"']),  # no operator survives
    (["violin", "violin", "...", ""], ['"3qviolin"']),
    ([], []),
])
def test_tagged_phrases(terms, expected):
    assert tagged_phrases(user_tag(3), terms) == expected


@given(a=st.integers(1, 10**6), b=st.integers(1, 10**6), x=st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True),
       y=st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True))
def test_tags_are_prefix_free(a, b, x, y):
    """Two users' tagged words are the same token only when user and word are the same."""
    assert (user_tag(a) + x == user_tag(b) + y) == (a == b and x == y)


def test_each_tagged_word_is_one_fts5_token_and_stems_alike_on_both_sides():
    con = sqlite3.connect(":memory:")
    con.execute("CREATE VIRTUAL TABLE t USING fts5(k, tokenize='porter unicode61')")
    con.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, row)")
    text = "Running dogs CAFÉ naïve 用户 x 2024 is " + "long" * 20
    con.execute("INSERT INTO t VALUES (?)", (keyword_text(user_tag(12), text),))
    terms = [r[0] for r in con.execute("SELECT term FROM v")]
    assert len(terms) == 10 and all(t.startswith("12q") for t in terms)  # the words and the bare tag
    for query in ("run", "dog", "cafe", "naive", "用户", "x", "2024", "is", "long" * 20):
        phrase = " OR ".join(tagged_phrases(user_tag(12), [query]))
        assert con.execute("SELECT count(*) FROM t WHERE t MATCH ?", (phrase,)).fetchone()[0] == 1, query
        other = " OR ".join(tagged_phrases(user_tag(1), [query]))  # "1q" + "2qx" is not "12q" + "x"
        assert con.execute("SELECT count(*) FROM t WHERE t MATCH ?", (other,)).fetchone()[0] == 0, query


# ---- a real store ------------------------------------------------------------------
def msg(i: int, text: str, user: str = "u", session: str = "s") -> StoredMessage:
    return StoredMessage(id=f"m{i}", user_id=user, session_id=session, role="user", content=text,
                         timestamp=float(i))


def consistent(store: SQLiteRecordStore) -> bool:
    """FTS5's integrity check (it raises on a corrupt index) and no bulk guard left behind."""
    with store.lock:
        store.conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('integrity-check', 1)")
        store.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    return store.query("SELECT count(*) FROM fts_deferred") == [(0,)]


def found(store: SQLiteRecordStore, user: str, *terms: str, session: str | None = None) -> set[str]:
    return {i for i, _ in store.keyword_search(user, list(terms), k=10_000, session_id=session)}


def test_the_best_k_are_the_head_of_the_whole_ranking(tmp_path):
    # the k best are taken from the index before their rows are read: the same rows, in order
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        store.insert_messages([msg(i, "violin " * (1 + i % 4) + "lesson" + " filler" * i, session=f"s{i % 3}")
                               for i in range(40)])
        store.insert_messages([msg(100 + i, "violin lesson", user="other") for i in range(5)])
        whole = store.keyword_search("u", ["violin", "lesson"], k=10_000)
        scores = [s for _, s in whole]
        assert len(whole) == 40 and len(set(scores)) == 40 and scores == sorted(scores, reverse=True)
        assert store.keyword_search("u", ["violin", "lesson"], k=7) == whole[:7]
        in_session = store.keyword_search("u", ["violin"], k=5, session_id="s1")
        assert len(in_session) == 5 and {i for i, _ in in_session} <= {f"m{i}" for i in range(1, 40, 3)}
    finally:
        store.close()


ODD_IDS = ["alice", "Alice", 'o"neil \'x', "two words ", "用户 é", "1q", "7", "--", " ", ""]  # "": no user


def test_users_sharing_words_find_only_their_own_rows_whatever_their_ids(tmp_path):
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        users = [u for u in ODD_IDS if u]
        store.insert_messages([msg(n * 10 + j, f"the violin lesson {j}", user=u, session=f"s{j}")
                               for n, u in enumerate(users) for j in range(3)])
        for n, u in enumerate(users):
            assert found(store, u, "violin") == {f"m{n * 10 + j}" for j in range(3)}, u
            assert found(store, u, "lesson", session="s1") == {f"m{n * 10 + 1}"}
        assert found(store, "nobody", "violin") == set() and found(store, "", "violin") == set()
        tags = {tag_of(store.conn, u) for u in users}
        assert len(tags) == len(users)
        assert not any(u in row[0] for u in users if len(u) > 2 for row in store.query("SELECT keywords FROM messages"))
        assert consistent(store)
    finally:
        store.close()


def test_bm25_and_the_common_term_rule_count_the_users_own_rows(tmp_path):
    """A word in every row of a big user is still a rare, kept, well-weighed word for another
    user in whose rows it is rare (counted over the store, it was left out for both)."""
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        store.insert_messages([msg(i, f"weather note {i}", user="big") for i in range(1500)])
        mid = [msg(2000 + i, f"a note on day {i}", user="mid") for i in range(1200)]
        mid[5] = msg(2005, "weather at the coast", user="mid")
        mid[9] = msg(2009, "the violin lesson", user="mid")
        store.insert_messages(mid)
        assert found(store, "mid", "weather", "violin") == {"m2005", "m2009"}
        assert found(store, "big", "weather", "violin") == set()  # the big user's common term is left out
        assert len(found(store, "big", "weather")) == 1500  # alone, it still matches
    finally:
        store.close()


def test_forget_user_leaves_no_tag_and_a_new_tag_later(tmp_path):
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        store.insert_messages([msg(1, "violin", user="a"), msg(2, "violin", user="b")])
        old = tag_of(store.conn, "a")
        store.forget_user("a")
        assert tag_of(store.conn, "a") is None and found(store, "a", "violin") == set()
        store.insert_messages([msg(3, "violin again", user="a")])
        assert tag_of(store.conn, "a") not in (None, old)  # tags are never reused
        assert found(store, "a", "violin") == {"m3"} and found(store, "b", "violin") == {"m2"}
        store.delete_message("b", "m2")
        store.clear_session("a", "s")
        assert found(store, "a", "violin") == set() == found(store, "b", "violin")
        assert consistent(store)
    finally:
        store.close()


# ---- the trigger guard of the bulk write ---------------------------------------------------
RAW = ("INSERT INTO messages (id, user_id, session_id, role, content, metadata, timestamp, created_at{})"
       " VALUES (?, ?, 's', 'user', ?, '{{}}', 0, 0{})")


def test_rows_written_by_other_means_stay_consistent_and_are_indexed(tmp_path):
    path = tmp_path / "r.sqlite3"
    store = SQLiteRecordStore(path)
    try:
        store.insert_messages([msg(i, f"cello practice {i}") for i in range(20)])  # a bulk write: trigger skipped
        tag = tag_of(store.conn, "u")
        assert tag is not None
        other = sqlite3.connect(path, isolation_level=None, timeout=30)  # another writer, outside insert_messages
        other.execute(RAW.format(", keywords", ", ?"), ("raw1", "u", "violin duet", keyword_text(tag, "violin duet")))
        other.execute(RAW.format("", ""), ("raw2", "u", "violin solo"))  # without keywords: indexed as empty
        assert found(store, "u", "violin") == {"raw1"}  # the trigger ran for the other writer's insert
        assert consistent(store)
        other.execute("DELETE FROM messages WHERE id IN ('raw1', 'raw2')")
        assert consistent(store) and found(store, "u", "violin") == set()
        other.execute(RAW.format("", ""), ("raw3", "u", "violin solo"))
        other.close()
    finally:
        store.close()
    store = SQLiteRecordStore(path)  # the next open computes the missing keywords
    try:
        assert found(store, "u", "violin") == {"raw3"} and len(found(store, "u", "cello")) == 20
        assert consistent(store)
        store.delete_message("u", "raw3")
        assert consistent(store)
    finally:
        store.close()


def test_rebuild_path_indexes_raw_rows_and_a_failed_bulk_write_leaves_nothing(tmp_path):
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        store.insert_messages([msg(1, "violin")])
        with store.transaction() as c:
            c.execute(RAW.format("", ""), ("raw", "v", "violin lesson"))
        assert found(store, "v", "violin") == set()
        store.reset_indexed()  # what rebuild_index starts with
        assert found(store, "v", "violin") == {"raw"}
        with pytest.raises(Exception):
            store.insert_messages([msg(2, "violin two"), msg(1, "a duplicate id")])
        assert found(store, "u", "violin") == {"m1"} and consistent(store)
        with store.transaction() as c:  # the guard rolled back with the failed write: the trigger runs
            c.execute(RAW.format(", keywords", ", ?"), ("raw2", "u", "x", keyword_text(tag_of(c, "u") or "", "violin")))
        assert found(store, "u", "violin") == {"m1", "raw2"} and consistent(store)
    finally:
        store.close()


# ---- the migration from the previous schema ----------------------------------------------------
def old_store(path: Path, rows: list[tuple[str, str, str]]) -> None:
    """A store as the code before per-user keywords wrote it: migrations 1-4, rows through
    the old triggers."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("INSERT INTO meta VALUES ('app', ?)", (APP_ID,))
    con.execute("CREATE TABLE schema_migrations (name TEXT NOT NULL, version INTEGER NOT NULL,"
                " applied_at REAL NOT NULL, PRIMARY KEY (name, version))")
    for version, step in enumerate(MIGRATIONS[:4], start=1):
        assert isinstance(step, str)
        for statement in split_sql(step):
            con.execute(statement)
        con.execute("INSERT INTO schema_migrations VALUES ('core', ?, ?)", (version, time.time()))
    con.executemany("INSERT INTO messages (id, user_id, session_id, role, content, timestamp, created_at)"
                    " VALUES (?, ?, 's', 'user', ?, 0, 0)", rows)
    con.close()


def test_a_store_of_the_previous_schema_is_upgraded_and_finds_the_same_rows(tmp_path):
    path = tmp_path / "old.sqlite3"
    words = ["violin", "garden", "tomatoes", "Lisbon", "nurse"]
    rows = [(f"{u[:1]}{i}", u, f"{words[i % 5]} and {words[(i * 3) % 5]} note {i}")
            for u in ("ann", 'b"ob é') for i in range(1200)]  # past SELECTIVE_FROM_ROWS: the counted path too
    old_store(path, rows)
    old = sqlite3.connect(path)
    before = {(u, w): {r[0] for r in old.execute(
        "SELECT m.id FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid WHERE messages_fts MATCH ?"
        " AND m.user_id = ?", ('user_id : "' + u.replace('"', '""') + f'" AND content : ("{w}")', u))}
        for u in ("ann", 'b"ob é') for w in [*words, "note"]}
    old.close()
    store = SQLiteRecordStore(path)
    try:
        assert store.schema_version() == len(MIGRATIONS)
        for (u, w), ids in before.items():
            assert ids and found(store, u, w) == ids, (u, w)  # the same rows, and only the user's
        store.insert_messages([msg(9000, "violin strings", user="ann")])
        assert "m9000" in found(store, "ann", "violin") and "m9000" not in found(store, 'b"ob é', "violin")
        assert consistent(store)
    finally:
        store.close()
