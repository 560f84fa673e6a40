"""Row <-> record mapping of the layer tables, written once for every SQL dialect (pure).

Each ``*_COLS`` string is the column list a mapper reads, in order; a query selects
exactly those columns (plus, where noted, a trailing ``vector``), so a mapper and the
queries using it cannot drift apart. JSON columns hold UTF-8 JSON text, vectors are
float32 bytes.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

import numpy as np

from ..records import ArchivedTurn, Episode, Fact, FactChange, Item, SessionPad, WorkingItem

Row = Sequence[Any]

FACT_COLS = ("id, user_id, type, text, confidence, source_ids, metadata, created_at, updated_at, valid_from,"
             " invalid_at, superseded_by, access_count, last_access, key, polarity")
EPISODE_COLS = ("id, user_id, session_id, summary, body, turn_count, start_ts, end_ts, source_ids, metadata,"
                " created_at, access_count, last_access, promoted_at, compressed_at")
WORKING_COLS = "id, user_id, session_id, text, type, importance, created_at, metadata, access_count"
ITEM_COLS = "id, user_id, namespace, key, value, text, created_at, updated_at"
HISTORY_COLS = "fact_id, action, old_text, new_text, at, details"
ARCHIVE_COLS = "id, user_id, session_id, role, content, metadata, timestamp, episode_id, archived_at"
PAD_COLS = "user_id, session_id, data, updated_at"

_ESC = "\x1e"
_SEP = "\x1f"  # labels are stored as label + US, so a prefix of labels is a prefix of text


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def to_blob(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()


def from_blob(blob: bytes | memoryview | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(bytes(blob), dtype=np.float32)


def marks(n: int) -> str:
    """``?,?,...`` for ``n`` parameters."""
    return ",".join("?" * n)


ID_BATCH = 500  # ids per IN (...) list


def id_batches(ids: Sequence[str]) -> Iterator[list[str]]:
    """``ids`` in order, :data:`ID_BATCH` at a time: one ``IN (...)`` list each (pure)."""
    for start in range(0, len(ids), ID_BATCH):
        yield list(ids[start:start + ID_BATCH])


def live(sql: str, params: list[Any], live_at: float | None) -> tuple[str, list[Any]]:
    """``sql`` (ending in a WHERE clause) narrowed to items not expired at ``live_at``."""
    if live_at is None:
        return sql, params
    return sql + " AND (expires_at IS NULL OR expires_at > ?)", [*params, live_at]


def ns_path(namespace: Sequence[str]) -> str:
    """A namespace as prefix-matchable text: a prefix of labels is a prefix of the path."""
    # labels may hold any character but NUL: escape the separator (and the escape) inside a
    # label, so ("a\x1fb",) never reads as ("a", "b"); labels without either encode as before
    return "".join(label.replace(_ESC, _ESC + "1").replace(_SEP, _ESC + "2") + _SEP for label in namespace)


def fact_from_row(r: Row) -> Fact:
    return Fact(id=r[0], user_id=r[1], type=r[2], text=r[3], confidence=r[4], source_ids=json.loads(r[5]),
                metadata=json.loads(r[6]), created_at=r[7], updated_at=r[8], valid_from=r[9],
                invalid_at=r[10], superseded_by=r[11], access_count=r[12], last_access=r[13],
                key=r[14], polarity=r[15])


def fact_to_row(f: Fact) -> tuple[Any, ...]:
    return (f.id, f.user_id, f.type, f.text, f.confidence, dumps(f.source_ids), dumps(f.metadata), f.created_at,
            f.updated_at, f.valid_from, f.invalid_at, f.superseded_by, f.access_count, f.last_access, f.key,
            f.polarity)


def change_from_row(r: Row) -> FactChange:
    return FactChange(fact_id=r[0], action=r[1], old_text=r[2], new_text=r[3], at=r[4], details=json.loads(r[5]))


def episode_from_row(r: Row) -> Episode:
    body = json.loads(r[4])
    return Episode(id=r[0], user_id=r[1], session_id=r[2], summary=r[3], entities=body.get("entities", []),
                   decisions=body.get("decisions", []), open_questions=body.get("open_questions", []),
                   key_facts=body.get("key_facts", []), turn_count=r[5], start=r[6], end=r[7],
                   source_ids=json.loads(r[8]), metadata=json.loads(r[9]), created_at=r[10],
                   access_count=r[11], last_access=r[12], promoted_at=r[13], compressed_at=r[14])


def episode_to_row(e: Episode) -> tuple[Any, ...]:
    body = {"entities": e.entities, "decisions": e.decisions, "open_questions": e.open_questions,
            "key_facts": e.key_facts}
    return (e.id, e.user_id, e.session_id, e.summary, dumps(body), e.turn_count, e.start, e.end,
            dumps(e.source_ids), dumps(e.metadata), e.created_at, e.access_count, e.last_access, e.promoted_at,
            e.compressed_at)


def working_from_row(r: Row) -> WorkingItem:
    return WorkingItem(id=r[0], user_id=r[1], session_id=r[2], text=r[3], type=r[4], importance=r[5],
                       created_at=r[6], metadata=json.loads(r[7]), access_count=r[8])


def working_to_row(i: WorkingItem) -> tuple[Any, ...]:
    return (i.id, i.user_id, i.session_id, i.text, i.type, i.importance, i.created_at, dumps(i.metadata),
            i.access_count)


def archived_from_row(r: Row) -> ArchivedTurn:
    return ArchivedTurn(id=r[0], user_id=r[1], session_id=r[2], role=r[3], content=r[4], metadata=json.loads(r[5]),
                        timestamp=r[6], episode_id=r[7], archived_at=r[8])


def archived_to_row(t: ArchivedTurn) -> tuple[Any, ...]:
    return (t.id, t.user_id, t.session_id, t.role, t.content, dumps(t.metadata), t.timestamp, t.episode_id,
            t.archived_at)


def pad_from_row(r: Row) -> SessionPad:
    return SessionPad(user_id=r[0], session_id=r[1], data=json.loads(r[2]), updated_at=r[3])


def item_from_row(r: Row) -> Item:
    return Item(id=r[0], user_id=r[1], namespace=tuple(json.loads(r[2])), key=r[3],
                value=json.loads(r[4]), text=r[5], created_at=r[6], updated_at=r[7])
