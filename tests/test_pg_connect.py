"""Opening a PostgreSQL record store that cannot be opened: a typed error that says why
(the server's or libpq's own reason, not only that a pool timed out) and never the password,
wherever the URL holds it, in the message or in the log.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Callable, Iterator

import pytest

from servers import PostgresServer
from tiered_memory.errors import ConfigurationError, StoreError
from tiered_memory.store.postgres import PostgresRecordStore
from tiered_memory.store.postgres_connect import refusal

SECRET = "s3cretpw"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_a_password_given_as_a_url_parameter_is_not_in_the_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreError) as info:
        PostgresRecordStore(f"postgresql://app@127.0.0.1:{closed_port()}/app?password={SECRET}", connect_timeout=2)
    assert SECRET not in str(info.value) and "password=***" in str(info.value)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("url", [
    f"postgresql://app:{SECRET}@[::1/app",  # an IPv6 host without its closing bracket
    f"postgresql://app:{SECRET}@db/app?sslmod=require",  # a misspelt parameter
])
def test_a_malformed_url_is_a_configuration_error_at_once_without_the_password(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigurationError, match="cannot be read") as info:  # before any pool waits on it
        PostgresRecordStore(url, connect_timeout=3)
    assert SECRET not in str(info.value) and info.value.__suppress_context__  # the cause quotes the URL
    assert SECRET not in caplog.text  # the pool never saw it: its warnings quote a bad URL whole


def pool_retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The connection attempts the pool made and failed (it logs each and tries again)."""
    return [r.getMessage() for r in caplog.records if r.name == "psycopg.pool" and "error connecting" in r.getMessage()]


