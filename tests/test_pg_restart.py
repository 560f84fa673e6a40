"""A running memory on PostgreSQL while its server restarts (an upgrade, a failover) or its
connections are dropped: while the server is down a call fails within its timeout with a
``StoreError`` that names the server (never the password) and writes nothing; once it is back
the same memory object works again; what a call acknowledged is stored, rows and vectors
together on pgvector; ``close`` works while the server is down.

These tests stop and start servers of their own (``tests/servers.py``), not the session's.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from servers import PgvectorServer, PostgresServer
from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.errors import StoreError
from tiered_memory.store.postgres import PostgresRecordStore

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]  # a hang fails instead of blocking the suite

SECRET = "s3cretpw"  # both servers trust local connections, so any password is let in
WAIT = 1.0  # connect_timeout of the stores here: how long a call waits for a server that is down (each
# call while down waits a few of these: 2 s made the file 37 s, 17 of it waiting; 1 s, 24 s; the value is not the point)


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def own_pgvector() -> Iterator[PgvectorServer]:
    server = PgvectorServer.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def down(server: PostgresServer | PgvectorServer) -> Iterator[None]:
    server.halt()
    try:
        yield
    finally:
        server.resume()


def with_password(url: str) -> str:
    return url.replace("postgres:@", "postgres@", 1).replace("postgres@", f"postgres:{SECRET}@", 1)


def assert_unreachable(error: StoreError, server: str) -> None:
    """The error of a call made while the server is down: names it, hides the password."""
    assert server in str(error) and SECRET not in str(error), str(error)
    assert "unreachable" in str(error) or "did not answer" in str(error), str(error)


def contents(memory: TieredMemory, user_id: str) -> list[str]:
    return [m.content for m in memory.get_messages("s", user_id=user_id)]


def drop_connections(admin_url: str, dbname: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        found = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                             " WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)).fetchone()
    return int(found[0]) if found else 0


def test_the_same_memory_outlives_dropped_connections_and_a_server_restart(
        own_postgres: PostgresServer, tmp_path: Path) -> None:
    url = with_password(own_postgres.create_database("restart"))
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=WAIT),
                          embedder=StaticEmbedder())
    try:
        memory.add("user", "before anything", session_id="s", user_id="u")
        assert drop_connections(own_postgres.admin_url, "restart") >= 1
        memory.add("user", "after the connections were dropped", session_id="s", user_id="u")
        with down(own_postgres):
            for attempt in range(3):  # the pool backs off between reconnections meanwhile
                with pytest.raises(StoreError) as info:
                    memory.add("user", f"while down {attempt}", session_id="s", user_id="u")
                assert_unreachable(info.value, f"127.0.0.1:{own_postgres.port}")
            with pytest.raises(StoreError) as info:
                memory.search("anything", user_id="u")
            assert_unreachable(info.value, f"127.0.0.1:{own_postgres.port}")
        memory.add("user", "after the restart", session_id="s", user_id="u")
        assert contents(memory, "u") == ["before anything", "after the connections were dropped", "after the restart"]
        assert [h.text for h in memory.search("after the restart", user_id="u", k=1)] == ["after the restart"]
    finally:
        memory.close()


def test_a_restart_inside_a_long_add_many_on_pgvector_keeps_whole_chunks_and_a_retry_stores_the_rest(
        own_pgvector: PgvectorServer, tmp_path: Path) -> None:
    url = with_password(own_pgvector.create_database("chunks"))
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=WAIT),
                          vector_store="pgvector", embedder=StaticEmbedder(), config=MemoryConfig(write_chunk=2))
    batch = [{"id": f"m{i}", "role": "user", "content": f"message number {i} about topic {i}"} for i in range(6)]
    halted: list[bool] = []

    def stop_after_the_first_chunk(n: int) -> None:
        if not halted:
            halted.append(True)
            own_pgvector.halt()

    try:
        try:
            with pytest.raises(StoreError) as info:
                memory.add_many(batch, session_id="s", user_id="u", progress=stop_after_the_first_chunk)
            assert_unreachable(info.value, "host=")  # a Unix socket: its folder is the server
        finally:
            own_pgvector.resume()
        assert contents(memory, "u") == [m["content"] for m in batch[:2]]  # the acknowledged chunk only
        assert memory.index.ids("u") == {"m0", "m1"}  # with its vectors
        assert memory.add_many(batch, session_id="s", user_id="u") == [m["id"] for m in batch]
        assert contents(memory, "u") == [m["content"] for m in batch]
        assert memory.index.ids("u") == {m["id"] for m in batch}
    finally:
        memory.close()


def logged(caplog: pytest.LogCaptureFixture, text: str, within: float = 120.0) -> None:
    """Wait until a record holding ``text`` is logged (by a background thread)."""
    deadline = time.monotonic() + within
    while not any(text in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, f"nothing logged {text!r}"
        time.sleep(0.05)


def test_access_counts_a_background_flush_could_not_write_while_the_server_was_down_are_written_later(
        own_postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tiered_memory")
    url = with_password(own_postgres.create_database("counts"))
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=WAIT),
                          embedder=StaticEmbedder(), config=MemoryConfig(access_flush_seconds=3.0))
    try:
        memory.add_fact("the user lives in Lisbon", user_id="u")
        assert [h.fact.text for h in memory.search_facts("Lisbon", user_id="u")] == ["the user lives in Lisbon"]
        with down(own_postgres):  # the background flush comes due while the server is down
            logged(caplog, "writing access counts failed")
        assert [f.access_count for f in memory.facts("u")] == [1]  # reading counts flushes what is pending
    finally:
        memory.close()


def test_close_while_the_server_is_down_returns_and_loses_no_record(
        own_postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = with_password(own_postgres.create_database("closing"))
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=WAIT),
                          embedder=StaticEmbedder())
    memory.add("user", "kept through the outage", session_id="s", user_id="u")
    assert len(memory.search("outage", user_id="u")) == 1  # an access count waits to be written
    with down(own_postgres):
        memory.close()  # the counts cannot be written: said in the log, not raised
    assert SECRET not in caplog.text and "access counts" in caplog.text
    again = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(url, connect_timeout=WAIT),
                         embedder=StaticEmbedder())
    try:
        assert contents(again, "u") == ["kept through the outage"]
    finally:
        again.close()
