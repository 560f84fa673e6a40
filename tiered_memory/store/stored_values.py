"""Reading the values of a stored row, whoever wrote it (pure, but for a logged warning).

Writes through the API are checked (:mod:`tiered_memory.validation`), but a row may also come
from an older version, a second process, an import or a user's own SQL. A read decodes each
value it needs with these functions: a value of the wrong kind (JSON that does not parse or
is not the expected container, text stored as a number or bytes, a number stored as text,
NaN or infinity where a score or a time is ranked) is read as the field's empty or default
value, with a warning naming the row, so one such row never breaks a read of the others.
An unreadable time is read as :data:`~tiered_memory.records.NO_TIME` (0.0), which
consolidation's age rules leave alone. A value of the right kind comes back as it is (no copy,
one type check).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Sequence, TypeVar

log = logging.getLogger("tiered_memory")
C = TypeVar("C", dict[str, Any], list[Any])
_warned: set[tuple[str, str, str]] = set()  # each value is reported once a process, not on every read


def _warn(table: str, row_id: object, column: str, raw: object, read_as: object) -> None:
    key = (table, repr(row_id), column)
    if key in _warned:
        return
    if len(_warned) < 10_000:
        _warned.add(key)
    shown = repr(raw)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    log.warning("stored %s.%s of %r is not readable (%s); read as %r", table, column, row_id, shown, read_as)


def lenient_text(raw: bytes | memoryview) -> str:
    """Stored bytes as text, invalid UTF-8 (a lone surrogate's bytes, a cut letter) read as U+FFFD."""
    return bytes(raw).decode("utf-8", "replace")


def _json(raw: object, kind: type[C], table: str, row_id: object, column: str) -> C:
    """A JSON column holding a ``kind`` (dict or list): an empty one unless it holds one."""
    decoded = lenient_text(raw) if isinstance(raw, (bytes, memoryview)) else raw
    try:
        value = json.loads(decoded) if isinstance(decoded, str) else None
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, kind):
        return value
    _warn(table, row_id, column, raw, kind())
    return kind()


def json_dict(raw: object, table: str, row_id: object, column: str) -> dict[str, Any]:
    """A JSON object column (metadata, details, a scratchpad): ``{}`` unless it holds one."""
    return {} if raw == "{}" else _json(raw, dict, table, row_id, column)


def json_list(raw: object, table: str, row_id: object, column: str) -> list[Any]:
    """A JSON array column (source ids, a namespace): ``[]`` unless it holds one."""
    return _json(raw, list, table, row_id, column)


def strings(value: object, table: str, row_id: object, column: str) -> list[str]:
    """The strings of a decoded JSON list (an episode's entities, decisions...); anything else
    there is dropped."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    kept = [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
    _warn(table, row_id, column, value, kept)
    return kept


def text(raw: object, table: str, row_id: object, column: str) -> str:
    """A text column: bytes decoded as UTF-8 (invalid bytes replaced), NULL as ``""``, a
    number as its digits."""
    if isinstance(raw, str):
        return raw
    read = "" if raw is None else lenient_text(raw) if isinstance(raw, (bytes, memoryview)) else str(raw)
    _warn(table, row_id, column, raw, read)
    return read


def number(raw: object, table: str, row_id: object, column: str, default: float = 0.0) -> float:
    """A float column (a time, a confidence, an importance): ``default`` unless it holds a
    finite number (for a time, 0.0: :data:`~tiered_memory.records.NO_TIME`)."""
    if type(raw) is float and math.isfinite(raw):
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) < 2**63:
        return float(raw)
    _warn(table, row_id, column, raw, default)
    return default


def optional_number(raw: object, table: str, row_id: object, column: str) -> float | None:
    """A nullable float column (``last_access``, ``invalid_at``...): NULL stays ``None``."""
    return None if raw is None else number(raw, table, row_id, column)


def count(raw: object, table: str, row_id: object, column: str, default: int = 0) -> int:
    """An integer column (an access count, a turn count, a cursor): ``default`` unless it holds
    an integer."""
    if type(raw) is int:
        return raw
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    _warn(table, row_id, column, raw, default)
    return default


def message_values(r: Sequence[Any]) -> tuple[str, str, float]:
    """The role, content and timestamp of a ``messages`` row (columns ``id, user_id,
    session_id, role, content, metadata, timestamp``) read as text, text and a float. A float
    timestamp is kept as it is, out of range or not: renderers and scorers take any float."""
    t, i, ts = "messages", r[0], r[6]
    return (text(r[3], t, i, "role"), text(r[4], t, i, "content"),
            ts if isinstance(ts, float) else number(ts, t, i, "timestamp"))
