"""Why a connection to PostgreSQL failed, and whether waiting can change it.

A server that is down, starting, or out of connection slots may answer a later attempt, so the
store waits ``connect_timeout`` for it and then raises a ``StoreError``. A database or role that
does not exist, or a password or ``pg_hba.conf`` that refuses the user, is a configuration mistake
that no retry fixes: :func:`refusal` recognises it in the server's or libpq's words, and opening a
store fails at once with a ``ConfigurationError`` (:func:`check_refused`). The words matched are
PostgreSQL's English ones: a server whose messages are translated (``lc_messages``) is waited on
as before, its reason still quoted in the ``StoreError``.

An open waits with direct attempts of its own (:func:`wait_for_server`) and starts the pool only once
the server answered: the pool logs each failed attempt as a warning on the ``psycopg.pool`` logger,
which a program without a logging set-up prints to stderr, a line a second or so while the open waits
and then the same reason again in the error. The library leaves that logger as the user set it
(what it logs once a store is open, an outage's reconnections, is theirs to see).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from ..errors import ConfigurationError, StoreError
from .postgres_url import redact

logger = logging.getLogger(__name__)

#: what a server (or libpq) says when it refuses a connection for good, and how to fix it
REFUSALS = (
    (re.compile(r'database "[^"]*" does not exist'), "create the database, or name an existing one in the URL"),
    (re.compile(r'role "[^"]*" does not exist'), "create the role, or name an existing user in the URL"),
    (re.compile(r"authentication failed for user|no password supplied"),
     "give the user's password (in the URL, PGPASSWORD or ~/.pgpass)"),
    (re.compile(r"no pg_hba\.conf entry|pg_hba\.conf rejects connection"),
     "let this host and user connect in the server's pg_hba.conf"),
    (re.compile(r'role "[^"]*" is not permitted to log in'), "let the role log in (ALTER ROLE ... LOGIN)"),
    (re.compile(r"permission denied for database"), "grant the user CONNECT on the database"),
)

# libpq's message of a URL of several hosts holds one failure per server tried
_SERVERS = re.compile(r"connection to server (?:at|on) ")


def refusal(message: str) -> str | None:
    """How to fix the failure that ``message`` (a failed connection's) reports, when no retry
    can fix it; ``None`` when one may: nothing listens, the server is starting or full, or one
    of several servers tried failed otherwise (pure)."""
    advice = None
    for failure in _SERVERS.split(message)[1:] or [message]:
        found = next((fix for pattern, fix in REFUSALS if pattern.search(failure)), None)
        if found is None:
            return None
        advice = advice or found
    return advice


def attempt(psycopg: Any, url: str, network: dict[str, Any], timeout: float) -> str | None:
    """Why a connection to ``url`` fails (the server's or libpq's own words: no such database,
    a refused password, nothing listening), from one direct attempt of at most ``timeout``
    seconds (2 to 5, as libpq counts them); ``None`` when it succeeds."""
    try:
        psycopg.connect(url, connect_timeout=max(2, min(int(timeout), 5)), **network).close()
    except Exception as e:
        return " ".join(str(e).split()) or type(e).__name__
    return None


def check_refused(url: str, why: str | None) -> None:
    """Raise the ``ConfigurationError`` of a store whose server refused it for good
    (:func:`refusal` of ``why``, a failed connection's message), saying why and how to fix it,
    never the password; return when there was no failure or waiting may help."""
    advice = None if why is None else refusal(why)
    if why is None or advice is None:
        return
    raise ConfigurationError(f"PostgreSQL at {redact(url, url)} refused the connection ({redact(why, url)}): "
                             f"{advice}. Trying again cannot change this.")


def wait_for_server(psycopg: Any, url: str, network: dict[str, Any], timeout: float) -> str | None:
    """Wait up to ``timeout`` seconds (and at most one short attempt more) for the server of
    ``url`` to accept a connection, one direct :func:`attempt` after another, 0.25 s apart and
    doubling to 2 s: ``None`` once one does, the failure at once when no retry fixes it
    (:func:`refusal`), the last failure when the time ran out."""
    deadline, pause = time.monotonic() + timeout, 0.25
    while True:
        why = attempt(psycopg, url, network, deadline - time.monotonic())
        left = deadline - time.monotonic()
        if why is None or refusal(why) is not None or left <= 0:
            return why
        logger.info("waiting for PostgreSQL at %s: %s", redact(url, url), redact(why, url))
        time.sleep(min(pause, left))
        pause = min(2 * pause, 2.0)


def unreachable(url: str, timeout: float, why: str) -> StoreError:
    """The error of a store whose server did not answer within ``timeout`` seconds."""
    return StoreError(f"could not connect to PostgreSQL at {redact(url, url)} within {timeout}s ({redact(why, url)}). "
                      "Check the URL, that the server runs, and that the user may connect.")
