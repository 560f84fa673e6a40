"""JSONL lines of the memory layers: facts (with their history), episodes (with their
key points), how far episodes cover each session, store items, archived turns and working
memory (items and scratchpads), as :mod:`.portable` writes and reads them. Pure: records
to line objects and back, every field checked.

A fact line is ``{"format", "type": "fact", "fact": {every field of Fact}, "history":
[{every field of FactChange, "seq"}, ...]}``: ``seq`` is the entry's place in its user's
history (0 first; the dump groups it by fact), which the import writes it back in (an export
before 2026-12 has none: its entries are written by time); an episode line is ``{"format", "type":
"episode", "episode": {every field of Episode}, "points": [key point texts]}``; an item
line (the LangGraph store) is ``{"format", "type": "item", "item": {every field of Item,
the namespace as a list}, "ttl_minutes": number or null, "expires_at": number or null}``; an
archived turn is ``{"format", "type": "archived", "archived": {every field of ArchivedTurn}}``,
a working-memory item ``{"format", "type": "working", "working": {every field of
WorkingItem but the ranking ``score``}}`` and a scratchpad ``{"format", "type":
"scratchpad", "scratchpad": {every field of SessionPad}}``. The history of a fact the dump
holds no line for (deleted, or hidden by a merge or a prune) is ``{"format", "type":
"fact_history", "user_id", "fact_id", "history": [{every field of FactChange, "seq"}, ...]}``, and
an entry of the audit log ``{"format", "type": "audit", "audit": {every field of AuditEntry}}``.
How far ``end_session`` has summarised a session is ``{"format", "type": "cursor", "cursor":
{"user_id", "session_id", "through"}}``: ``through`` is the id of the last turn it covers (a
message's seq is its own store's, so a line names the turn instead). The
record sits under its own key because ``Fact.type`` (``"preference"``...) would
otherwise collide with the line's ``type``. Vectors are never in a line: they are
recomputed on import. A parsed line is a record a store can hold and read back: no NaN
or infinite time, no bool where a number goes, no NaN or NUL inside metadata, texts
within the limits the layers write.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

from .errors import InvalidInputError
from .layers.item_rules import check_namespace, check_owner, check_ttl
from .layers.semantic import check_type
from .layers.working import check_note, check_pad_entry
from .records import AUDIT_LAYERS, ArchivedTurn, AuditEntry, Episode, Fact, FactChange, Item, SessionPad, WorkingItem
from .validation import (MAX_COUNT, MAX_ID_LENGTH, check_content, check_id, check_message_id, check_metadata,
                         check_optional_id, check_role, check_text, check_unit, encodable, encode_json, to_epoch)

Numbered = tuple[int | None, FactChange]  # a history entry and its place in its user's history, if the line says
MAX_POINTS = 10_000  # key points, entities, source ids... of one record
# a stored fact's or episode's text: at most this many turns' worth. The extractive rules join
# up to three sentences of turns into a summary, consolidation promotes a summary to a fact, and
# a rule fact holds what a turn said: a bound every stored record stays within, still a bound
LAYER_TEXT_TURNS = 4


@dataclass(frozen=True, kw_only=True)
class FactRecord:
    fact: Fact
    history: list[Numbered]


@dataclass(frozen=True, kw_only=True)
class HistoryRecord:
    """The history of a fact that is no longer stored (deleted, merged or pruned)."""

    user_id: str
    fact_id: str
    history: list[Numbered]


@dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    episode: Episode
    points: list[str]


@dataclass(frozen=True, kw_only=True)
class CursorRecord:
    """How far episodes cover a session: up to and including the turn ``through``."""

    user_id: str
    session_id: str
    through: str


@dataclass(frozen=True, kw_only=True)
class ItemRecord:
    item: Item
    ttl_minutes: float | None
    expires_at: float | None


def fact_line(fact: Fact, history: Sequence[tuple[int, FactChange]], fmt: str) -> dict[str, Any]:
    """``history``: the fact's entries, each with its place in its user's history."""
    return {"format": fmt, "type": "fact", "fact": asdict(fact), "history": _entries(history)}


def history_line(user_id: str, fact_id: str, history: Sequence[tuple[int, FactChange]], fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "fact_history", "user_id": user_id, "fact_id": fact_id,
            "history": _entries(history)}


def _entries(history: Sequence[tuple[int, FactChange]]) -> list[dict[str, Any]]:
    return [{**asdict(c), "seq": n} for n, c in history]


def audit_line(entry: AuditEntry, fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "audit", "audit": asdict(entry)}


def episode_line(episode: Episode, points: Sequence[str], fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "episode", "episode": asdict(episode), "points": list(points)}


def item_line(item: Item, ttl_minutes: float | None, expires_at: float | None, fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "item", "item": {**asdict(item), "namespace": list(item.namespace)},
            "ttl_minutes": ttl_minutes, "expires_at": expires_at}


def archived_line(turn: ArchivedTurn, fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "archived", "archived": asdict(turn)}


def working_line(item: WorkingItem, fmt: str) -> dict[str, Any]:
    fields_ = asdict(item)
    del fields_["score"], fields_["evicted"]  # set by ranking and by remember, never stored
    return {"format": fmt, "type": "working", "working": fields_}


def scratchpad_line(pad: SessionPad, fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "scratchpad", "scratchpad": asdict(pad)}


def cursor_line(cursor: CursorRecord, fmt: str) -> dict[str, Any]:
    return {"format": fmt, "type": "cursor", "cursor": asdict(cursor)}


# ---- field checks ------------------------------------------------------------------
def _time(value: object, name: str, *, optional: bool = False) -> float | None:
    """Epoch seconds as a record stores them: a number (not a datetime or ISO text, which a
    record never holds), finite and in the range a message's timestamp is held to."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{name} must be a number of epoch seconds, got {value!r}")
    try:
        return to_epoch(value, 0.0)
    except InvalidInputError as e:
        raise InvalidInputError(f"{name}: {e}") from None


