"""Two workers writing one session of a PostgreSQL store while a third ends it. A message's
``seq`` is drawn when its row is inserted, not when its transaction commits, so one worker's
turn could commit after another's with a higher ``seq``; ``end_session`` moves the session's
coverage cursor to the highest ``seq`` it read, and a turn committed under the cursor later
was never summarised (no episode, no facts; nothing looks below the cursor again).

The interleaving is forced, not hoped for: a second connection holds a message id one
worker's batch also stores, so that batch waits with its first turn inserted and not yet
committed while the other worker stores a turn of the session and ends it.

Two workers ending one session, a turn committed between their reads, write each turn into
one episode: each worker is held (HeldEmbedder) between its read and its write, and let go
in a chosen order.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

from tiered_memory import Episode, StaticEmbedder, TieredMemory
from tiered_memory.testing import HeldEmbedder, ScriptedLLM, task_of

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


def _end_twice(url: str, tmp_path: Path, turns: list[dict[str, str]], turn: str, saves_first: str,
               llm: Callable[[], object] = lambda: None) -> tuple[list[str], list[Episode], dict[str, Any]]:
    """Worker "one" ends the session of ``turns`` and is held after its read (in its first
    embedding); ``turn`` commits; worker "two" ends the session, held likewise; ``saves_first``
    is let go first. Returns the session's turn ids, its episodes, and what each end_session
    returned (or raised)."""
    held = {name: HeldEmbedder(StaticEmbedder()) for name in ("one", "two")}
    memory = {name: TieredMemory(tmp_path / name, record_store=url, embedder=held[name], llm=llm())
              for name in ("one", "two")}
    ended: dict[str, Any] = {}

    def end(name: str) -> None:
        try:
            ended[name] = memory[name].end_session("s", user_id="ana")
        except BaseException as e:  # surfaced by the test
            ended[name] = e

    try:
        memory["one"].add_many(turns, user_id="ana", session_id="s")
        threads: dict[str, threading.Thread] = {}
        for name in ("one", "two"):
            if name == "two":
                memory["two"].add("user", turn, user_id="ana", session_id="s")
            held[name].hold()  # its first embedding (of what it read) waits for release()
            threads[name] = threading.Thread(target=end, args=(name,))
            threads[name].start()
            assert held[name].entered.wait(60), f"{name} never embedded what it read"
        for name in ("one", "two") if saves_first == "one" else ("two", "one"):
            held[name].release()
            threads[name].join()
        return ([m.id for m in memory["one"].get_messages("s", user_id="ana")],
                memory["one"].episodes("ana", "s"), ended)
    finally:
        for m in memory.values():
            m.close()


@pytest.mark.parametrize("saves_first", ["one", "two"])
def test_two_workers_ending_a_session_cover_each_turn_once(make_postgres_url: Callable[[], str],
                                                           tmp_path: Path, saves_first: str) -> None:
    """One worker reads the session's turns and is held before it writes its episode; a turn
    commits; the other worker reads every turn and is held too. When the first writes first,
    the second's episode covered the first's turns again (it checked only that its own last
    turn was not covered yet): it writes one of the new turn alone. When the second writes
    first, the first returns its episode."""
    stored, episodes, ended = _end_twice(
        make_postgres_url(), tmp_path, [{"role": "user", "content": "I moved to Lisbon last spring"},
                                        {"role": "assistant", "content": "How do you like it?"}],
        "I sail on weekends", saves_first)
    assert all(isinstance(e, Episode) for e in ended.values()), ended
    assert Counter(i for ep in episodes for i in ep.source_ids) == Counter(stored), "each turn in one episode"
    if saves_first == "one":
        assert ended["two"].source_ids == stored[2:]  # what was left once one's episode was written
    else:
        assert [ep.id for ep in episodes] == [ended["one"].id] == [ended["two"].id]


def _episodes_without_facts(messages: list[dict[str, str]]) -> dict[str, object]:
    return {"facts": []} if task_of(messages) == "facts" else {"summary": "a part of the session"}


def test_two_workers_ending_a_session_in_spans_cover_each_turn_once(
        make_postgres_url: Callable[[], str], tmp_path: Path) -> None:
    """With a model, a session longer than one transcript is an episode a span: the first
    worker's last span (turn 3) is the start of the second's (turns 3-4). The second returns
    the first's episode of the span both read whole and summarises turn 4 alone."""
    long = "word " * 1_100  # two such turns to a transcript
    stored, episodes, ended = _end_twice(
        make_postgres_url(), tmp_path, [{"role": "user", "content": f"{n} {long}"} for n in range(3)],
        f"3 {long}", "one", llm=lambda: ScriptedLLM(default=_episodes_without_facts))
    assert all(isinstance(e, Episode) for e in ended.values()), ended
    assert [[stored.index(i) for i in ep.source_ids] for ep in episodes] == [[0, 1], [2], [3]]
    assert ended["two"].id == episodes[-1].id
