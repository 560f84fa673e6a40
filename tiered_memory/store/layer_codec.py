"""Row <-> record mapping of the layer tables, written once for every SQL dialect (pure).

Each ``*_COLS`` string is the column list a mapper reads, in order; a query selects
exactly those columns (plus, where noted, a trailing ``vector``), so a mapper and the
queries using it cannot drift apart. JSON columns hold UTF-8 JSON text, vectors are
float32 bytes; a mapper reads each value through :mod:`.stored_values`, so a row another
writer left malformed is read sanitised (and logged), never raised on.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

import numpy as np

from ..records import ArchivedTurn, Episode, Fact, FactChange, Item, SessionPad, WorkingItem
from .repositories import ItemCursor
from .stored_values import count, json_dict, json_list, number, optional_number, strings, text

Row = Sequence[Any]

FACT_COLS = ("id, user_id, type, text, confidence, source_ids, metadata, created_at, updated_at, valid_from,"
             " invalid_at, superseded_by, access_count, last_access, key, polarity")
EPISODE_COLS = ("id, user_id, session_id, summary, body, turn_count, start_ts, end_ts, source_ids, metadata,"
                " created_at, access_count, last_access, promoted_at, compressed_at")
WORKING_COLS = "id, user_id, session_id, text, type, importance, created_at, metadata, access_count"
ITEM_COLS = "id, user_id, namespace, key, value, text, created_at, updated_at"
PAGE_COLS = f"{ITEM_COLS}, updated_at, rowid"  # a listing page's: an item's, then its cursor
HISTORY_COLS = "fact_id, action, old_text, new_text, at, details"
ARCHIVE_COLS = "id, user_id, session_id, role, content, metadata, timestamp, episode_id, archived_at"
PAD_COLS = "user_id, session_id, data, updated_at"

_ESC = "\x1e"
_SEP = "\x1f"  # labels are stored as label + US, so a prefix of labels is a prefix of text


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def to_blob(vector: np.ndarray | None) -> bytes | None:
    return None if vector is None else np.asarray(vector, dtype=np.float32).tobytes()


def from_blob(blob: object) -> np.ndarray | None:
    """A stored vector; ``None`` (missing, so embedded again) unless it is float32 bytes."""
    if not isinstance(blob, (bytes, memoryview)) or len(blob) % 4 or not len(blob):
        return None
    return np.frombuffer(bytes(blob), dtype=np.float32)


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


def prefix_sql(prefix: Sequence[str], dialect: str = "sqlite", part: str = "all") -> tuple[str, list[Any]]:
    """``ns_path`` starting with ``prefix``'s path, as conditions the ``items_listing`` index serves
    (``substr`` could use no index: every listing read the whole table). ``part`` is ``"all"``, the
    namespace itself (``"exact"``: an equality, whose rows the index holds in the listing's order) or
    those below it (``"deeper"``). The path ends with the separator: the paths that start with it are
    those from it up to, not including, the same text ending with the next character. PostgreSQL
    compares them in code-point order (``COLLATE "C"``, as its index is built), whatever the
    database's collation."""
    if not prefix:
        return ("1=0", []) if part == "exact" else ("1=1", [])
    path, column = ns_path(prefix), ns_column(dialect)
    if part == "exact":
        return f"{column} = ?", [path]
    return f"{column} {'>' if part == 'deeper' else '>='} ? AND {column} < ?", [path, past_prefix(path)]


def ns_column(dialect: str) -> str:
    """``ns_path`` as the ``items_listing`` index compares it: in code-point order on PostgreSQL."""
    return 'ns_path COLLATE "C"' if dialect == "postgres" else "ns_path"


def past_prefix(path: str) -> str:
    """The least text after every path starting with ``path`` (which ends with the separator)."""
    return path[:-1] + chr(ord(_SEP) + 1)


def items_under_sql(prefix: Sequence[str], columns: str = ITEM_COLS, dialect: str = "sqlite", part: str = "all"
                    ) -> tuple[str, list[Any]]:
    """The items whose namespace starts with ``prefix`` (a query ending in its WHERE clause)."""
    where, params = prefix_sql(prefix, dialect, part)
    return f"SELECT {columns} FROM items WHERE {where}", params


#: keyset paging: the rows after a page's last (``after``, :func:`past`), so a row written meanwhile
#: moves no other row to another page; written so that the index's updated_at is a range (the pages
#: after the first skip nothing)
PAST = " updated_at <= ? AND (updated_at < ? OR rowid < ?)"


def past(after: ItemCursor) -> list[Any]:
    """The parameters of :data:`PAST` for the cursor ``after`` (updated_at, rowid)."""
    return [after[0], *after]


def items_page_sql(prefix: Sequence[str], limit: int, after: ItemCursor | None,
                   live_at: float | None, dialect: str = "sqlite",
                   where: tuple[str, list[Any]] = ("", []), part: str = "all") -> tuple[str, list[Any]]:
    """Up to ``limit`` items under ``prefix`` past ``after``, in LangGraph's order (newest
    ``updated_at`` first; among equal times, the last inserted first), each row ending with its
    cursor: a page of the listing, read with ``LIMIT`` in the database, not filtered in Python.
    ``where`` is more ``" AND ..."`` conditions (a filter's, :mod:`.item_filter_sql`); ``part`` as
    for :func:`prefix_sql`."""
    return _page(items_under_sql(prefix, PAGE_COLS, dialect, part), limit, after, live_at, where)


def _page(rows: tuple[str, list[Any]], limit: int, after: ItemCursor | None, live_at: float | None,
          where: tuple[str, list[Any]]) -> tuple[str, list[Any]]:
    """``rows`` (a query ending in its WHERE clause) past ``after``, narrowed by ``where`` and
    ``live_at`` (:func:`_past`), newest first, up to ``limit``."""
    sql, params = _past(rows, after, live_at, where)
    return sql + " ORDER BY updated_at DESC, rowid DESC LIMIT ?", [*params, int(limit)]


def _past(rows: tuple[str, list[Any]], after: ItemCursor | None, live_at: float | None,
          where: tuple[str, list[Any]]) -> tuple[str, list[Any]]:
    """``rows`` (a query ending in its WHERE clause) past ``after``, narrowed by ``where`` and ``live_at``."""
    sql, params = rows
    if after is not None:
        sql, params = sql + " AND" + PAST, [*params, *past(after)]
    return live(sql + where[0], [*params, *where[1]], live_at)


# a page's rows sorted by their cursor, the last two of PAGE_COLS, by position: a compound statement's
# ORDER BY names its result's columns
_CURSOR_AT = len(PAGE_COLS.split(",")) - 1  # updated_at's position, counted from 1
_BY_CURSOR = f"ORDER BY {_CURSOR_AT} DESC, {_CURSOR_AT + 1} DESC"


def namespaces_below_sql(prefix: Sequence[str], most: int, dialect: str = "sqlite") -> tuple[str, list[Any]]:
    """The ``ns_path`` of up to ``most`` namespaces below ``prefix`` (not itself), in the index's
    order: one seek of ``items_listing`` each, to the next path past the last (a loose index scan),
    not a read of the range's rows. ``prefix`` is not empty."""
    path, column = ns_path(prefix), ns_column(dialect)
    first = f"SELECT {column} FROM items WHERE {column} > {{}} AND {column} < ? ORDER BY {column} LIMIT 1"
    sql = (f"WITH RECURSIVE below(path, n) AS (SELECT ({first.format('?')}), 1 UNION ALL"
           f" SELECT ({first.format('below.path')}), n + 1 FROM below WHERE path IS NOT NULL AND n < ?)"
           " SELECT path FROM below WHERE path IS NOT NULL")
    return sql, [path, past_prefix(path), past_prefix(path), int(most)]


def items_merged_sql(paths: Sequence[str], limit: int, after: ItemCursor | None, live_at: float | None,
                     dialect: str = "sqlite", where: tuple[str, list[Any]] = ("", [])) -> tuple[str, list[Any]]:
    """:func:`items_page_sql` over the namespaces whose ``ns_path`` are ``paths`` (at least one):
    each namespace's rows read in ``items_listing``'s order (a seek, no sort) and merged in the
    listing's order up to the page, so a page reads about ``limit`` rows plus one a namespace,
    wherever it lies in the listing. (Without range statistics, SQLite read the range of several
    namespaces whole and sorted it.)"""
    arm, params = _past((f"SELECT {PAGE_COLS} FROM items WHERE {ns_column(dialect)} = ?", []), after, live_at, where)
    return (" UNION ALL ".join([arm] * len(paths)) + f" {_BY_CURSOR} LIMIT ?",
            [*(p for path in paths for p in (path, *params)), int(limit)])


def items_lateral_sql(paths: Sequence[str], limit: int, after: ItemCursor | None, live_at: float | None,
                      where: tuple[str, list[Any]] = ("", [])) -> tuple[str, list[Any]]:
    """:func:`items_merged_sql` as PostgreSQL plans it well: each namespace's page read by a seek
    of ``items_listing`` (a ``LATERAL`` subquery a namespace, in the listing's order, no sort), then
    the pages' rows, at most ``limit`` a namespace, sorted to the page. The compound statement
    became an Append of each namespace's rows past ``after`` and a sort of them all."""
    arm, params = _page((f"SELECT {PAGE_COLS} FROM items WHERE {ns_column('postgres')} = below.path", []),
                        limit, after, live_at, where)
    return (f"SELECT page.* FROM unnest(CAST(? AS text[])) AS below(path) CROSS JOIN LATERAL ({arm}) AS page"
            f" {_BY_CURSOR} LIMIT ?", [list(paths), *params, int(limit)])


def items_recent_sql(prefix: Sequence[str], limit: int, after: ItemCursor | None, live_at: float | None,
                     dialect: str = "sqlite", where: tuple[str, list[Any]] = ("", []), scan: int = 1000
                     ) -> tuple[str, list[Any]]:
    """:func:`items_page_sql`'s ``"deeper"`` part read from the newest ``scan`` rows past ``after``
    in the ``items_recent`` index's order (the listing's), not from the prefix's range: SQLite keeps
    no range statistics, so for a range of many namespaces it read the whole range and sorted it. A
    page it fills is the part's page (every row it did not read is older); one it does not fill
    tells nothing, and the caller reads the range."""
    recent, recent_params = "SELECT rowid FROM items", list[Any]()
    if after is not None:
        recent, recent_params = recent + " WHERE" + PAST, past(after)
    sql, params = items_under_sql(prefix, PAGE_COLS, dialect, "deeper")
    sql += f" AND rowid IN ({recent} ORDER BY updated_at DESC, rowid DESC LIMIT ?)"
    sql, params = live(sql + where[0], [*params, *recent_params, int(scan), *where[1]], live_at)
    return sql + " ORDER BY updated_at DESC, rowid DESC LIMIT ?", [*params, int(limit)]


def ns_path(namespace: Sequence[str]) -> str:
    """A namespace as prefix-matchable text: a prefix of labels is a prefix of the path."""
    # labels may hold any character but NUL: escape the separator (and the escape) inside a
    # label, so ("a\x1fb",) never reads as ("a", "b"); labels without either encode as before
    return "".join(label.replace(_ESC, _ESC + "1").replace(_SEP, _ESC + "2") + _SEP for label in namespace)


def fact_from_row(r: Row) -> Fact:
    t, i = "facts", r[0]
    return Fact(id=i, user_id=r[1], type=text(r[2], t, i, "type"), text=text(r[3], t, i, "text"),
                confidence=number(r[4], t, i, "confidence"),
                source_ids=strings(json_list(r[5], t, i, "source_ids"), t, i, "source_ids"),
                metadata=json_dict(r[6], t, i, "metadata"), created_at=number(r[7], t, i, "created_at"),
                updated_at=number(r[8], t, i, "updated_at"), valid_from=number(r[9], t, i, "valid_from"),
                invalid_at=optional_number(r[10], t, i, "invalid_at"), superseded_by=r[11],
                access_count=count(r[12], t, i, "access_count"),
                last_access=optional_number(r[13], t, i, "last_access"),
                key=None if r[14] is None else text(r[14], t, i, "key"), polarity=count(r[15], t, i, "polarity", 1))


def fact_to_row(f: Fact) -> tuple[Any, ...]:
    return (f.id, f.user_id, f.type, f.text, f.confidence, dumps(f.source_ids), dumps(f.metadata), f.created_at,
            f.updated_at, f.valid_from, f.invalid_at, f.superseded_by, f.access_count, f.last_access, f.key,
            f.polarity)


def change_from_row(r: Row) -> FactChange:
    t, i = "fact_history", r[0]
    return FactChange(fact_id=i, action=r[1], old_text=r[2], new_text=r[3], at=number(r[4], t, i, "at"),
                      details=json_dict(r[5], t, i, "details"))


def episode_from_row(r: Row) -> Episode:
    t, i = "episodes", r[0]
    body = json_dict(r[4], t, i, "body")
    lists = {k: strings(body.get(k, []), t, i, f"body.{k}")
             for k in ("entities", "decisions", "open_questions", "key_facts")}
    return Episode(id=i, user_id=r[1], session_id=r[2], summary=text(r[3], t, i, "summary"), **lists,
                   turn_count=count(r[5], t, i, "turn_count"), start=number(r[6], t, i, "start_ts"),
                   end=number(r[7], t, i, "end_ts"),
                   source_ids=strings(json_list(r[8], t, i, "source_ids"), t, i, "source_ids"),
                   metadata=json_dict(r[9], t, i, "metadata"), created_at=number(r[10], t, i, "created_at"),
                   access_count=count(r[11], t, i, "access_count"),
                   last_access=optional_number(r[12], t, i, "last_access"),
                   promoted_at=optional_number(r[13], t, i, "promoted_at"),
                   compressed_at=optional_number(r[14], t, i, "compressed_at"))


def episode_to_row(e: Episode) -> tuple[Any, ...]:
    body = {"entities": e.entities, "decisions": e.decisions, "open_questions": e.open_questions,
            "key_facts": e.key_facts}
    return (e.id, e.user_id, e.session_id, e.summary, dumps(body), e.turn_count, e.start, e.end,
            dumps(e.source_ids), dumps(e.metadata), e.created_at, e.access_count, e.last_access, e.promoted_at,
            e.compressed_at)


def working_from_row(r: Row) -> WorkingItem:
    t, i = "working_items", r[0]
    return WorkingItem(id=i, user_id=r[1], session_id=r[2], text=text(r[3], t, i, "text"),
                       type=text(r[4], t, i, "type"), importance=number(r[5], t, i, "importance", 0.5),
                       created_at=number(r[6], t, i, "created_at"), metadata=json_dict(r[7], t, i, "metadata"),
                       access_count=count(r[8], t, i, "access_count"))


def working_to_row(i: WorkingItem) -> tuple[Any, ...]:
    return (i.id, i.user_id, i.session_id, i.text, i.type, i.importance, i.created_at, dumps(i.metadata),
            i.access_count)


def archived_from_row(r: Row) -> ArchivedTurn:
    t, i = "messages_archive", r[0]
    return ArchivedTurn(id=i, user_id=r[1], session_id=r[2], role=text(r[3], t, i, "role"),
                        content=text(r[4], t, i, "content"), metadata=json_dict(r[5], t, i, "metadata"),
                        timestamp=number(r[6], t, i, "timestamp"), episode_id=r[7],
                        archived_at=number(r[8], t, i, "archived_at"))


def archived_to_row(t: ArchivedTurn) -> tuple[Any, ...]:
    return (t.id, t.user_id, t.session_id, t.role, t.content, dumps(t.metadata), t.timestamp, t.episode_id,
            t.archived_at)


def pad_from_row(r: Row) -> SessionPad:
    t, i = "scratchpads", (r[0], r[1])
    return SessionPad(user_id=r[0], session_id=r[1], data=json_dict(r[2], t, i, "data"),
                      updated_at=number(r[3], t, i, "updated_at"))


def item_from_row(r: Row) -> Item:
    t, i = "items", r[0]
    return Item(id=i, user_id=r[1], namespace=namespace_of(r[2], t, i), key=r[3],
                value=json_dict(r[4], t, i, "value"), text=None if r[5] is None else text(r[5], t, i, "text"),
                created_at=number(r[6], t, i, "created_at"), updated_at=number(r[7], t, i, "updated_at"))


def namespace_of(raw: object, table: str, row_id: object) -> tuple[str, ...]:
    """A stored namespace (a JSON list of labels) as a tuple; labels that are not strings are
    written as their JSON."""
    return tuple(v if isinstance(v, str) else dumps(v) for v in json_list(raw, table, row_id, "namespace"))
