"""Forgetting reaches what consolidation moved: an archived turn is forgotten, cleared and
counted like a live one, and forget_user leaves no row of the user in any layer's table."""

from __future__ import annotations

import time
from typing import Callable

import pytest

from consolidation_support import NOW, build_store, count
from time_support import DAY
from tiered_memory import TieredMemory
from tiered_memory.errors import NotFoundError
from tiered_memory.store.sqlite import SQLiteRecordStore

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


LAYER_TABLES = ["facts", "fact_history", "episodes", "episode_points", "session_cursor", "working_items",
                "scratchpads", "messages_archive", "audit_log"]


def test_forget_and_clear_session_reach_archived_turns(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("archive")
    info = build_store(memory, sessions=30, templates=1)
    memory.consolidate("u1")
    archived = [sid for _, sid, end in info["episodes"] if end < NOW - 30 * DAY]
    assert len(archived) >= 2 and memory.get_messages(archived[0], user_id="u1") == []
    one = info["sessions"][archived[0]][0]
    assert count(memory, "SELECT COUNT(*) FROM messages_archive WHERE id=?", one) == 1
    memory.forget(one, user_id="u1")  # only in the archive now: forgotten there, not NotFoundError
    assert count(memory, "SELECT COUNT(*) FROM messages_archive WHERE id=?", one) == 0
    with pytest.raises(NotFoundError):
        memory.forget(one, user_id="u1")
    whole = info["sessions"][archived[1]]
    assert memory.clear_session(archived[1], user_id="u1") == len(whole)
    assert count(memory, "SELECT COUNT(*) FROM messages_archive WHERE session_id=?", archived[1]) == 0
    assert count(memory, "SELECT COUNT(*) FROM messages_archive") > 0  # the other sessions' stay


def test_forget_user_removes_every_layer_row(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("forget")
    build_store(memory, "u1", sessions=40, templates=1)
    build_store(memory, "u2", sessions=10, templates=1, seed=3)
    memory.working_memory("s-live", user_id="u1").scratchpad["k"] = "v"
    memory.add("user", "I live in Oslo and I love skiing.", session_id="fresh", user_id="u1")
    memory.end_session("fresh", user_id="u1")
    memory.consolidate("u1")
    before = {t: count(memory, f"SELECT COUNT(*) FROM {t} WHERE user_id='u1'") for t in LAYER_TABLES}
    assert all(before.values()), before  # every table had rows for u1
    u2_before = {t: count(memory, f"SELECT COUNT(*) FROM {t} WHERE user_id='u2'") for t in LAYER_TABLES}
    memory.forget_user("u1")
    after = {t: count(memory, f"SELECT COUNT(*) FROM {t} WHERE user_id='u1'") for t in LAYER_TABLES}
    assert after == {t: 0 for t in LAYER_TABLES}
    assert {t: count(memory, f"SELECT COUNT(*) FROM {t} WHERE user_id='u2'") for t in LAYER_TABLES} == u2_before
    if isinstance(memory.store, SQLiteRecordStore):  # FTS5 keeps its own copy of the text; PostgreSQL's is in the row
        assert count(memory, "SELECT COUNT(*) FROM facts_fts WHERE facts_fts MATCH 'Oslo'") == 0
        assert count(memory, "SELECT COUNT(*) FROM episode_points_fts WHERE episode_points_fts MATCH 'Oslo'") == 0
    assert memory.index.ids("u1") == set()
    assert memory.facts("u1") == [] and memory.episodes("u1") == []


def test_forget_user_counts_the_archived_turns_it_removes(make_memory: Callable[..., TieredMemory]) -> None:
    """As clear_session's count does: an archived turn is a message removed too."""
    memory = make_memory("count")
    old = time.time() - 90 * DAY
    memory.add_many([{"role": "user", "content": "I live in Lisbon.", "timestamp": old},
                     {"role": "assistant", "content": "Noted.", "timestamp": old + 5}], session_id="old", user_id="u1")
    memory.add("user", "And now I live in Porto.", session_id="new", user_id="u1")
    assert memory.consolidate("u1").archived_messages == 2
    assert memory.forget_user("u1") == 3
