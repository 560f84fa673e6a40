"""An export line of a row another writer left, as :func:`~.portable.import_jsonl` takes it
(pure, but for a logged warning).

A read takes any stored row (:mod:`.store.stored_values`), the import only what the API
would (:mod:`.portable_layers`). Where the two differ and the row can keep its id and its
text, the line is written the way the import takes it, with a warning naming the row:

- a user or session id holding control characters (a newline), which the API refuses, has
  each of them written as its Unicode control picture (``"s\\n1"`` as ``"s\\u240a1"``,
  shown as ``s␊1``): a printable id of the same length, the same for every line of that
  session (its turns, episodes, cursor, working memory);
- a time outside 1900-01-01..2200-01-01 (milliseconds) is written at the nearest end of that
  range, as the LangGraph store shows it.

Anything else the import would refuse leaves its line out of the export, with a warning
(:func:`~.portable.export_lines`): never a line that fails the restore.
"""

from __future__ import annotations

import logging
from typing import Any

from .validation import CONTROL, MAX_TIMESTAMP, MIN_TIMESTAMP

log = logging.getLogger("tiered_memory")
ID_KEYS = ("user_id", "session_id")
# the time fields of the records a line holds (Fact, FactChange, Episode, Item, ArchivedTurn,
# WorkingItem, SessionPad, AuditEntry) and of a message and an item line
TIME_KEYS = frozenset({"timestamp", "created_at", "updated_at", "valid_from", "invalid_at", "last_access", "start",
                       "end", "promoted_at", "compressed_at", "expires_at", "archived_at", "at"})
LAST_TIME = MAX_TIMESTAMP - 1.0  # the import takes times before 2200-01-01, not at it


def printable_id(value: str) -> str:
    """``value`` with each control character (as :func:`~.validation.check_id` counts them)
    replaced by its Unicode control picture (U+2400-U+241F, U+2421 for DEL)."""
    return CONTROL.sub(lambda m: chr(0x2400 + ord(m.group())) if m.group() != "\x7f" else "\u2421", value)


def in_range(time: float) -> float:
    """``time`` at the nearest end of the range the import takes, if outside it."""
    return min(max(time, MIN_TIMESTAMP), LAST_TIME)


def row_name(line: dict[str, Any]) -> object:
    """What names a line's row in a warning: its id (an audit entry's item, a session's pad or cursor)."""
    record = line.get(line["type"])
    named = record if isinstance(record, dict) else line
    return next((named[k] for k in ("id", "fact_id", "item_id", "session_id") if k in named), None)


def importable(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` (a fresh export line, changed in place) with its ids and times as the import
    takes them; see the module docstring."""
    kind = line["type"]
    record = line.get(kind)
    name = row_name(line)
    for fields in (line, record, *line.get("history", ())):
        if not isinstance(fields, dict):
            continue
        for key, value in fields.items():
            if key in TIME_KEYS and isinstance(value, float) and value != in_range(value):
                fields[key] = in_range(value)
            elif (key in ID_KEYS and kind != "item" and isinstance(value, str)  # an item's owner may be SHARED_OWNER
                  and printable_id(value) != value):
                fields[key] = printable_id(value)
            else:
                continue
            log.warning("export: the %s %r holds %s %r, which import_jsonl refuses; written as %r",
                        kind, name, key, value, fields[key])
    return line
