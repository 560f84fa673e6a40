"""Filters on item values, with the rules of LangGraph's SQL stores (pure functions).

Operators: ``$eq $ne $gt $gte $lt $lte $in $nin $exists``; a plain value means equality
(nested objects key by key, lists element by element, ``True`` is not ``1``). A key is
letters, digits, ``_``, ``-`` and ``.``; a dot walks into nested objects. An absent key
behaves as SQL ``NULL``: only ``None`` / ``{"$eq": None}`` and ``$nin`` / ``$exists: False``
match it. Bad keys and operators raise :class:`~tiered_memory.errors.InvalidInputError`
(a ``ValueError``) before any item is read.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ..errors import InvalidInputError

__all__ = ["check_filter", "check_filter_key", "match_filter", "match_value", "value_at"]

_OPERATORS = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists"}
_FILTER_KEY = re.compile(r"^[a-zA-Z0-9_.-]+$")
_MISSING = object()


def _order(actual: Any, want: Any) -> tuple[Any, Any] | None:
    """Two values that compare the way LangGraph's SQL stores compare them: numbers as
    numbers (bools are not numbers), strings as strings; else ``None`` (no match). Numbers
    are compared as they are (Python compares an int and a float exactly), never through
    ``float()``, which raises for an int past a float's range and rounds large ints."""
    def num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if num(actual) and num(want):
        nan = any(isinstance(v, float) and math.isnan(v) for v in (actual, want))
        return None if nan else (actual, want)
    if isinstance(actual, str) and isinstance(want, str):
        return actual, want
    return None


def _compare(actual: Any, op: str, want: Any) -> bool:
    """One operator; ``actual`` is ``_MISSING`` when the key is absent."""
    if op == "$exists":
        if not isinstance(want, bool):
            raise InvalidInputError(f"$exists takes true or false, got {want!r}")
        return (actual is not _MISSING) is want
    if op in ("$in", "$nin"):
        if not isinstance(want, (list, tuple)):
            raise InvalidInputError(f"{op} takes a list of values, got {want!r}")
        found = actual is not _MISSING and any(match_value(actual, w) for w in want)
        return found if op == "$in" else not found
    if actual is _MISSING:  # as in LangGraph's SQL stores: absent is NULL, which only {"$eq": None} matches
        return op == "$eq" and want is None
    if op == "$eq":
        return match_value(actual, want)
    if op == "$ne":
        return not match_value(actual, want)
    pair = _order(actual, want)
    if pair is None:
        return False
    a, w = pair
    return bool({"$gt": a > w, "$gte": a >= w, "$lt": a < w, "$lte": a <= w}[op])


def match_value(actual: Any, want: Any) -> bool:
    """JSONB-like matching: operators (``$eq`` ``$ne`` ``$gt`` ``$gte`` ``$lt`` ``$lte``
    ``$in`` ``$nin`` ``$exists``), nested objects matched key by key, lists element by
    element, else equality (``1 == 1.0``, but ``True`` is not ``1``)."""
    if isinstance(want, Mapping):
        ops = [k for k in want if isinstance(k, str) and k.startswith("$")]
        if ops:
            unknown = set(ops) - _OPERATORS
            if unknown or len(ops) != len(want):
                raise InvalidInputError(
                    f"unsupported filter operators {sorted(set(want) - _OPERATORS)}; use {sorted(_OPERATORS)}")
            return all(_compare(actual, op, v) for op, v in want.items())
        return isinstance(actual, Mapping) and all(
            match_value(actual.get(k, _MISSING), v) for k, v in want.items())
    if actual is _MISSING:
        return want is None
    if isinstance(want, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(actual) == len(want)
                and all(match_value(a, w) for a, w in zip(actual, want)))
    if isinstance(want, bool) or isinstance(actual, bool):
        return isinstance(want, bool) and isinstance(actual, bool) and want is actual
    return bool(actual == want)


def check_filter_key(key: object) -> str:
    """A filter key: letters, digits, ``_``, ``-`` and ``.`` (a dot walks into nested
    objects), the rule of LangGraph's SQL stores."""
    if not isinstance(key, str) or not _FILTER_KEY.match(key) or "" in key.split("."):
        raise InvalidInputError(
            f"Invalid filter key: {key!r}. Filter keys must contain only alphanumeric characters, "
            "underscores, dots and hyphens, with a dot only between two names (\"a.b\").")
    return key


def value_at(value: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted ``key`` (``"a.b"`` is ``value["a"]["b"]``; a literal ``"a.b"``
    key wins), or ``_MISSING``."""
    if key in value:
        return value[key]
    current: Any = value
    for part in key.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return _MISSING
        current = current[part]
    return current


def check_filter(filter: Mapping[str, Any] | None) -> None:
    """Refuse a bad key or operator before any item is read (so an empty store refuses it too)."""
    if filter is None:
        return
    if not isinstance(filter, Mapping):
        raise InvalidInputError(f"filter must be a mapping, got {type(filter).__name__}")
    for key, want in filter.items():
        check_filter_key(key)
        match_value(_MISSING, want)


def match_filter(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """True when ``value`` satisfies every condition of ``filter`` (``None`` matches all)."""
    if not filter:
        return True
    check_filter(filter)
    return all(match_value(value_at(value, k), want) for k, want in filter.items())
