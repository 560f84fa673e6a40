"""Search filters as SQL, for both dialects (pure). The values were checked by
:func:`~tiered_memory.validation.check_filters`: one JSON scalar per metadata key.

The SQL may match a superset of what :func:`~tiered_memory.recall.scoring.matches_filters`
accepts (recall checks every hit again), never a subset: a bool and the number it equals
match each other, as they do in Python.
"""

from __future__ import annotations

import json
from typing import Any, Mapping


def json_path(key: str) -> str | None:
    """SQLite's JSON path of a top-level key, quoted so dots and ``$`` are part of the key;
    ``None`` for a key that JSON spells with an escape (a quote, a backslash, a control
    character such as a line break): a path cannot spell it reliably, and SQLite compares a
    path's key with the stored, escaped one (such a key is then not narrowed in SQL; recall
    still checks it on every hit)."""
    if json.dumps(key, ensure_ascii=False)[1:-1] != key:
        return None
    return f'$."{key}"'


def sqlite_filter(filters: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`` AND ...`` conditions on ``messages`` and their parameters (``?`` placeholders)."""
    sql = ""
    params: list[Any] = []
    for key, value in filters.items():
        if key == "role":
            sql, params = sql + " AND role = ?", [*params, value]
        elif key == "since":
            sql, params = sql + " AND timestamp >= ?", [*params, float(value)]
        elif key == "until":
            sql, params = sql + " AND timestamp <= ?", [*params, float(value)]
        elif (path := json_path(key)) is None:
            continue
        elif value is None:
            sql, params = sql + " AND json_extract(metadata, ?) IS NULL", [*params, path]
        else:  # json_extract gives true/false as 1/0, like Python's True == 1
            sql += " AND json_extract(metadata, ?) = ?"
            params += [path, int(value) if isinstance(value, bool) else value]
    return sql, params


def postgres_filter(filters: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`` AND ...`` conditions on ``messages`` (metadata is JSON text) with ``%s`` placeholders."""
    sql = ""
    params: list[Any] = []
    for key, value in filters.items():
        if key == "role":
            sql, params = sql + " AND role = %s", [*params, value]
        elif key == "since":
            sql, params = sql + " AND timestamp >= %s", [*params, float(value)]
        elif key == "until":
            sql, params = sql + " AND timestamp <= %s", [*params, float(value)]
        elif value is None:
            sql += " AND (metadata::jsonb -> %s IS NULL OR metadata::jsonb -> %s = 'null'::jsonb)"
            params += [key, key]
        else:
            forms = [json.dumps(value)]
            if isinstance(value, bool) or value in (0, 1):  # True == 1 and False == 0, as in Python
                forms += ["true" if value else "false", "1" if value else "0"]
            sql += " AND metadata::jsonb -> %s = ANY(%s::jsonb[])"
            params += [key, sorted(set(forms))]
    return sql, params
