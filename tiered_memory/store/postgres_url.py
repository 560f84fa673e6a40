"""What a libpq URL of a PostgreSQL record store says: its password, hidden wherever a message
or a log line may quote the URL, and the network settings its connections get.

Every connection gets :data:`NETWORK_DEFAULTS` for the keepalive and ``tcp_user_timeout``
settings the user left out; what the user set wins, in the URL or in the service file the URL
(``service=``) or ``PGSERVICE`` names.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..redaction import mask

#: libpq settings for every connection whose URL does not set them, so a peer that went silent (a
#: NAT that forgot the connection, a pulled cable, a failed-over server whose old address drops
#: packets) ends a call within about a minute rather than the OS's two hours and more: idle, a probe
#: after 30 s and every 10 s, 3 unanswered close it; data sent and unacknowledged for 60 s closes it
NETWORK_DEFAULTS = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
                    "keepalives_count": "3", "tcp_user_timeout": "60000"}


def network_settings(url: str, given: dict[str, Any]) -> dict[str, str]:
    """The :data:`NETWORK_DEFAULTS` that neither ``url`` (read as ``given``) nor its service file sets,
    to pass beside the URL (connection arguments override a service file's settings). libpq reads
    the service file as a connection starts: one is started, read and abandoned before it sends
    anything, only when a service is named."""
    if "service" in given or os.environ.get("PGSERVICE"):
        from psycopg import pq

        started = pq.PGconn.connect_start(url.encode())
        try:
            given = {**given, **{o.keyword.decode(): o.val for o in started.info if o.val is not None}}
        finally:
            started.finish()
    return {k: v for k, v in NETWORK_DEFAULTS.items() if k not in given}


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
