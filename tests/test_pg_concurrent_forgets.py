"""Two workers forgetting two users at once on one PostgreSQL store. Each records its user in
the store's list of unfinished deletions before it starts and takes it off once done, so a
worker killed half-way has the deletion finished by the next open; neither change may undo
the other's (a lost mark leaves a half-deleted user, a mark left behind erases that user's
later writes at the next open).

The interleaving is forced, not hoped for: a second connection holds the rows the workers
wait on (the list's row, the users' messages) until both wait there.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.store.pending_deletes import PENDING_DELETIONS as PENDING_FORGETS

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]  # a hang fails instead of blocking the suite


def wait_for_waiters(url: str, n: int, condition: str = "true") -> None:
    """Poll until ``n`` backends of the database wait for a lock (and meet ``condition``)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           f" AND wait_event_type = 'Lock' AND {condition}").fetchone()[0] < n:  # type: ignore[index]
            conn.execute("SELECT pg_sleep(0.02)")


def pending(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SELECT value FROM tiered_memory.meta WHERE key = %s", (PENDING_FORGETS,)).fetchone()
    return sorted(json.loads(found[0])) if found else []


def hold_meta(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1 FROM tiered_memory.meta WHERE key = %s FOR UPDATE", (PENDING_FORGETS,))


def test_two_workers_forgetting_two_users_at_once_record_both_and_clear_both(
        make_postgres_url: Callable[[], str], tmp_path: Path) -> None:
    url = make_postgres_url()
    one = TieredMemory(tmp_path / "one", record_store=url, embedder=StaticEmbedder())
    two = TieredMemory(tmp_path / "two", record_store=url, embedder=StaticEmbedder())
    try:
        one.add("user", "I keep bees on the roof", user_id="ana", session_id="s")
        two.add("user", "I sail on weekends", user_id="bo", session_id="s")
        one.forget_user("nobody")  # the list's row exists (empty), so a row lock can hold its writers
        assert pending(url) == []
        outcome: dict[str, Any] = {}

        def forget(memory: TieredMemory, user: str) -> None:
            try:
                outcome[user] = memory.forget_user(user)
            except BaseException as e:  # surfaced below
                outcome[user] = e

        with psycopg.connect(url) as meta, psycopg.connect(url) as rows:
            hold_meta(meta)
            rows.execute("SELECT 1 FROM tiered_memory.messages WHERE user_id IN ('ana', 'bo') FOR UPDATE")
            threads = [threading.Thread(target=forget, args=(m, u)) for m, u in ((one, "ana"), (two, "bo"))]
            for t in threads:
                t.start()
            wait_for_waiters(url, 2)  # both about to record their user
            meta.commit()
            wait_for_waiters(url, 2, "query LIKE 'DELETE FROM messages%'")  # both recorded, deleting
            assert pending(url) == ["ana", "bo"]
            hold_meta(meta)
            rows.commit()
            wait_for_waiters(url, 2, "query NOT LIKE 'DELETE FROM messages%'")  # both deleted, about to clear
            meta.commit()
            for t in threads:
                t.join(timeout=120)  # the hang guard, not a timing assertion
        assert outcome == {"ana": 1, "bo": 1}
        assert pending(url) == []
    finally:
        one.close()
        two.close()
