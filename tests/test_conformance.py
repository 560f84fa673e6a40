"""Record store conformance: every record store passes the same tests.

A new backend proves itself by subclassing :class:`RecordStoreConformance` and providing one
fixture that opens it (vector indexes: ``test_vector_conformance.py``).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory.errors import StoreError
from tiered_memory.recall.query import keywords
from tiered_memory.store.base import (DUPLICATES_PART, LONG_MESSAGE_CHARS, LongMessageSource, PositionSource,
                                      RecordStore)
from tiered_memory.types import StoredMessage

OpenStore = Callable[[], Any]


def msg(mid: str, content: str, *, user: str = "u1", session: str = "s1", t: float = 0.0,
        role: str = "user", metadata: dict[str, Any] | None = None) -> StoredMessage:
    return StoredMessage(id=mid, user_id=user, session_id=session, role=role, content=content,
                         timestamp=t, metadata=metadata or {})


# ---------------------------------------------------------------------------
# record stores
# ---------------------------------------------------------------------------
class RecordStoreConformance:
    """Subclasses provide ``open_store``: a function opening the same store each call."""

    @pytest.fixture
    def store(self, open_store: OpenStore) -> Any:
        s = open_store()
        yield s
        s.close()

    def test_messages_come_back_in_insertion_order_and_limit_keeps_the_last(self, store: RecordStore) -> None:
        store.insert_messages([msg(f"m{i}", f"message {i}", t=float(100 - i)) for i in range(5)])
        store.insert_messages([msg("other", "other session", session="s2")])
        assert [m.id for m in store.get_messages("u1", "s1")] == ["m0", "m1", "m2", "m3", "m4"]
        assert [m.id for m in store.get_messages("u1", "s1", limit=2)] == ["m3", "m4"]
        assert store.get_messages("u2", "s1") == []

    def test_has_long_messages_is_per_user_and_follows_deletes(self, store: RecordStore) -> None:
        assert isinstance(store, LongMessageSource)
        store.insert_messages([msg("short", "x" * LONG_MESSAGE_CHARS), msg("theirs", "é" * (LONG_MESSAGE_CHARS + 1),
                                                                          user="u2")])
        assert not store.has_long_messages("u1")  # characters, not bytes: "é" is two in UTF-8
        assert store.has_long_messages("u2")
        store.insert_messages([msg("long", "y" * (LONG_MESSAGE_CHARS + 1))])
        assert store.has_long_messages("u1")
        store.delete_message("u1", "long")
        assert not store.has_long_messages("u1")

    def test_round_trip_keeps_every_field(self, store: RecordStore) -> None:
        meta = {"lang": "pt", "nested": {"a": [1, 2.5, None]}, "emoji": "😀", "nul": "a\x00b"}
        store.insert_messages([msg("m1", "Olá, moro em Lisboa 😀", role="assistant", t=1234.5, metadata=meta)])
        got = store.get_by_ids("u1", ["m1"])["m1"]
        assert (got.user_id, got.session_id, got.role, got.content, got.timestamp, got.metadata) == (
            "u1", "s1", "assistant", "Olá, moro em Lisboa 😀", 1234.5, meta)

    def test_a_failed_batch_writes_nothing(self, store: RecordStore) -> None:
        store.insert_messages([msg("m1", "first")])
        with pytest.raises(StoreError):
            store.insert_messages([msg("m2", "second"), msg("m1", "clashes with an existing id")])
        assert [m.id for m in store.get_messages("u1", "s1")] == ["m1"]

    def test_get_by_ids_is_scoped_to_the_user(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "mine"), msg("b", "theirs", user="u2")])
        assert set(store.get_by_ids("u1", ["a", "b", "missing", "a"])) == {"a"}
        assert set(store.get_by_ids("u2", ["a", "b"])) == {"b"}

    def test_keyword_search_ranks_matches_best_first_within_user_and_session(self, store: RecordStore) -> None:
        store.insert_messages([
            msg("both", "My cats love the garden in Lisbon"),
            msg("one", "Lisbon is sunny"),
            msg("none", "Completely unrelated text"),
            msg("other-session", "cats and Lisbon again", session="s2"),
            msg("other-user", "cats garden Lisbon", user="u2"),
        ])
        match = keywords("cat garden Lisbon")
        assert match is not None
        hits = store.keyword_search("u1", match, k=10)
        ids = [i for i, _ in hits]
        assert set(ids) == {"both", "one", "other-session"}
        assert ids.index("both") < ids.index("one")
        scores = [s for _, s in hits]
        assert scores == sorted(scores, reverse=True)
        assert {i for i, _ in store.keyword_search("u1", match, k=10, session_id="s1")} == {"both", "one"}
        assert len(store.keyword_search("u1", match, k=1)) == 1
        nothing = keywords("zebra")
        assert nothing is not None and store.keyword_search("u1", nothing, k=10) == []

    def test_neighbors_are_the_surrounding_messages_of_the_same_session(self, store: RecordStore) -> None:
        for i in range(6):  # interleave another session, and another user's same-named session
            store.insert_messages([msg(f"m{i}", f"turn {i}"), msg(f"x{i}", f"noise {i}", session="s2"),
                                   msg(f"y{i}", f"theirs {i}", user="u2")])
        got = store.neighbors("u1", ["m3", "m0", "x0", "y1", "nope"], 1)
        assert [m.id for m in got["m3"]] == ["m2", "m3", "m4"]
        assert [m.id for m in got["m0"]] == ["m0", "m1"]
        assert [m.id for m in got["x0"]] == ["x0", "x1"]
        assert got["y1"] == [] and got["nope"] == []  # another user's id, an unknown id
        assert [m.id for m in store.neighbors("u1", ["m3"], 2)["m3"]] == ["m1", "m2", "m3", "m4", "m5"]
        assert store.neighbors("u2", ["m3"], 1)["m3"] == []
        assert [m.id for m in store.neighbors("u2", ["y5"], 1)["y5"]] == ["y4", "y5"]

    def test_session_gaps_count_the_sessions_own_messages_between_two(self, store: RecordStore) -> None:
        assert isinstance(store, PositionSource)
        for i in range(6):  # interleave another session, and another user's same-named session
            store.insert_messages([msg(f"m{i}", f"turn {i}"), msg(f"x{i}", f"noise {i}", session="s2"),
                                   msg(f"y{i}", f"theirs {i}", user="u2")])
        seq = {m.id: m.seq for m in [*store.get_messages("u1", "s1"), *store.get_messages("u1", "s2")]}
        got = store.session_gaps("u1", [("s1", seq["m1"], seq["m4"]), ("s2", seq["x0"], seq["x5"]),
                                        ("s1", seq["m4"], seq["m1"]), ("gone", 0, 10**9), ("s1", seq["m2"], seq["m3"])])
        assert got == [3, 5, 0, 0, 1]  # m2, m3, m4 after m1 whatever came between them; x1..x5; ...
        assert store.session_gaps("u2", [("s2", seq["x0"], seq["x5"])]) == [0]  # u2 has no s2: u1's x* never count
        assert store.session_gaps("u1", []) == []
        many = [("s1", seq["m0"], seq["m5"])] * 700  # more pairs than one statement takes
        assert store.session_gaps("u1", many) == [5] * 700

    def test_index_bookkeeping(self, store: RecordStore) -> None:
        store.insert_messages([msg(f"m{i}", f"text {i}") for i in range(4)])
        assert [m.id for m in store.pending_index(3)] == ["m0", "m1", "m2"]
        store.mark_indexed(["m0", "m1", "m2"], {"m2": "m0"})
        assert [m.id for m in store.pending_index(10)] == ["m3"]
        assert store.indexed_ids() == {"m0", "m1"}
        store.insert_messages([msg("o0", "other user", user="u2"), msg("o1", "other session", session="s2")])
        store.mark_indexed(["o0", "o1"], {})
        assert store.indexed_ids("u1") == {"m0", "m1", "o1"} and store.indexed_ids("u2") == {"o0"}
        assert store.indexed_ids("u1", "s1") == {"m0", "m1"} and store.indexed_ids("u9") == set()
        store.delete_message("u2", "o0")
        store.delete_message("u1", "o1")
        assert store.counts()["duplicates"] == 1
        store.reset_indexed_ids(["m1"])
        assert [m.id for m in store.pending_index(10)] == ["m1", "m3"]
        store.reset_indexed()
        assert len(store.pending_index(10)) == 4 and store.indexed_ids() == set()

    def test_rows_stored_already_indexed(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "first"), msg("b", "first again"), msg("c", "other user", user="u2")],
                              indexed=True, duplicates={"b": "a"})
        store.insert_messages([msg("d", "pending")])
        assert [m.id for m in store.pending_index(10)] == ["d"]
        assert store.indexed_ids("u1") == {"a"} and store.indexed_ids("u2") == {"c"}
        assert store.counts()["duplicates"] == 1
        store.reset_indexed_ids(["a"])
        assert [m.id for m in store.pending_index(10)] == ["a", "d"]

    def test_a_commit_without_sync_is_stored_and_sync_makes_it_durable(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "not waited for")], sync=False)
        store.sync()
        store.insert_messages([msg("b", "waited for")])
        store.sync()  # nothing left to sync is no error
        assert [m.id for m in store.get_messages("u1", "s1")] == ["a", "b"]

    def test_existing_ids_are_global(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "x"), msg("b", "y", user="u2")])
        assert store.existing_ids(["a", "b", "c"]) == {"a", "b"}
        assert store.existing_ids([]) == set()

    def test_deletes(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "x"), msg("b", "y"), msg("c", "z", session="s2"),
                               msg("d", "w", user="u2")])
        assert store.delete_message("u2", "a") is False  # not the owner
        assert store.delete_message("u1", "a") is True
        assert store.delete_message("u1", "a") is False
        assert store.clear_session("u1", "s1") == ["b"]
        store.insert_messages([msg("e", "v", session="s3")])
        assert sorted(store.forget_user("u1")) == ["c", "e"]
        assert [m.id for m in store.iter_messages()] == ["d"]

    def test_a_removal_marks_the_users_duplicates_of_the_removed_turns_pending(self, store: Any) -> None:
        """delete_message, clear_session and consolidate's archive mark the user's duplicates of
        what they remove pending, in their own transaction: a crash before the release indexes
        them again leaves them to the next open, which indexes pending turns."""
        store.insert_messages([msg("a", "x"), msg("b", "y"), msg("keep", "w"), msg("c", "z", session="s2"),
                               msg("da", "x", session="s3"), msg("db", "y", session="s3"),
                               msg("dk", "w", session="s3"), msg("dc", "z", session="s3"),
                               msg("theirs", "x", user="u2")])
        store.mark_indexed(["a", "b", "keep", "c", "da", "db", "dk", "dc", "theirs"],
                           {"da": "a", "db": "b", "dk": "keep", "dc": "c", "theirs": "a"})

        def pending() -> list[str]:
            return [m.id for m in store.pending_index(20)]

        assert pending() == []
        assert store.delete_message("u1", "a")
        assert pending() == ["da"]  # not u2's row, though it names the same id
        assert store.clear_session("u1", "s1") == ["b", "keep"]
        assert pending() == ["da", "db", "dk"]
        from tiered_memory.backends import open_layer_store

        with open_layer_store(store).unit() as u:
            assert u.archive_messages("u1", ["c"], "ep1", 1.0, delete=False) == 1
        assert pending() == ["da", "db", "dk", "dc"]

    def test_duplicates_are_read_in_scope_or_by_original(self, store: Any) -> None:
        """DuplicateScope.duplicates: the user's, of a session, or of given originals alone (a
        search of sessions reads those of the turns it found, in parts of DUPLICATES_PART)."""
        many = DUPLICATES_PART + 20
        store.insert_messages([msg("a", "x"), msg("b", "y", session="s2"), msg("theirs", "x", user="u2"),
                               msg("da", "x", session="s2"), msg("db", "y", session="s2"), msg("da2", "x"),
                               msg("theirs2", "x", user="u2"), *[msg(f"o{i}", f"o {i}") for i in range(many)]],
                              indexed=True, duplicates={"da": "a", "db": "b", "da2": "a", "theirs2": "theirs"})
        every = {"da": ("a", True), "db": ("b", False), "da2": ("a", False)}
        assert store.duplicates("u1") == every and store.duplicates("u2") == {"theirs2": ("theirs", False)}
        assert store.duplicates("u1", "s2") == {"da": ("a", True), "db": ("b", False)}
        assert store.duplicates("u1", originals=["a"]) == {"da": ("a", True), "da2": ("a", False)}
        assert store.duplicates("u1", "s1", originals=["a", "b"]) == {"da2": ("a", False)}
        assert store.duplicates("u1", originals=["theirs", "zzz"]) == {}  # another user's original: not u1's
        assert store.duplicates("u1", originals=[]) == {}
        # more originals than one statement takes: "b" is in the last part
        assert store.duplicates("u1", originals=[*(f"o{i}" for i in range(many)), "b"]) == {"db": ("b", False)}

    def test_duplicates_are_read_under_filters(self, store: Any) -> None:
        """DuplicateScope.duplicates with filters: the duplicates whose own role, time and metadata
        match (as filtered_ids reads them), whatever their original's; with a session and with
        originals too. A filtered search reads those alone, not every duplicate of the user."""
        store.insert_messages([
            msg("a", "x", metadata={"k": "v"}), msg("b", "y", session="s2", role="assistant"),
            msg("da", "x", session="s2", t=10, metadata={"k": "v", "n": 1}),
            msg("db", "y", session="s2", t=20, role="assistant", metadata={"flag": True}),
            msg("da2", "x", t=30, metadata={"k": "w", "n": 0}), msg("theirs", "x", user="u2"),
            msg("theirs2", "x", user="u2", metadata={"k": "v"})],
            indexed=True, duplicates={"da": "a", "db": "b", "da2": "a", "theirs2": "theirs"})
        every = store.duplicates("u1")
        assert len(every) == 3 and store.duplicates("u1", filters={}) == every

        def under(filters: dict[str, Any], session: str | None = None, originals: list[str] | None = None) -> set[str]:
            return set(store.duplicates("u1", session, originals=originals, filters=filters))

        assert store.duplicates("u1", filters={"k": "v"}) == {"da": ("a", True)}  # the original matches too
        assert under({"k": "w"}) == {"da2"} and under({"role": "assistant"}) == {"db"}
        assert under({"since": 15}) == {"db", "da2"} and under({"since": 5, "until": 25}) == {"da", "db"}
        assert under({"flag": 1}) == {"db"} and under({"n": True}) == {"da"} and under({"n": False}) == {"da2"}
        assert under({"k": None}) == {"db"} and under({"k": "zzz"}) == set()
        assert under({"k": "v"}, "s1") == set() and under({"k": "v"}, "s2") == {"da"}
        assert under({"k": "w"}, originals=["a"]) == {"da2"} and under({"k": "w"}, originals=["b"]) == set()
        assert store.duplicates("u2", filters={"k": "v"}) == {"theirs2": ("theirs", False)}
        for filters in ({"k": "v"}, {"role": "user"}, {"until": 10}, {"n": 1}, {"k": None}, {"k": "w", "n": 0}):
            assert under(filters) == set(every) & set(store.filtered_ids("u1", filters, limit=100)), filters

    def test_iter_messages_pages_through_everything_in_order(self, store: RecordStore) -> None:
        rows = [msg(f"m{i:04d}", f"t{i}", user="u1" if i % 3 else "u2") for i in range(1205)]
        store.insert_messages(rows)
        assert [m.id for m in store.iter_messages()] == [r.id for r in rows]
        assert [m.id for m in store.iter_messages("u2")] == [r.id for r in rows if r.user_id == "u2"]

    def test_counts(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "x"), msg("b", "y", session="s2"), msg("c", "z", user="u2")])
        store.mark_indexed(["a"], {})
        assert store.counts() == {"users": 2, "sessions": 3, "messages": 3, "indexed": 1, "duplicates": 0}

    def test_sessions_list_a_users_sessions_in_the_order_they_started(self, store: RecordStore) -> None:
        store.insert_messages([msg("a", "x", session="late", t=50.0), msg("b", "y", session="early", t=10.0),
                               msg("c", "z", session="late", t=70.0), msg("d", "w", user="u2", session="other")])
        got = [(s.session_id, s.messages, s.first, s.last) for s in store.sessions("u1")]
        assert got == [("late", 2, 50.0, 70.0), ("early", 1, 10.0, 10.0)]
        assert store.sessions("nobody") == []

    def test_meta_is_set_overwritten_and_persistent(self, store: RecordStore, open_store: OpenStore) -> None:
        assert store.get_meta("k") is None
        store.set_meta("k", "1")
        store.set_meta("k", "2")
        again = open_store()
        try:
            assert again.get_meta("k") == "2"
        finally:
            again.close()

    def test_meta_changes_made_at_once_are_all_kept(self, store: RecordStore) -> None:
        def add_one(raw: str | None) -> str:
            return str(int(raw or 0) + 1)

        threads = [threading.Thread(target=lambda: [store.change_meta("n", add_one) for _ in range(25)])
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.get_meta("n") == "100"
        assert store.change_meta("n", lambda raw: f"{raw}!") == "100!" == store.get_meta("n")

    def test_data_survives_reopening(self, store: RecordStore, open_store: OpenStore) -> None:
        store.insert_messages([msg("a", "persistent cats")])
        store.close()
        again = open_store()
        try:
            assert [m.id for m in again.get_messages("u1", "s1")] == ["a"]
            match = keywords("cats")
            assert match is not None and [i for i, _ in again.keyword_search("u1", match, k=5)] == ["a"]
        finally:
            again.close()

    def test_migrate_applies_each_step_once(self, store: Any, open_store: OpenStore) -> None:
        create = "CREATE TABLE conformance_extra (id TEXT PRIMARY KEY);"  # fails if run twice
        store.migrate("conformance", [create])
        store.migrate("conformance", [create])
        store.migrate("conformance", [create, "ALTER TABLE conformance_extra ADD COLUMN n INTEGER;"])
        again = open_store()
        try:
            again.migrate("conformance", [create, "ALTER TABLE conformance_extra ADD COLUMN n INTEGER;"])
        finally:
            again.close()
        assert store.query("SELECT COUNT(*) FROM conformance_extra") == [(0,)]
        assert store.schema_version("conformance") == 2
        assert store.query("SELECT version FROM schema_migrations WHERE name='conformance'"
                           " ORDER BY version") == [(1,), (2,)]  # the version table, one row per step

    def test_concurrent_writers_lose_nothing(self, store: RecordStore) -> None:
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                for b in range(10):
                    store.insert_messages([msg(f"w{w}-{b}-{i}", f"text {w} {b} {i}", user=f"u{w % 2}")
                                           for i in range(5)])
                    store.mark_indexed([f"w{w}-{b}-{i}" for i in range(5)], {})
            except BaseException as e:  # surfaced below
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert store.counts()["messages"] == 200 and store.counts()["indexed"] == 200
        assert len({m.id for m in store.iter_messages()}) == 200


class TestSQLiteRecordStore(RecordStoreConformance):
    @pytest.fixture
    def open_store(self, tmp_path: Path) -> OpenStore:
        from tiered_memory.store.sqlite import SQLiteRecordStore

        return lambda: SQLiteRecordStore(tmp_path / "records.sqlite3")

    def test_migrate_applies_the_steps_of_one_call_all_or_none(self, store: Any, open_store: OpenStore) -> None:
        """One transaction for a call's pending steps (one commit, not one a step, for a new
        store's 28): a step that fails leaves none of the call's steps, and no version of them."""
        steps = ["CREATE TABLE conformance_a (id TEXT PRIMARY KEY);", "CREATE TABLE conformance_b (id TEXT);",
                 "INSERT INTO no_such_table VALUES (1);", "CREATE TABLE conformance_c (id TEXT);"]
        store.migrate("conformance", steps[:1])
        with pytest.raises(StoreError, match="no_such_table"):
            store.migrate("conformance", steps)
        tables = {r[0] for r in store.query("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "conformance_a" in tables and not {"conformance_b", "conformance_c"} & tables
        assert store.schema_version("conformance") == 1
        store.migrate("conformance", [*steps[:2], "SELECT 1", steps[3]])  # fixed: every pending step runs
        assert store.schema_version("conformance") == 4


@pytest.fixture(scope="module")
def _conformance_database(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("make_postgres_url")())


@pytest.mark.servers
class TestPostgresRecordStore(RecordStoreConformance):
    @pytest.fixture
    def open_store(self, _conformance_database: str) -> OpenStore:
        from tiered_memory.store.postgres import PostgresRecordStore

        schema = "t_" + uuid.uuid4().hex[:12]  # one schema per test: cheaper than a database
        return lambda: PostgresRecordStore(_conformance_database, schema=schema)


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT 1 FROM t WHERE a=? AND b IN (?,?)", "SELECT 1 FROM t WHERE a=%s AND b IN (%s,%s)"),
    ("SELECT '100%' FROM t WHERE a=?", "SELECT '100%%' FROM t WHERE a=%s"),
    ("SELECT 1", "SELECT 1"),
])
def test_layer_sql_placeholders_become_psycopg_ones(sql: str, expected: str) -> None:
    from tiered_memory.store.postgres_layers import qmark_to_format

    assert qmark_to_format(sql) == expected
