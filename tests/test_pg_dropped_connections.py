"""A PostgreSQL connection the server drops in the middle of a call (``pg_terminate_backend``, a
failover, a proxy that kills it): a read is run again once on a fresh connection and answers; a
write cut before its commit was rolled back by the server, so it is run again once too and
stored exactly once; a write that cannot be run again raises a ``StoreError`` saying nothing of
it was stored, and a retry stores it once; a write whose connection is lost during its commit is
not run again (it may be stored) and says so.

The cut is placed without timing: a second connection holds a lock the call needs, so the call
waits inside the server, and its backend is terminated there; or a held embedder keeps a
pgvector unit's transaction open while its backend is terminated.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from langchain_tiered_memory import TieredMemoryStore
from servers import PostgresServer
from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.errors import StoreError
from tiered_memory.store.postgres import PostgresRecordStore
from tiered_memory.testing import HeldEmbedder

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]  # a hang fails instead of blocking the suite


def terminate(url: str, pids: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))


def waiting(url: str, wait: str = "wait_event_type = 'Lock'") -> list[int]:
    """The backends of ``url``'s database that ``wait`` (by default for a lock), polled until there is one."""
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            found = [r[0] for r in conn.execute(
                f"SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND {wait}").fetchall()]
            if found:
                return found
            conn.execute("SELECT pg_sleep(0.02)")


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def cut_inside(url: str, table: str, call: Callable[[], Any], *, writing: bool = False) -> Any:
    """What ``call`` returns (or raises) when the server ends its connection while the call waits
    inside the server for ``table``, which a second connection holds locked until then (against
    its reads, or, ``writing``, only against its writes: the call waits inside its transaction)."""
    with psycopg.connect(url) as locker:
        locker.execute(f"LOCK TABLE tiered_memory.{table} IN {'' if writing else 'ACCESS '}EXCLUSIVE MODE")
        thread, outcome = in_thread(call)
        terminate(url, waiting(url))
    thread.join(timeout=120)  # the hang guard, not a timing assertion
    assert not thread.is_alive() and len(outcome) == 1
    return outcome[0]


@pytest.fixture
def filled(make_postgres_url: Callable[[], str], tmp_path: Path) -> Iterator[tuple[TieredMemory, str]]:
    url = make_postgres_url()
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=5),
                          embedder=StaticEmbedder())
    memory.add("user", "I live in Lisbon", session_id="s", user_id="u")
    memory.add_fact("the user lives in Lisbon", user_id="u")
    TieredMemoryStore(memory, fields=["text"]).put(("u", "prefs"), "drink", {"text": "green tea"})
    try:
        yield memory, url
    finally:
        memory.close()


READS: dict[str, tuple[str, Callable[[TieredMemory], Any], Any]] = {
    "get_messages": ("messages", lambda m: [x.content for x in m.get_messages("s", user_id="u")], ["I live in Lisbon"]),
    "search": ("messages", lambda m: [h.text for h in m.search("Lisbon", user_id="u")], ["I live in Lisbon"]),
    "facts": ("facts", lambda m: [f.text for f in m.facts("u")], ["the user lives in Lisbon"]),
    "build_context": ("facts", lambda m: "the user lives in Lisbon" in m.build_context(
        "where does the user live", user_id="u", session_id="s").memory_text(), True),
    "store.get": ("items", lambda m: TieredMemoryStore(m).get(("u", "prefs"), "drink").value,  # type: ignore[union-attr]
                  {"text": "green tea"}),
    "store.search": ("items", lambda m: [h.key for h in TieredMemoryStore(m).search(("u",), query="tea")], ["drink"]),
}


@pytest.mark.parametrize("name", list(READS))
def test_a_read_whose_connection_is_dropped_mid_call_answers_on_a_fresh_connection(
        filled: tuple[TieredMemory, str], name: str) -> None:
    memory, url = filled
    table, read, expected = READS[name]
    assert cut_inside(url, table, lambda: read(memory)) == expected


def test_a_write_whose_connection_is_dropped_before_its_commit_is_stored_once(
        filled: tuple[TieredMemory, str]) -> None:
    memory, url = filled
    assert isinstance(cut_inside(url, "messages", lambda: memory.add(
        "user", "after the cut", session_id="s", user_id="u"), writing=True), str)
    assert [x.content for x in memory.get_messages("s", user_id="u")] == ["I live in Lisbon", "after the cut"]


def test_a_fact_write_cut_before_its_commit_says_nothing_was_stored_and_a_retry_stores_it_once(
        filled: tuple[TieredMemory, str]) -> None:
    memory, url = filled
    failed = cut_inside(url, "facts", lambda: memory.add_fact("the user likes cats", user_id="u"),
                        writing=True)
    assert isinstance(failed, StoreError) and "nothing" in str(failed), failed
    assert [f.text for f in memory.facts("u")] == ["the user lives in Lisbon"]
    memory.add_fact("the user likes cats", user_id="u")
    assert [f.text for f in memory.facts("u")] == ["the user lives in Lisbon", "the user likes cats"]


@pytest.fixture
def joint(make_pgvector_url: Callable[[], str], tmp_path: Path) -> Iterator[tuple[TieredMemory, HeldEmbedder, str]]:
    url = make_pgvector_url()
    embedder = HeldEmbedder(StaticEmbedder())
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=5),
                          vector_store="pgvector", embedder=embedder)
    try:
        yield memory, embedder, url
    finally:
        memory.close()


