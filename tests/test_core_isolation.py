"""User isolation, and forgetting: forget, clear_session, forget_user."""

from __future__ import annotations

import sqlite3

import pytest

from tiered_memory import NotFoundError
from tiered_memory.store.sqlite_db import register_functions

ALICE = [
    {"role": "user", "content": "My cat Pixel is allergic to fish, so I feed her turkey."},
    {"role": "assistant", "content": "Turkey-based cat food is a good choice for Pixel."},
    {"role": "user", "content": "I work as a nurse on night shifts at the city hospital."},
]
BOB = [
    {"role": "user", "content": "My cat Tofu only eats salmon and sleeps all day."},
    {"role": "assistant", "content": "Salmon is fine for Tofu in moderation."},
    {"role": "user", "content": "I teach chemistry at a secondary school."},
]


@pytest.fixture
def two_users(memory):
    a = memory.add_many(ALICE, session_id="a1", user_id="alice")
    b = memory.add_many(BOB, session_id="b1", user_id="bob")
    return memory, a, b


def test_search_never_returns_another_users_memories(two_users):
    memory, a, b = two_users
    for query in ("what does my cat eat?", "salmon", "Tofu", "where do I work?"):
        alice_hits = memory.search(query, user_id="alice", k=10)
        assert alice_hits, query
        assert {h.id for h in alice_hits} <= set(a), query
        bob_hits = memory.search(query, user_id="bob", k=10)
        assert {h.id for h in bob_hits} <= set(b), query
    assert memory.search("Pixel turkey", user_id="nobody") == []


def test_same_session_id_under_two_users_stays_separate(memory):
    memory.add("user", "alice's secret plan", session_id="shared", user_id="alice")
    memory.add("user", "bob's other plan", session_id="shared", user_id="bob")
    assert [m.content for m in memory.get_messages("shared", user_id="alice")] == ["alice's secret plan"]
    ctx = memory.build_context("secret plan", user_id="bob", session_id="shared")
    assert "alice" not in ctx.to_text()


def test_build_context_holds_only_this_users_memories(two_users):
    memory, a, b = two_users
    ctx = memory.build_context("what does my cat eat?", user_id="bob", session_id="b2")
    ids = {i.id for s in ctx.sections for i in s.items} | {i.id for i in ctx.recent}
    assert ids and ids <= set(b)
    assert "Pixel" not in ctx.to_text()


def test_forget_one_memory_only_for_its_owner(two_users):
    memory, a, b = two_users
    with pytest.raises(NotFoundError):
        memory.forget(a[0], user_id="bob")
    memory.forget(a[0], user_id="alice")
    assert a[0] not in {m.id for m in memory.get_messages("a1", user_id="alice")}
    assert a[0] not in memory.index.ids("alice")
    assert a[0] not in {h.id for h in memory.search("cat allergic to fish", user_id="alice")}
    with pytest.raises(NotFoundError):
        memory.forget(a[0], user_id="alice")


def test_clear_session_removes_its_messages_and_vectors(two_users):
    memory, a, b = two_users
    memory.add("user", "a second session about gardening", session_id="a2", user_id="alice")
    assert memory.clear_session("a1", user_id="alice") == 3
    assert memory.get_messages("a1", user_id="alice") == []
    assert memory.index.ids("alice") == {memory.get_messages("a2", user_id="alice")[0].id}
    assert memory.index.ids("bob") == set(b)


def _tables_mentioning(db_path, needle: str) -> list[str]:
    """Every table (FTS shadow tables included) with a text cell containing ``needle``."""
    con = sqlite3.connect(db_path)
    register_functions(con)  # the layers' FTS5 tables read their content through a view calling it
    found = []
    try:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            for row in con.execute(f'SELECT * FROM "{table}"'):
                if any(isinstance(v, (str, bytes)) and needle.encode() in
                       (v if isinstance(v, bytes) else v.encode()) for v in row):
                    found.append(table)
                    break
    finally:
        con.close()
    return found


def test_forget_user_leaves_no_trace_in_any_store_or_index(make_memory, tmp_path):
    memory = make_memory("forget")
    memory.add_many([{"role": "user", "content": f"zanzibarquux secret number {i}",
                      "metadata": {"note": "wombatnote"}} for i in range(30)],
                    session_id="sess-quokka", user_id="user-wombat")
    keep = memory.add_many(BOB, session_id="b1", user_id="bob")
    memory.search("zanzibarquux", user_id="user-wombat")  # access counts touched too

    assert memory.forget_user("user-wombat") == 30

    assert memory.get_messages("sess-quokka", user_id="user-wombat") == []
    assert memory.search("zanzibarquux secret", user_id="user-wombat") == []
    assert memory.store.keyword_search("user-wombat", "zanzibarquux", k=10) == []
    assert memory.index.ids("user-wombat") == set()
    assert memory.index.count("user-wombat") == 0
    assert memory.index.ids() == set(keep)
    s = memory.stats()
    assert (s.users, s.messages, s.vectors) == (1, 3, 3)
    memory.close()

    db = tmp_path / "forget" / "records.sqlite3"
    for needle in ("user-wombat", "zanzibarquux", "sess-quokka", "wombatnote"):
        assert _tables_mentioning(db, needle) == [], needle
    # deleted pages are zeroed (secure_delete) and the FTS index merged, so the text is
    # not even in the file's free space
    raw = db.read_bytes()
    assert b"zanzibarquux" not in raw and b"user-wombat" not in raw
    assert not (tmp_path / "forget" / "records.sqlite3-wal").exists() or \
        b"zanzibarquux" not in (tmp_path / "forget" / "records.sqlite3-wal").read_bytes()

    again = make_memory("forget")
    assert again.index.ids("user-wombat") == set()
    assert again.stats().messages == 3


def test_forget_user_validates_the_id(memory):
    from tiered_memory import InvalidInputError

    with pytest.raises(InvalidInputError):
        memory.forget_user("")
    assert memory.forget_user("never-seen") == 0
