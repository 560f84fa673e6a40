"""Two workers writing one session of a PostgreSQL store while a third ends it. A message's
``seq`` is drawn when its row is inserted, not when its transaction commits, so one worker's
turn could commit after another's with a higher ``seq``; ``end_session`` moves the session's
coverage cursor to the highest ``seq`` it read, and a turn committed under the cursor later
was never summarised (no episode, no facts; nothing looks below the cursor again).

The interleaving is forced, not hoped for: a second connection holds a message id one
worker's batch also stores, so that batch waits with its first turn inserted and not yet
committed while the other worker stores a turn of the session and ends it.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

from tiered_memory import Episode, StaticEmbedder, TieredMemory
from tiered_memory.testing import HeldEmbedder

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]  # a hang fails instead of blocking the suite


def started(url: str, call: Callable[[], object], waiting: int, outcome: dict[str, Any],
            name: str) -> threading.Thread:
    """``call`` in a thread, returned once it has finished or ``waiting`` backends wait for a lock."""
    def run() -> None:
        try:
            call()
        except BaseException as e:  # surfaced by the test
            outcome[name] = e

    thread = threading.Thread(target=run)
    thread.start()
    with psycopg.connect(url, autocommit=True) as conn:
        while thread.is_alive() and conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'").fetchone()[0] < waiting:  # type: ignore[index]
            conn.execute("SELECT pg_sleep(0.02)")
    return thread


def test_a_turn_committed_after_another_workers_later_turn_is_summarised(
        make_postgres_url: Callable[[], str], tmp_path: Path) -> None:
    url = make_postgres_url()
    one = TieredMemory(tmp_path / "one", record_store=url, embedder=StaticEmbedder())
    two = TieredMemory(tmp_path / "two", record_store=url, embedder=StaticEmbedder())
    try:
        one.add("user", "I moved to Lisbon last spring", user_id="ana", session_id="s")
        outcome: dict[str, Any] = {}
        with psycopg.connect(url) as holder:  # a transaction holding the id "held", uncommitted
            holder.execute("INSERT INTO tiered_memory.messages (id, user_id, session_id, role, content,"
                           " timestamp, created_at) VALUES ('held', 'ana', 's', 'user', 'x', 0, 0)")
            batch = [{"role": "user", "content": "I keep bees on the roof"},
                     {"role": "assistant", "content": "Bees need water nearby", "id": "held"}]
            threads = [  # the bees turn is inserted, its seq drawn; its batch waits on "held"
                started(url, lambda: one.add_many(batch, user_id="ana", session_id="s"), 1, outcome, "one"),
                started(url, lambda: two.add("user", "I sail on weekends", user_id="ana", session_id="s"),
                        2, outcome, "add"),
                started(url, lambda: two.end_session("s", user_id="ana"), 3, outcome, "end")]
            holder.rollback()
            for t in threads:
                t.join()
        assert outcome == {}
        one.end_session("s", user_id="ana")
        stored = {m.id for m in one.get_messages("s", user_id="ana")}
        covered = {i for ep in one.episodes("ana", "s") for i in ep.source_ids}
        assert len(stored) == 4
        assert stored - covered == set(), "turns no episode covers"
    finally:
        one.close()
        two.close()


@pytest.mark.parametrize("saves_first", ["one", "two"])
def test_two_workers_ending_a_session_cover_each_turn_once(make_postgres_url: Callable[[], str],
                                                           tmp_path: Path, saves_first: str) -> None:
    """One worker reads the session's turns and is held before it writes its episode; a turn
    commits; the other worker reads every turn and is held too. When the first writes first,
    the second's episode covered the first's turns again (it checked only that its own last
    turn was not covered yet): it writes one of the new turn alone. When the second writes
    first, the first returns its episode."""
    url = make_postgres_url()
    held = {name: HeldEmbedder(StaticEmbedder()) for name in ("one", "two")}
    one = TieredMemory(tmp_path / "one", record_store=url, embedder=held["one"])
    two = TieredMemory(tmp_path / "two", record_store=url, embedder=held["two"])
    try:
        one.add_many([{"role": "user", "content": "I moved to Lisbon last spring"},
                      {"role": "assistant", "content": "How do you like it?"}], user_id="ana", session_id="s")
        ended: dict[str, Any] = {}

        def end(name: str, memory: TieredMemory) -> threading.Thread:
            def run() -> None:
                try:
                    ended[name] = memory.end_session("s", user_id="ana")
                except BaseException as e:  # surfaced by the test
                    ended[name] = e
            held[name].hold()  # its first embedding (of what it read) waits for release()
            thread = threading.Thread(target=run)
            thread.start()
            assert held[name].entered.wait(60), f"{name} never embedded what it read"
            return thread

        first = end("one", one)  # read the two turns
        two.add("user", "I sail on weekends", user_id="ana", session_id="s")
        second = end("two", two)  # read the three
        threads = {"one": first, "two": second}
        for name in ("one", "two") if saves_first == "one" else ("two", "one"):
            held[name].release()
            threads[name].join()
        assert all(isinstance(e, Episode) for e in ended.values()), ended
        stored = [m.id for m in one.get_messages("s", user_id="ana")]
        episodes = one.episodes("ana", "s")
        covered = Counter(i for ep in episodes for i in ep.source_ids)
        assert covered == Counter(stored), "each turn in exactly one episode"
        if saves_first == "one":
            assert ended["two"].source_ids == stored[2:]  # what was left once one's episode was written
        else:
            assert [ep.id for ep in episodes] == [ended["one"].id] == [ended["two"].id]
    finally:
        one.close()
        two.close()
