"""Opening a PostgreSQL record store that cannot be opened: a typed error that says why
(the server's or libpq's own reason, not only that a pool timed out) and never the password,
wherever the URL holds it, in the message or in the log.
"""

from __future__ import annotations

import logging
import socket
from typing import Callable

import pytest

from tiered_memory.errors import ConfigurationError, StoreError
from tiered_memory.store.postgres import PostgresRecordStore

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


@pytest.mark.servers
def test_a_database_that_does_not_exist_is_named_in_the_error(make_postgres_url: Callable[[], str]) -> None:
    url = make_postgres_url().rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(StoreError, match='database "no_such_database" does not exist'):
        PostgresRecordStore(url, connect_timeout=2)


@pytest.mark.servers
def test_an_unknown_role_is_named_in_the_error(make_postgres_url: Callable[[], str]) -> None:
    url = make_postgres_url().replace("postgres@", f"nobody_here:{SECRET}@", 1)
    with pytest.raises(StoreError, match='"nobody_here" does not exist') as info:
        PostgresRecordStore(url, connect_timeout=2)
    assert SECRET not in str(info.value)