@pytest.fixture(scope="module")
def password_server() -> Iterator[PostgresServer]:
    """A server of its own that asks the role ``pw_user`` for its password (the session's trusts everyone)."""
    import psycopg

    server = PostgresServer.start()
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            conn.execute("CREATE ROLE pw_user LOGIN PASSWORD 'right_pw'")
            conn.execute("CREATE DATABASE pw_db OWNER pw_user")
        hba = server.folder / "data" / "pg_hba.conf"
        hba.write_text("host all pw_user 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        assert server._pg_ctl("reload").returncode == 0
        yield server
    finally:
        server.stop()


@pytest.mark.servers
def test_a_database_that_does_not_exist_is_a_configuration_error_at_once(
        make_postgres_url: Callable[[], str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = make_postgres_url().rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(ConfigurationError, match='database "no_such_database" does not exist'):
        PostgresRecordStore(url, connect_timeout=2)
    assert pool_retries(caplog) == []  # refused before any pool waited on it (and printed its retries)


@pytest.mark.servers
def test_an_unknown_role_is_a_configuration_error_at_once(
        make_postgres_url: Callable[[], str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = make_postgres_url().replace("postgres@", f"nobody_here:{SECRET}@", 1)
    with pytest.raises(ConfigurationError, match='"nobody_here" does not exist') as info:
        PostgresRecordStore(url, connect_timeout=2)
    assert SECRET not in str(info.value) and SECRET not in caplog.text
    assert pool_retries(caplog) == []


@pytest.mark.servers
@pytest.mark.parametrize("secret, said", [
    (SECRET, 'password authentication failed for user "pw_user"'),  # a wrong one
    (None, "no password supplied"),
])
def test_a_refused_password_is_a_configuration_error_at_once_without_it(
        password_server: PostgresServer, secret: str | None, said: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    user = "pw_user" if secret is None else f"pw_user:{secret}"
    url = password_server.url("pw_db").replace("postgres@", f"{user}@", 1)
    with pytest.raises(ConfigurationError, match=said) as info:
        PostgresRecordStore(url, connect_timeout=2)
    assert SECRET not in str(info.value) and SECRET not in caplog.text
    assert pool_retries(caplog) == []


@pytest.mark.servers
def test_the_right_password_opens_the_store(password_server: PostgresServer) -> None:
    store = PostgresRecordStore(password_server.url("pw_db").replace("postgres@", "pw_user:right_pw@", 1),
                                connect_timeout=2)
    store.close()


def test_a_server_that_does_not_answer_is_a_store_error_after_the_wait_and_no_pool_warns_meanwhile(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreError, match="within 2s .*Connection refused") as info:  # a server starting may answer
        PostgresRecordStore(f"postgresql://app:{SECRET}@127.0.0.1:{closed_port()}/app", connect_timeout=2)
    assert not isinstance(info.value, ConfigurationError)
    assert pool_retries(caplog) == []  # the error says it once: no warning a try on stderr before it
    waits = [r for r in caplog.records if r.name == "tiered_memory.store.postgres_connect"]
    assert waits and all(r.levelno == logging.INFO for r in waits)  # the open's own tries, below the warnings


class _ResumeOnFirstWait(logging.Handler):
    """Starts ``server`` again when an open first logs that it waits for it."""

    def __init__(self, server: PostgresServer) -> None:
        super().__init__()
        self.server, self.resumed = server, False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.resumed and record.getMessage().startswith("waiting for PostgreSQL"):
            self.resumed = True
            self.server.resume()


@pytest.mark.servers
def test_an_open_waiting_for_a_server_that_comes_up_opens_it(caplog: pytest.LogCaptureFixture) -> None:
    server = PostgresServer.start()
    waits = logging.getLogger("tiered_memory.store.postgres_connect")
    handler = _ResumeOnFirstWait(server)
    try:
        server.halt()
        caplog.set_level(logging.DEBUG)
        waits.addHandler(handler)
        store = PostgresRecordStore(server.admin_url, connect_timeout=60)  # a hang fails, it does not time
        store.close()
        assert handler.resumed and pool_retries(caplog) == []
    finally:
        waits.removeHandler(handler)
        server.stop()


@pytest.mark.parametrize("message, fixed_by", [
    ('connection failed: connection to server at "db", port 5432 failed: FATAL: database "app" does not exist',
     "create the database"),
    ('connection failed: connection to server at "db", port 5432 failed: FATAL: role "app" does not exist',
     "create the role"),
    ('connection to server at "db", port 5432 failed: FATAL: password authentication failed for user "app"',
     "password"),
    ('connection to server at "db", port 5432 failed: fe_sendauth: no password supplied', "password"),
    ('connection to server at "db", port 5432 failed: FATAL: no pg_hba.conf entry for host "10.0.0.2", user "app", '
     'database "app", no encryption', "pg_hba.conf"),
    ('connection to server at "db", port 5432 failed: FATAL: role "app" is not permitted to log in', "LOGIN"),
    ('connection to server at "db", port 5432 failed: FATAL: permission denied for database "app" DETAIL: User '
     'does not have CONNECT privilege.', "CONNECT"),
    # a retry may help: nothing listens, the server is starting or full, no answer
    ('connection to server at "db", port 5432 failed: Connection refused Is the server running on that host '
     'and accepting TCP/IP connections?', None),
    ('connection to server at "db", port 5432 failed: FATAL: the database system is starting up', None),
    ('connection to server at "db", port 5432 failed: FATAL: sorry, too many clients already', None),
    ('connection to server at "db", port 5432 failed: timeout expired', None),
    ("connection is bad: Name or service not known", None),
    # several hosts: refused for good only when every one refused
    ('connection to server at "a", port 5432 failed: FATAL: database "app" does not exist '
     'connection to server at "b", port 5432 failed: Connection refused', None),
    ('connection to server at "a", port 5432 failed: FATAL: database "app" does not exist '
     'connection to server on socket "/run/.s.PGSQL.5432" failed: FATAL: role "app" does not exist',
     "create the database"),
    # a server whose messages are translated is waited on, as any other failure
    ('connection to server at "db", port 5432 failed: FATAL: Datenbank »app« existiert nicht', None),
])
def test_refusal_tells_the_failures_no_retry_fixes(message: str, fixed_by: str | None) -> None:
    advice = refusal(message)
    assert advice is None if fixed_by is None else fixed_by in str(advice)


@pytest.mark.parametrize("query, environ, seconds", [
    ("?connect_timeout=3", {}, 3.0),
    ("?connect_timeout=1", {}, 2.0),  # libpq's least: 1 is 2
    ("?connect_timeout=2.9", {}, 2.0),  # whole seconds, as psycopg reads it
    ("?connect_timeout=%2030", {}, 30.0),
    ("", {}, None),  # the store's own 10 s
    ("?sslmode=disable", {}, None),
    ("", {"PGCONNECT_TIMEOUT": "4"}, 4.0),  # libpq's variable, when the URL says nothing
    ("?connect_timeout=3", {"PGCONNECT_TIMEOUT": "4"}, 3.0),
    ("", {"PGCONNECT_TIMEOUT": "0"}, None),  # the environment's 'no limit' (other libpq programs'): the store's 10 s
    ("", {"PGCONNECT_TIMEOUT": "-5"}, None),
])
def test_the_wait_is_libpqs_connect_timeout_of_the_url(
        query: str, environ: dict[str, str], seconds: float | None) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from tiered_memory.store.postgres_url import connect_wait

    url = f"postgresql://app:{SECRET}@db/app{query}"
    assert connect_wait(url, conninfo_to_dict(url), environ) == seconds


@pytest.mark.parametrize("value", ["abc", "-1", "0", "", "inf", "nan", SECRET])
def test_a_connect_timeout_that_is_no_wait_is_a_configuration_error_at_once_without_the_password(
        value: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"postgresql://app:{SECRET}@127.0.0.1:{closed_port()}/app?connect_timeout={value}"
    with pytest.raises(ConfigurationError, match="connect_timeout") as info:  # not a StoreError after a wait
        PostgresRecordStore(url)
    assert SECRET not in str(info.value) and "app:***@" in str(info.value)
    assert SECRET not in caplog.text and pool_retries(caplog) == []


def test_a_bad_connect_timeout_in_pgconnect_timeout_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="PGCONNECT_TIMEOUT"):
        PostgresRecordStore(f"postgresql://app:{SECRET}@127.0.0.1:{closed_port()}/app")


def test_a_connect_timeout_argument_wins_over_the_urls() -> None:
    url = f"postgresql://app:{SECRET}@127.0.0.1:{closed_port()}/app?connect_timeout=30"
    with pytest.raises(StoreError, match=r"within 0\.1s"):
        PostgresRecordStore(url, connect_timeout=0.1)
    with pytest.raises(ConfigurationError, match="connect_timeout='abc'"):  # each of libpq's attempts reads it
        PostgresRecordStore(url.replace("=30", "=abc"), connect_timeout=0.1)


@pytest.mark.servers
def test_the_urls_connect_timeout_is_the_stores_wait(make_postgres_url: Callable[[], str]) -> None:
    store = PostgresRecordStore(make_postgres_url() + "?connect_timeout=3")
    try:
        assert store.timeout == 3.0 and store.pool.timeout == 3.0  # a checkout while the server is down too
    finally:
        store.close()


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_connect_timeout_argument_that_is_no_wait_is_a_configuration_error(seconds: object) -> None:
    """0 failed at once with a StoreError saying the server did not answer; inf and nan never
    connected (each attempt failed to read them) and waited for ever."""
    with pytest.raises(ConfigurationError, match="connect_timeout"):
        PostgresRecordStore(f"postgresql://app:{SECRET}@127.0.0.1:{closed_port()}/app",
                            connect_timeout=seconds)  # type: ignore[arg-type]


def test_a_bad_connect_timeout_of_a_service_file_is_named_as_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "services.conf").write_text(f"[tm]\nhost=127.0.0.1\nport={closed_port()}\nconnect_timeout=soon\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "services.conf"))
    with pytest.raises(ConfigurationError, match="connect_timeout='soon' for PostgreSQL"):  # not b'soon'
        PostgresRecordStore("postgresql://app@/app?service=tm")
