"""A line of a JSONL dump read back as its record, and checked (pure): a message line here,
the layer lines through :mod:`.portable_layers`. The import (:func:`~.portable.import_jsonl`)
reads every line so before it writes anything, and the export (:func:`~.portable.export_lines`)
checks each line it writes the same way, so it never writes one the import would refuse.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import InvalidInputError
from .portable_layers import (CursorRecord, EpisodeRecord, FactRecord, HistoryRecord, ItemRecord, parse_archived,
                              parse_audit, parse_cursor, parse_episode, parse_fact, parse_history, parse_item,
                              parse_scratchpad, parse_working)
from .records import ArchivedTurn, AuditEntry, SessionPad, WorkingItem
from .types import StoredMessage
from .validation import check_id, check_message_id, normalize_message


FORMAT = "tiered-memory/1"  # every line's "format"


def check_format(obj: dict[str, Any]) -> None:
    """Refuse a line another version of the format wrote (its fields may mean something else);
    a line with no ``format`` (written by hand) is read as this version's."""
    version = obj.get("format", FORMAT)
    if version != FORMAT:
        shown = repr(version) if len(repr(version)) <= 60 else repr(version)[:60] + "..."
        raise InvalidInputError(f"format {shown} is not {FORMAT!r}, the one this version of tiered-memory "
                                "reads: import the file with the version that wrote it, or a later one")


def _load(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"not JSON ({e.msg})") from e
    except (ValueError, RecursionError) as e:  # an int of 4,300+ digits; arrays nested past the stack
        raise InvalidInputError(f"not JSON this library can read ({type(e).__name__}: {str(e)[:200]})") from e


def _message(obj: dict[str, Any], *, max_chars: int, max_metadata_bytes: int) -> dict[str, Any]:
    for key in ("user_id", "session_id"):
        check_id(obj.get(key), key)
    check_message_id(obj.get("id"))
    msg = normalize_message(
        {k: obj.get(k) for k in ("role", "content", "metadata", "timestamp")},
        max_chars=max_chars, max_metadata_bytes=max_metadata_bytes, now=0.0,
    )
    if obj.get("timestamp") is None:
        raise InvalidInputError("timestamp is required")
    return {"id": obj["id"], "user_id": obj["user_id"], "session_id": obj["session_id"],
            "role": msg.role, "content": msg.content, "metadata": dict(msg.metadata or {}),
            "timestamp": msg.timestamp}


def parse_line(raw: str, *, max_chars: int, max_metadata_bytes: int) -> dict[str, Any]:
    """Validate one message line (pure); raises InvalidInputError."""
    obj = _load(raw)
    if not isinstance(obj, dict) or obj.get("type") != "message":
        raise InvalidInputError("expected an object with type 'message'")
    check_format(obj)
    return _message(obj, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes)


Record = (StoredMessage | FactRecord | HistoryRecord | EpisodeRecord | CursorRecord | ItemRecord | ArchivedTurn
          | WorkingItem | SessionPad | AuditEntry)
KINDS = ("message", "fact", "fact_history", "episode", "cursor", "item", "archived", "working", "scratchpad", "audit")


def parse_record(raw: str, *, max_chars: int, max_metadata_bytes: int, layers: bool = True) -> Record:
    """Validate one line of any type (pure); raises InvalidInputError. ``layers=False``: the
    record store keeps no memory layers, so every line but a message's is invalid."""
    return parse_object(_load(raw), max_chars=max_chars, max_metadata_bytes=max_metadata_bytes, layers=layers)


def parse_object(obj: object, *, max_chars: int, max_metadata_bytes: int, layers: bool = True) -> Record:
    """:func:`parse_record` of a line already decoded from JSON."""
    kind = obj.get("type") if isinstance(obj, dict) else None
    if not isinstance(obj, dict) or kind not in KINDS:
        raise InvalidInputError("expected an object with type " + ", ".join(map(repr, KINDS[:-1]))
                                + f" or {KINDS[-1]!r}")
    check_format(obj)
    if kind == "message":
        return StoredMessage(**_message(obj, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes))
    if not layers:
        raise InvalidInputError(f"this memory's record store keeps no facts, episodes, items, archived turns or "
                                f"working memory; cannot import a {kind}")
    if kind == "item":
        return parse_item(obj)
    if kind == "working":
        return parse_working(obj)
    if kind == "scratchpad":
        return parse_scratchpad(obj)
    if kind == "archived":
        return parse_archived(obj, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes)
    if kind == "fact_history":
        return parse_history(obj, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes)
    if kind == "audit":
        return parse_audit(obj, max_metadata_bytes=max_metadata_bytes)
    if kind == "cursor":
        return parse_cursor(obj)
    parse = parse_fact if kind == "fact" else parse_episode
    return parse(obj, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes)
