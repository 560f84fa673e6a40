"""What a libpq URL of a PostgreSQL record store says: its password, hidden wherever a message
or a log line may quote the URL, the network settings its connections get, and how long the
store waits for its server.

Every connection gets :data:`NETWORK_DEFAULTS` for the keepalive and ``tcp_user_timeout``
settings the user left out; what the user set wins, in the URL or in the service file the URL
(``service=``) or ``PGSERVICE`` names. libpq's ``connect_timeout`` there (or ``PGCONNECT_TIMEOUT``)
is the store's wait unless the code gives one (:func:`connect_wait`); one that is no number of
seconds, or no limit (0 or less), is refused before anything connects.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Mapping

from ..errors import ConfigurationError
from ..redaction import mask

#: libpq settings for every connection whose URL does not set them, so a peer that went silent (a
#: NAT that forgot the connection, a pulled cable, a failed-over server whose old address drops
#: packets) ends a call within about a minute rather than the OS's two hours and more: idle, a probe
#: after 30 s and every 10 s, 3 unanswered close it; data sent and unacknowledged for 60 s closes it
NETWORK_DEFAULTS = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
                    "keepalives_count": "3", "tcp_user_timeout": "60000"}


def libpq_settings(url: str, given: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``url`` (read as ``given``) and of the service file it or ``PGSERVICE``
    names. libpq reads the service file as a connection starts: one is started, read and abandoned
    before it sends anything, only when a service is named."""
    if "service" in given or os.environ.get("PGSERVICE"):
        from psycopg import pq

        started = pq.PGconn.connect_start(url.encode())
        try:
            given = {**given, **{o.keyword.decode(): o.val.decode() for o in started.info if o.val is not None}}
        finally:
            started.finish()
    return given


def network_settings(settings: Mapping[str, Any]) -> dict[str, str]:
    """The :data:`NETWORK_DEFAULTS` that the URL and its service file (their ``settings``,
    :func:`libpq_settings`) leave out, to pass beside the URL (connection arguments override a
    service file's settings) (pure)."""
    return {k: v for k, v in NETWORK_DEFAULTS.items() if k not in settings}


def checked_wait(seconds: object) -> float:
    """``seconds``, a store's ``connect_timeout`` argument, when it is a wait: a finite number
    above 0 (pure).

    Raises:
        ConfigurationError: anything else (``0`` failed at once, ``inf`` and ``nan`` never connected).
    """
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ConfigurationError("connect_timeout must be the seconds to wait for the PostgreSQL server, a "
                                 f"number above 0 (connect_timeout=5), got {seconds!r}")
    return seconds


def connect_wait(url: str, settings: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> int | None:
    """How long the store of ``url`` waits for its server, in seconds, by libpq's ``connect_timeout``
    of the URL or its service file (their ``settings``), else ``PGCONNECT_TIMEOUT`` of ``environ``;
    ``None`` when neither sets it. Read as psycopg reads it: whole seconds (``2.9`` is 2), at least
    2 (libpq's least: ``1`` is 2) (pure).

    Raises:
        ConfigurationError: a value that is no number of seconds (``abc``), or 0 or less in the
            URL or its service file, which libpq reads as no limit: the store waits a limited time,
            so that a call made while the server is down fails with a ``StoreError`` instead of
            hanging. It names the setting and quotes neither the password nor the value when it
            holds it. (0 or less in ``PGCONNECT_TIMEOUT``, which every libpq program of the
            environment reads, leaves the store's own wait: ``None``.)
    """
    name = "connect_timeout" if "connect_timeout" in settings else "PGCONNECT_TIMEOUT"
    value = settings.get("connect_timeout", environ.get("PGCONNECT_TIMEOUT"))
    if value is None:
        return None
    try:
        seconds = int(float(value))
    except (ValueError, OverflowError):  # not a number, inf, nan
        seconds = None
    if seconds is not None and seconds > 0:
        return max(seconds, 2)
    if seconds is not None and name == "PGCONNECT_TIMEOUT":  # every libpq program's: no limit there is no mistake
        return None
    said = f"{name}={redact(str(value), url)!r} for PostgreSQL at {redact(url, url)}"
    fix = ("write the seconds to wait for the server (connect_timeout=5: whole seconds, 2 at least), "
           "or leave it out to wait 10 s")
    if seconds is None:
        raise ConfigurationError(f"{said} is not a number of seconds: {fix}")
    raise ConfigurationError(f"{said} is no limit to libpq, but the store waits a limited time for its server, so that "
                             f"a call made while it is down fails with a StoreError instead of hanging: {fix}")


def _secrets(url: str) -> list[str]:
    """The password of ``url`` as it may appear in a message: in the user part (up to the
    authority's last ``@``, and each piece of it between ``@``, which libpq may have read as
    part of the host) and in a ``password=`` parameter (pure)."""
    found: list[str] = []
    user_part = re.match(r"[^:]*://([^/?#]*)@", url)
    if user_part and ":" in user_part.group(1):
        secret = user_part.group(1).split(":", 1)[1]
        found += [secret, *secret.split("@")]
    found += re.findall(r"[?&]password=([^&#]*)", url)
    return [s for s in set(found) if len(s) >= 3]


def redact(text: str, url: str) -> str:
    """``text`` (a URL, or a message that may quote it) without the password of ``url``, in any
    form a message may quote it in (:func:`..redaction.mask`) (pure)."""
    text = re.sub(r"(://[^:/@?#]+):[^/?#]*@", r"\1:***@", text)
    text = re.sub(r"([?&]password=)[^&#\s\"']*", r"\1***", text)
    return mask(text, _secrets(url))
