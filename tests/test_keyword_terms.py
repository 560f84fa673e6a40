"""SQLite keyword search leaves out the terms most of a user's rows hold (store/text_search.py):
a pure rule with a table test, the counts it reads, and the search on a real store."""

from __future__ import annotations

import pytest

from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_keywords import tag_of
from tiered_memory.store.text_search import TermCounts, selective_terms, tagged_phrases
from tiered_memory.types import StoredMessage


@pytest.mark.parametrize("terms, df, rows, expected", [
    (["rare", "common"], {"rare": 3, "common": 5000}, 10_000, ["rare"]),
    (["rare", "common"], {"rare": 3, "common": 1000}, 10_000, ["rare", "common"]),  # exactly the share: kept
    (["common", "also"], {"common": 5000, "also": 4000}, 10_000, ["common", "also"]),  # none left: keep all
    (["rare", "common"], {"rare": 3, "common": 900}, 999, ["rare", "common"]),  # a small store keeps all
    (["unseen"], {}, 10_000, ["unseen"]),
    ([], {}, 10_000, []),
])
def test_selective_terms(terms, df, rows, expected):
    assert selective_terms(terms, df, rows) == expected


def test_term_counts_count_once_and_again_after_growth():
    calls: list[str] = []
    counts = TermCounts(lambda t: calls.append(t) or len(calls))
    assert counts.of(["a", "b"], rows=1000) == {"a": 1, "b": 2}
    assert counts.of(["a"], rows=1200) == {"a": 1} and calls == ["a", "b"]  # within a quarter: cached
    assert counts.of(["a"], rows=1400) == {"a": 3}  # grown past a quarter: counted again


def msg(i: int, text: str, user: str = "u") -> StoredMessage:
    return StoredMessage(id=f"m{i}", user_id=user, session_id="s", role="user", content=text, timestamp=float(i))


def test_a_common_term_no_longer_brings_its_rows_but_a_rare_one_does(tmp_path):
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        n = 1500
        rows = [msg(i, f"weather note {i}") for i in range(n - 2)]  # "weather" is in nearly every row
        rows += [msg(n - 2, "the violin lesson moved to Friday"), msg(n - 1, "weather for the violin trip")]
        store.insert_messages(rows)
        found = [i for i, _ in store.keyword_search("u", ["weather", "violin"], k=50)]
        assert sorted(found) == [f"m{n - 2}", f"m{n - 1}"]  # the rare term's rows, not 50 of the common one's
        assert len(store.keyword_search("u", ["weather"], k=50)) == 50  # alone, a common term still matches
    finally:
        store.close()



def test_a_small_user_in_a_big_store_keeps_every_term_and_counts_none(tmp_path):
    """A user below SELECTIVE_FROM_ROWS rows searches with all their terms, whatever the
    store holds, and costs no count of a term over the whole store."""
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        store.insert_messages([msg(i, f"weather note {i}", user="big") for i in range(1500)])
        store.insert_messages([msg(2000, "weather at the coast", user="small"),
                               msg(2001, "the violin lesson", user="small"),
                               msg(2002, "weather for the violin trip", user="small")])
        counted: list[str] = []
        store._keywords.term_counts = TermCounts(lambda t: counted.append(t) or 0)
        found = {i for i, _ in store.keyword_search("small", ["weather", "violin"], k=10)}
        assert found == {"m2000", "m2001", "m2002"} and counted == []
        big = [i for i, _ in store.keyword_search("big", ["weather", "violin"], k=10)]
        tag = tag_of(store.conn, "big")
        assert tag is not None and tag != tag_of(store.conn, "small")
        assert len(big) == 10 and counted == tagged_phrases(tag, ["weather", "violin"])  # the big user's own terms
    finally:
        store.close()

# ---- the keyword index keeps each user's words apart (store/sqlite_keywords.py) ----
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tiered_memory.validation import check_id  # noqa: E402


def valid_id(text: str) -> bool:
    try:
        check_id(text, "user_id")
    except Exception:
        return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=st.text(min_size=1, max_size=12).filter(valid_id), other=st.text(min_size=1, max_size=12).filter(valid_id))
def test_any_user_id_finds_its_own_rows_and_never_anothers(tmp_path_factory, user, other):
    store = SQLiteRecordStore(tmp_path_factory.mktemp("ids") / "r.sqlite3")
    try:
        store.insert_messages([msg(1, "the violin lesson", user=user), msg(2, "the violin lesson", user=other)
                               if other != user else msg(2, "a piano lesson", user=user)])
        found = {i for i, _ in store.keyword_search(user, ["violin"], k=10)}
        assert found == {"m1"}
    finally:
        store.close()


def test_one_term_given_as_a_string_is_one_term_in_a_large_store(tmp_path):
    """A caller may pass a single term as a string: it must not be read as its characters
    (the common-term rule counted each letter as a term, found in most rows)."""
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    try:
        store.insert_messages([msg(i, f"note {i} zq{i}x") for i in range(1200)]
                              + [msg(2000 + i, "z q 7 8 x") for i in range(50)])  # each letter a word
        assert [i for i, _ in store.keyword_search("u", '"zq7x"', k=2)] == ["m7"]
        assert [i for i, _ in store.keyword_search("u", "zq8x", k=2)] == ["m8"]
    finally:
        store.close()
