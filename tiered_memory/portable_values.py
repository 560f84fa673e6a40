"""An export line of a row another writer left, as :func:`~.portable.import_jsonl` takes it
(pure, but for a logged warning).

A read takes any stored row (:mod:`.store.stored_values`), the import only what the API
would (:mod:`.portable_layers`). Where the two differ and the row can keep its id and its
text, the line is written the way the import takes it, with a warning naming the row:

- a user or session id holding control characters (a newline), which the API refuses, has
  each of them written as its Unicode control picture (``"s\\n1"`` as ``"s\\u240a1"``,
  shown as ``s␊1``): a printable id, the same for every line of that session (its turns,
  episodes, cursor, working memory), with ``~2`` (``~3``...) added when another stored id
  already is that (:class:`Ids`), and named in one warning;
- a time outside 1900-01-01..2200-01-01 (milliseconds) is written at the nearest end of that
  range, as the LangGraph store shows it.

Anything else the import would refuse leaves its line out of the export, with a warning
(:func:`~.portable.export_lines`): never a line that fails the restore.
"""

from __future__ import annotations

import logging
from typing import Any

from .validation import CONTROL, nearest_time

log = logging.getLogger("tiered_memory")
ID_KEYS = ("user_id", "session_id")
# the time fields of the records a line holds (Fact, FactChange, Episode, Item, ArchivedTurn,
# WorkingItem, SessionPad, AuditEntry) and of a message and an item line
TIME_KEYS = frozenset({"timestamp", "created_at", "updated_at", "valid_from", "invalid_at", "last_access", "start",
                       "end", "promoted_at", "compressed_at", "expires_at", "archived_at", "at"})


def printable_id(value: str) -> str:
    """``value`` with each control character (as :func:`~.validation.check_id` counts them)
    replaced by its Unicode control picture (U+2400-U+241F, U+2421 for DEL)."""
    return CONTROL.sub(lambda m: chr(0x2400 + ord(m.group())) if m.group() != "\x7f" else "\u2421", value)


PICTURES = frozenset(printable_id("".join(map(chr, [*range(32), 127]))))


def row_name(line: dict[str, Any]) -> object:
    """What names a line's row in a warning: its id (an audit entry's item, a session's pad or cursor)."""
    record = line.get(line["type"])
    named = record if isinstance(record, dict) else line
    return next((named[k] for k in ("id", "fact_id", "item_id", "session_id") if k in named), None)


class Ids:
    """The id each user or session id holding control characters is written as in one export:
    :func:`printable_id`, or that with ``~2``, ``~3``... when a stored id of the same key
    (``stored``) is already that, so the rows of two ids never merge on import. A stored id can
    be one only if it spells a control picture: :attr:`pictured` collects those an export
    wrote, and :meth:`collided` says whether one is the id written for another (the export is
    then written again, with ``stored=pictured``). Each rewritten id is said once, not per line."""

    def __init__(self, stored: dict[str, set[str]] | None = None) -> None:
        self.stored = stored or {}
        self.pictured: dict[str, set[str]] = {k: set() for k in ID_KEYS}
        self.names: dict[tuple[str, str], str] = {}

    def written(self, key: str, value: str) -> str:
        name = self.names.get((key, value))
        if name is not None:
            return name
        name = printable_id(value)
        if name == value:
            if not PICTURES.isdisjoint(value):
                self.pictured[key].add(value)
            return value
        taken = self.stored.get(key, set()) | {n for (k, _), n in self.names.items() if k == key}
        base, n = name, 1
        while name in taken:
            n += 1
            name = f"{base}~{n}"
        self.names[(key, value)] = name
        log.warning("export: the %s %r, which import_jsonl refuses, is written as %r on each of its lines",
                    key, value, name)
        return name

    def collided(self) -> bool:
        return any(name in self.pictured[key] for (key, _), name in self.names.items())


def importable(line: dict[str, Any], ids: Ids) -> dict[str, Any]:
    """``line`` (a fresh export line, changed in place) with its ids and times as the import
    takes them; see the module docstring."""
    kind = line["type"]
    record = line.get(kind)
    name = row_name(line)
    for fields in (line, record, *line.get("history", ())):
        if not isinstance(fields, dict):
            continue
        for key, value in fields.items():
            if key in ID_KEYS and kind != "item" and isinstance(value, str):  # an item's owner may be SHARED_OWNER
                fields[key] = ids.written(key, value)
            elif key in TIME_KEYS and isinstance(value, float) and value != nearest_time(value):
                fields[key] = nearest_time(value)
                log.warning("export: the %s %r holds %s %r, which import_jsonl refuses; written as %r",
                            kind, name, key, value, fields[key])
    return line