def backends(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                                           " AND pid <> pg_backend_pid()").fetchall()]


def cut_while_embedding(url: str, embedder: HeldEmbedder, call: Callable[[], Any]) -> Any:
    """What ``call`` returns (or raises) when every connection of its database is ended while the
    call embeds inside a transaction of rows and vectors (pgvector)."""
    embedder.hold()
    thread, outcome = in_thread(call)
    try:
        assert embedder.entered.wait(60)
        terminate(url, backends(url))
    finally:
        embedder.release()
    thread.join(timeout=120)  # the hang guard, not a timing assertion
    assert not thread.is_alive() and len(outcome) == 1
    return outcome[0]


@pytest.mark.parametrize("ids", [True, False], ids=["with-ids", "library-ids"])
def test_a_pgvector_batch_cut_before_its_commit_is_stored_once_with_its_vectors(
        joint: tuple[TieredMemory, HeldEmbedder, str], ids: bool) -> None:
    memory, embedder, url = joint
    batch = [{"role": "user", "content": f"message {i} about topic {i}", **({"id": f"m{i}"} if ids else {})}
             for i in range(3)]
    stored = cut_while_embedding(url, embedder, lambda: memory.add_many(batch, session_id="s", user_id="u"))
    assert isinstance(stored, list), stored
    assert [x.content for x in memory.get_messages("s", user_id="u")] == [m["content"] for m in batch]
    assert memory.index.ids("u") == set(stored)


def test_a_pgvector_fact_cut_before_its_commit_is_stored_once(
        joint: tuple[TieredMemory, HeldEmbedder, str]) -> None:
    memory, embedder, url = joint
    fact = cut_while_embedding(url, embedder, lambda: memory.add_fact("the user likes cats", user_id="u"))
    assert getattr(fact, "text", None) == "the user likes cats", fact
    assert [f.text for f in memory.facts("u")] == ["the user likes cats"]
    assert [h.fact.text for h in memory.search_facts("cats", user_id="u")] == ["the user likes cats"]


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer.start()  # its configuration changes below: not the session's server
    try:
        yield server
    finally:
        server.stop()


def set_standbys(server: PostgresServer, names: str) -> None:
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")
    while True:  # until a new connection (forked after the server read its configuration) has it
        with psycopg.connect(server.admin_url) as fresh:
            if fresh.execute("SHOW synchronous_standby_names").fetchone() == (names,):
                return


def test_a_write_whose_connection_is_lost_during_its_commit_is_not_run_again_and_says_it_may_be_stored(
        own_postgres: PostgresServer, tmp_path: Path) -> None:
    url = own_postgres.create_database("commit_cut")
    with psycopg.connect(own_postgres.admin_url, autocommit=True) as conn:
        conn.execute('ALTER DATABASE "commit_cut" SET synchronous_commit = on')
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=5),
                          embedder=StaticEmbedder())
    try:
        memory.add("user", "before", session_id="s", user_id="u")
        # a commit now waits for a synchronous standby that never answers, after it is made
        # locally: ending its connection then is a connection lost during the commit
        set_standbys(own_postgres, "never_there")
        try:
            terminate(url, backends(url))  # the pool's connections, opened under the old settings
            thread, outcome = in_thread(lambda: memory.add("user", "committed", session_id="s", user_id="u"))
            terminate(url, waiting(url, "wait_event = 'SyncRep'"))
            thread.join(timeout=120)  # the hang guard, not a timing assertion
        finally:
            set_standbys(own_postgres, "")
        assert not thread.is_alive() and len(outcome) == 1
        assert isinstance(outcome[0], StoreError) and "may or may not be stored" in str(outcome[0]), outcome
        assert [x.content for x in memory.get_messages("s", user_id="u")] == ["before", "committed"]  # once
    finally:
        memory.close()


def test_a_unit_that_caught_its_dropped_connection_is_run_again_not_called_maybe_stored(
        make_postgres_url: Callable[[], str]) -> None:
    """A unit's code may catch the error of its connection's end and return: the COMMIT then
    fails on a connection that was broken before it was sent, so nothing was stored and the
    unit runs again (not a "may or may not be stored" error, which would leave the caller to guess)."""
    from tiered_memory.store.postgres_db import PostgresDatabase

    url = make_postgres_url()
    db = PostgresDatabase(url, schema="tiered_memory", connect_timeout=5)
    try:
        db.write(lambda conn: conn.execute("CREATE TABLE IF NOT EXISTS notes (n int)"), detached=True)
        runs: list[str] = []

        def unit(conn: Any) -> None:
            try:
                conn.execute("INSERT INTO notes VALUES (1)")
                runs.append("inserted")
            except psycopg.OperationalError:
                runs.append("caught")  # and returns normally

        assert cut_inside(url, "notes", lambda: db.write(unit), writing=True) is None
        assert runs == ["caught", "inserted"]
        assert db.query("SELECT n FROM notes") == [(1,)]

        def layer_write() -> None:  # a layer's own transaction, which cannot be run again
            with db.transaction() as conn:
                unit(conn)

        failed = cut_inside(url, "notes", layer_write, writing=True)
        assert isinstance(failed, StoreError) and "nothing of it was stored" in str(failed), failed
        assert runs[-1] == "caught" and db.query("SELECT n FROM notes") == [(1,)]
    finally:
        db.close()