def _required_time(value: object, name: str) -> float:
    number = _time(value, name)
    assert number is not None
    return number


def _int(value: object, name: str, *, minimum: int, maximum: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInputError(f"{name} must be an int from {minimum} to {maximum}, got {value!r}")
    return value


def _text(value: object, name: str, max_chars: int, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    text = check_text(value, name)
    if len(text) > max_chars:
        raise InvalidInputError(f"{name} is {len(text):,} characters; the limit is {max_chars:,}")
    return text


def _strings(value: object, name: str, max_chars: int, *, ids: bool = False) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_POINTS:
        raise InvalidInputError(f"{name} must be a list of at most {MAX_POINTS:,} strings, got {type(value).__name__}")
    if ids:
        return [check_id(v, f"{name}[{n}]") for n, v in enumerate(value)]
    return [str(_text(v, f"{name}[{n}]", max_chars)) for n, v in enumerate(value)]


def _fields(obj: object, cls: type, name: str, required: Sequence[str]) -> Mapping[str, Any]:
    """``obj`` as a mapping with only the fields of ``cls`` and all of ``required``."""
    if not isinstance(obj, dict):
        raise InvalidInputError(f"{name} must be an object, got {type(obj).__name__}")
    unknown = set(obj) - {f.name for f in fields(cls)}
    if unknown:
        raise InvalidInputError(f"unknown {name} fields {sorted(unknown)}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise InvalidInputError(f"{name} needs {missing}")
    return obj


def _line_keys(obj: Mapping[str, Any], record: str, extra: str = "") -> None:
    unknown = set(obj) - {"format", "type", record, extra}
    if unknown:
        raise InvalidInputError(f"unknown {record} line fields {sorted(unknown)}")


# ---- lines to records ------------------------------------------------------------------
def parse_change(obj: object, fact_id: str, *, max_chars: int, max_metadata_bytes: int) -> Numbered:
    """A history entry and its place in its user's history (``None``: an export before they said)."""
    seq = None
    if isinstance(obj, dict) and "seq" in obj:
        seq = _int(obj["seq"], "history seq", minimum=0)
        obj = {k: v for k, v in obj.items() if k != "seq"}
    d = _fields(obj, FactChange, "history entry", ("fact_id", "action", "at"))
    if d["fact_id"] != fact_id:
        raise InvalidInputError(f"a history entry of fact {fact_id!r} names fact {d['fact_id']!r}")
    return seq, FactChange(fact_id=fact_id, action=str(_text(d["action"], "history action", MAX_ID_LENGTH)),
                      old_text=_text(d.get("old_text"), "history old_text", max_chars, optional=True),
                      new_text=_text(d.get("new_text"), "history new_text", max_chars, optional=True),
                      at=_required_time(d["at"], "history at"),
                      details=check_metadata(d.get("details"), max_metadata_bytes))


def parse_fact(obj: Mapping[str, Any], *, max_chars: int, max_metadata_bytes: int) -> FactRecord:
    """A ``fact`` line (already JSON) as a fact and its history; raises InvalidInputError."""
    _line_keys(obj, "fact", "history")
    d = _fields(obj.get("fact"), Fact, "fact", ("id", "user_id", "type", "text", "confidence"))
    max_chars = LAYER_TEXT_TURNS * max_chars  # not MAX_FACT_CHARS: promoted summaries and rule facts are longer
    fact_id = check_id(d["id"], "fact id")
    check_type(d["type"], optional=False)
    superseded = d.get("superseded_by")
    fact = Fact(
        id=fact_id, user_id=check_id(d["user_id"], "user_id"), type=d["type"], text=str(_text(d["text"], "fact text", max_chars)),
        confidence=check_unit(d["confidence"], "confidence"),
        source_ids=_strings(d.get("source_ids", []), "source_ids", max_chars, ids=True),
        metadata=check_metadata(d.get("metadata"), max_metadata_bytes),
        created_at=_required_time(d.get("created_at", 0.0), "created_at"),
        updated_at=_required_time(d.get("updated_at", 0.0), "updated_at"),
        valid_from=_required_time(d.get("valid_from", 0.0), "valid_from"),
        invalid_at=_time(d.get("invalid_at"), "invalid_at", optional=True),
        superseded_by=check_optional_id(superseded, "superseded_by"),
        access_count=_int(d.get("access_count", 0), "access_count", minimum=0),
        last_access=_time(d.get("last_access"), "last_access", optional=True),
        key=_text(d.get("key"), "key", max_chars, optional=True),
        polarity=_int(d.get("polarity", 1), "polarity", minimum=-1, maximum=1),
    )
    return FactRecord(fact=fact, history=_history(obj.get("history", []), fact_id, max_chars=max_chars,
                                                  max_metadata_bytes=max_metadata_bytes))


def _history(history: object, fact_id: str, *, max_chars: int, max_metadata_bytes: int) -> list[Numbered]:
    if not isinstance(history, list) or len(history) > MAX_POINTS:
        raise InvalidInputError(f"history must be a list of at most {MAX_POINTS:,} entries")
    return [parse_change(c, fact_id, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes) for c in history]


def parse_audit(obj: Mapping[str, Any], *, max_metadata_bytes: int) -> AuditEntry:
    """An ``audit`` line (already JSON) as an audit entry; raises InvalidInputError."""
    _line_keys(obj, "audit")
    d = _fields(obj.get("audit"), AuditEntry, "audit entry", ("user_id", "layer", "item_id", "action", "at"))
    if d["layer"] not in AUDIT_LAYERS:
        raise InvalidInputError(f"an audit entry's layer is one of {', '.join(AUDIT_LAYERS)}, not {d['layer']!r}")
    return AuditEntry(user_id=check_id(d["user_id"], "user_id"), layer=d["layer"],
                      item_id=check_id(d["item_id"], "audit item_id"),
                      action=str(_text(d["action"], "audit action", MAX_ID_LENGTH)),
                      at=_required_time(d["at"], "audit at"), details=check_metadata(d.get("details"), max_metadata_bytes))


def parse_history(obj: Mapping[str, Any], *, max_chars: int, max_metadata_bytes: int) -> HistoryRecord:
    """A ``fact_history`` line (already JSON): the history of a fact no longer stored."""
    unknown = set(obj) - {"format", "type", "user_id", "fact_id", "history"}
    if unknown:
        raise InvalidInputError(f"unknown fact_history line fields {sorted(unknown)}")
    fact_id = check_id(obj.get("fact_id"), "fact_id")
    history = _history(obj.get("history"), fact_id, max_chars=LAYER_TEXT_TURNS * max_chars,
                       max_metadata_bytes=max_metadata_bytes)
    if not history:
        raise InvalidInputError(f"the fact_history line of fact {fact_id!r} holds no entry")
    return HistoryRecord(user_id=check_id(obj.get("user_id"), "user_id"), fact_id=fact_id, history=history)


def parse_episode(obj: Mapping[str, Any], *, max_chars: int, max_metadata_bytes: int) -> EpisodeRecord:
    """An ``episode`` line (already JSON) as an episode and its key points; raises
    InvalidInputError. Without ``points``, they are the episode's :meth:`~Episode.key_points`."""
    _line_keys(obj, "episode", "points")
    d = _fields(obj.get("episode"), Episode, "episode", ("id", "user_id", "session_id", "summary"))
    max_chars = LAYER_TEXT_TURNS * max_chars
    lists = {k: _strings(d.get(k, []), k, max_chars) for k in ("entities", "decisions", "open_questions", "key_facts")}
    episode = Episode(
        id=check_id(d["id"], "episode id"), user_id=check_id(d["user_id"], "user_id"),
        session_id=check_id(d["session_id"], "session_id"), summary=str(_text(d["summary"], "summary", max_chars)),
        **lists, turn_count=_int(d.get("turn_count", 0), "turn_count", minimum=0),
        start=_required_time(d.get("start", 0.0), "start"), end=_required_time(d.get("end", 0.0), "end"),
        source_ids=_strings(d.get("source_ids", []), "source_ids", max_chars, ids=True),
        metadata=check_metadata(d.get("metadata"), max_metadata_bytes),
        created_at=_required_time(d.get("created_at", 0.0), "created_at"),
        access_count=_int(d.get("access_count", 0), "access_count", minimum=0),
        last_access=_time(d.get("last_access"), "last_access", optional=True),
        promoted_at=_time(d.get("promoted_at"), "promoted_at", optional=True),
        compressed_at=_time(d.get("compressed_at"), "compressed_at", optional=True),
    )
    points = obj.get("points")
    return EpisodeRecord(episode=episode, points=episode.key_points() if points is None
                         else _strings(points, "points", max_chars))


def _item_key(value: object) -> str:
    """As ``ItemStore.write_many`` takes it: a non-empty str (that a store can hold)."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"item key must be a non-empty string, got {value!r}")
    if "\x00" in value or not encodable(value):
        raise InvalidInputError("item key must not hold NUL or lone surrogates")
    return value


def parse_item(obj: Mapping[str, Any]) -> ItemRecord:
    """An ``item`` line (already JSON) as an item with its TTL and expiry; raises
    InvalidInputError. The owner may be :data:`~.layers.item_rules.SHARED_OWNER`."""
    unknown = set(obj) - {"format", "type", "item", "ttl_minutes", "expires_at"}
    if unknown:
        raise InvalidInputError(f"unknown item line fields {sorted(unknown)}")
    d = _fields(obj.get("item"), Item, "item", ("id", "user_id", "namespace", "key", "value"))
    value = d["value"]
    if not isinstance(value, dict):
        raise InvalidInputError(f"item value must be an object, got {type(value).__name__}")
    encode_json(value, "item value")
    item = Item(id=check_id(d["id"], "item id"), user_id=check_owner(d["user_id"]),
                namespace=check_namespace(d["namespace"]), key=_item_key(d["key"]), value=value,
                # as ItemStore.write_many: any stored text, no length limit
                text=None if d.get("text") is None else check_text(d["text"], "item text"),
                created_at=_required_time(d.get("created_at", 0.0), "created_at"),
                updated_at=_required_time(d.get("updated_at", 0.0), "updated_at"))
    return ItemRecord(item=item, ttl_minutes=check_ttl(obj.get("ttl_minutes")),
                      expires_at=_time(obj.get("expires_at"), "expires_at", optional=True))


def parse_archived(obj: Mapping[str, Any], *, max_chars: int, max_metadata_bytes: int) -> ArchivedTurn:
    """An ``archived`` line (already JSON) as the turn it holds: checked as a message line is,
    with its time as a record holds it; raises InvalidInputError."""
    _line_keys(obj, "archived")
    d = _fields(obj.get("archived"), ArchivedTurn, "archived turn",
                ("id", "user_id", "session_id", "role", "content", "timestamp", "archived_at"))
    episode_id = d.get("episode_id")
    return ArchivedTurn(id=check_message_id(d["id"]), user_id=check_id(d["user_id"], "user_id"),
                        session_id=check_id(d["session_id"], "session_id"), role=check_role(d["role"]),
                        content=check_content(d["content"], max_chars),
                        metadata=check_metadata(d.get("metadata"), max_metadata_bytes),
                        timestamp=_required_time(d["timestamp"], "timestamp"),
                        episode_id=check_optional_id(episode_id, "episode_id"),
                        archived_at=_required_time(d["archived_at"], "archived_at"))


def parse_working(obj: Mapping[str, Any]) -> WorkingItem:
    """A ``working`` line (already JSON) as a working-memory item, held to what
    :meth:`~.layers.working.WorkingMemory.remember` writes; raises InvalidInputError."""
    _line_keys(obj, "working")
    d = _fields(obj.get("working"), WorkingItem, "working item", ("id", "user_id", "session_id", "text"))
    if transient := sorted({"score", "evicted"} & set(d)):
        raise InvalidInputError(f"unknown working item fields {transient} (set by ranking and by remember, "
                                "never stored)")
    text, type_, importance, metadata = check_note(d["text"], d.get("type", "note"), d.get("importance", 0.5),
                                                   d.get("metadata"))
    return WorkingItem(id=check_id(d["id"], "working item id"), user_id=check_id(d["user_id"], "user_id"),
                       session_id=check_id(d["session_id"], "session_id"), text=text, type=type_,
                       importance=importance, created_at=_required_time(d.get("created_at", 0.0), "created_at"),
                       metadata=metadata, access_count=_int(d.get("access_count", 0), "access_count", minimum=0))


def parse_scratchpad(obj: Mapping[str, Any]) -> SessionPad:
    """A ``scratchpad`` line (already JSON) as a session's scratchpad, each entry held to what
    a scratchpad write takes; raises InvalidInputError."""
    _line_keys(obj, "scratchpad")
    d = _fields(obj.get("scratchpad"), SessionPad, "scratchpad", ("user_id", "session_id", "data", "updated_at"))
    data = d["data"]
    if not isinstance(data, dict):
        raise InvalidInputError(f"scratchpad data must be an object, got {type(data).__name__}")
    return SessionPad(user_id=check_id(d["user_id"], "user_id"), session_id=check_id(d["session_id"], "session_id"),
                      data={key: check_pad_entry(key, value) for key, value in data.items()},
                      updated_at=_required_time(d["updated_at"], "updated_at"))


def parse_cursor(obj: Mapping[str, Any]) -> CursorRecord:
    """A ``cursor`` line (already JSON) as the session and the id of the last turn its
    episodes cover; raises InvalidInputError."""
    _line_keys(obj, "cursor")
    d = _fields(obj.get("cursor"), CursorRecord, "cursor", ("user_id", "session_id", "through"))
    return CursorRecord(user_id=check_id(d["user_id"], "user_id"), session_id=check_id(d["session_id"], "session_id"),
                        through=check_message_id(d["through"]))
