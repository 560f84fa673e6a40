"""Item value filters as SQL, for both dialects (pure): what
:func:`~tiered_memory.layers.item_filters.match_filter` decides in Python, decided in the
database, so a listing with a selective filter reads its page, not every item under the prefix.

The SQL says exactly what the Python check says, condition by condition, for every filter it
translates: numbers compare as numbers (a boolean is no number: ``True`` is not ``1``), strings
as strings in code-point order (SQLite's ``BINARY``, PostgreSQL's ``COLLATE "C"``), nested
objects key by key, lists element by element, an absent key is SQL ``NULL`` (only ``None`` /
``{"$eq": None}``, ``$nin`` and ``$exists: false`` match it), and a dotted key walks into
nested objects (a literal top-level ``"a.b"`` key wins). Every condition is two-valued (never
SQL ``NULL``), so ``NOT`` of one (``$ne``, ``$nin``) means what Python's ``not`` means.

A condition it cannot say exactly (an int past 64 bits, a NaN, a value JSON cannot hold, a
nested key a JSON path cannot spell) is left out: the SQL then selects a superset, and the
caller checks every row read with ``match_filter`` all the same (it always does). The filter
was checked (:func:`~tiered_memory.layers.item_filters.check_filter`) before it gets here.

On PostgreSQL a filter's equalities can be said as containments too (``@>``, :func:`contained`),
which the ``items_value`` GIN index of the values serves (postgres_layers): a page of an equality
that keeps few rows reads them, not every row of the range parsed. The containment only narrows:
every row the conditions select contains it (an absent-or-null, an operator other than ``$eq``,
say nothing), so the conditions still decide, and select the same rows.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from ..validation import encodable

__all__ = ["contained", "item_filter_sql"]

Sql = tuple[str, list[Any]]
_COMPARE = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_INT64 = 2 ** 63


class _Untranslated(Exception):
    """A condition the SQL cannot say exactly: the key's condition is left to Python."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bindable(v: Any) -> Any:
    """A number or string both databases compare as Python does; else :class:`_Untranslated`."""
    if isinstance(v, str):
        if "\x00" in v or not encodable(v):  # no text column holds them
            raise _Untranslated
        return v
    if isinstance(v, float) and not math.isfinite(v):
        raise _Untranslated
    if isinstance(v, int) and not -_INT64 <= v < _INT64:
        raise _Untranslated
    return v


class _Dialect:
    """How one dialect reads a JSON node of the item's ``value``; a node is the dialect's own."""

    def top(self, key: str) -> Any:
        raise NotImplementedError

    def walk(self, parts: Sequence[str]) -> Any:
        raise NotImplementedError

    def child(self, node: Any, key: str) -> Any:
        raise NotImplementedError

    def index(self, node: Any, i: int) -> Any:
        raise NotImplementedError

    def present(self, node: Any) -> Sql:
        raise NotImplementedError

    def is_type(self, node: Any, kind: str) -> Sql:
        raise NotImplementedError

    def length_is(self, node: Any, n: int) -> Sql:
        raise NotImplementedError

    def compare(self, node: Any, kind: str, op: str, want: Any) -> Sql:
        raise NotImplementedError


class _SQLite(_Dialect):
    """Nodes are JSON paths (bound as parameters) into ``value``; a value that is not JSON (a
    row another writer left malformed, which Python reads as ``{}``) is read as ``{}``."""

    VALUE = "(CASE WHEN json_valid(value) THEN value ELSE '{}' END)"
    TYPES = {"object": "'object'", "array": "'array'", "null": "'null'", "true": "'true'", "false": "'false'",
             "string": "'text'", "number": "'integer', 'real'"}

    @staticmethod
    def _label(key: str) -> str:
        # a key JSON spells with an escape (a quote, a backslash, a control character) cannot be
        # spelled in a path reliably: SQLite compares the path's label with the escaped text
        if json.dumps(key, ensure_ascii=False)[1:-1] != key or not encodable(key):
            raise _Untranslated
        return f'."{key}"'

    def top(self, key: str) -> str:
        return "$" + self._label(key)

    def walk(self, parts: Sequence[str]) -> str:
        return "$" + "".join(self._label(p) for p in parts)

    def child(self, node: str, key: str) -> str:
        return node + self._label(key)

    def index(self, node: str, i: int) -> str:
        return f"{node}[{i}]"

    def present(self, node: str) -> Sql:
        return f"json_type({self.VALUE}, ?) IS NOT NULL", [node]

    def is_type(self, node: str, kind: str) -> Sql:
        return f"COALESCE(json_type({self.VALUE}, ?), '') IN ({self.TYPES[kind]})", [node]

    def length_is(self, node: str, n: int) -> Sql:
        return f"json_array_length({self.VALUE}, ?) = ?", [node, n]

    def compare(self, node: str, kind: str, op: str, want: Any) -> Sql:
        typed, params = self.is_type(node, kind)
        # json_extract gives a JSON string as text (compared BINARY: UTF-8 bytes, code-point
        # order) and a number as a number (an int and a real compared exactly, as Python does)
        return f"({typed} AND json_extract({self.VALUE}, ?) {op} ?)", [*params, node, want]


class _Postgres(_Dialect):
    """Nodes are ``jsonb`` expressions (with their parameters): ``->`` a text key is SQL
    ``NULL`` on anything but an object, as Python's walk asks for a mapping at each step."""

    # a value another writer left unreadable is read as {} (as stored_values reads it), never an
    # error of the whole listing: a cast that fails is caught in a function (postgres_layers' migration)
    VALUE = "items_value_jsonb(value)"

    def top(self, key: str) -> Sql:
        return f"({self.VALUE} -> ?::text)", [key]

    def walk(self, parts: Sequence[str]) -> Sql:
        node: Sql = (self.VALUE, [])
        for p in parts:
            node = self.child(node, p)
        return node

    def child(self, node: Sql, key: str) -> Sql:
        if "\x00" in key or not encodable(key):
            raise _Untranslated
        return f"({node[0]} -> ?::text)", [*node[1], key]

    def index(self, node: Sql, i: int) -> Sql:
        return f"({node[0]} -> ?::int)", [*node[1], i]

    def present(self, node: Sql) -> Sql:
        return f"({node[0]} IS NOT NULL)", list(node[1])

    def is_type(self, node: Sql, kind: str) -> Sql:
        if kind in ("true", "false"):
            return f"COALESCE({node[0]} = '{kind}'::jsonb, false)", list(node[1])
        return f"COALESCE(jsonb_typeof({node[0]}) = '{kind}', false)", list(node[1])

    def length_is(self, node: Sql, n: int) -> Sql:
        return f"(CASE WHEN jsonb_typeof({node[0]}) = 'array' THEN jsonb_array_length({node[0]}) = ? ELSE false END)", [
            *node[1], *node[1], n]

    def compare(self, node: Sql, kind: str, op: str, want: Any) -> Sql:
        # CASE, not AND: PostgreSQL may evaluate an AND's sides in either order, and a cast of a
        # string to numeric would fail. Numbers compare as numeric (exact, as Python compares an
        # int and a float); the filter's number goes as its JSON text, the decimal the value holds
        if kind == "number":
            read, bound = "(({n}) #>> '{{}}')::numeric", "?::numeric"
            want = json.dumps(want)
        else:
            read, bound = "(({n}) #>> '{{}}') COLLATE \"C\"", "?::text COLLATE \"C\""
        sql = (f"(CASE WHEN jsonb_typeof({node[0]}) = '{kind}' THEN {read.format(n=node[0])} {op} {bound}"
               " ELSE false END)")
        return sql, [*node[1], *node[1], want]


def _and(parts: Sequence[Sql]) -> Sql:
    return _chain(parts, "AND") if parts else ("(1=1)", [])


def _or(parts: Sequence[Sql]) -> Sql:
    return _chain(parts, "OR") if parts else ("(1=0)", [])


#: most parts joined in one flat chain: SQLite parses a chain as a tree as deep as it is long,
#: and refuses one deeper than 1,000 (an ``$in`` of 1,000 values, a filter of 1,000 keys)
CHAIN_MAX = 64


def _chain(parts: Sequence[Sql], op: str) -> Sql:
    """``parts`` joined by ``op``, in order; a long chain as a balanced tree of chains, about
    log(n) deep."""
    if len(parts) > CHAIN_MAX:
        step = -(-len(parts) // CHAIN_MAX)
        parts = [_chain(parts[i:i + step], op) for i in range(0, len(parts), step)]
    return "(" + f" {op} ".join(p[0] for p in parts) + ")", [x for p in parts for x in p[1]]


def _not(part: Sql) -> Sql:
    return f"(NOT {part[0]})", list(part[1])


def _matches(d: _Dialect, node: Any, want: Any) -> Sql:
    """``match_value(actual, want)`` for the value at ``node``, absent or not."""
    if isinstance(want, Mapping):
        ops = [k for k in want if isinstance(k, str) and k.startswith("$")]
        if ops:
            return _and([_operator(d, node, op, v) for op, v in want.items()])
        return _and([d.is_type(node, "object"), *(_matches(d, d.child(node, k), v) for k, v in want.items())])
    if want is None:  # absent, or JSON null
        return _not(_and([d.present(node), _not(d.is_type(node, "null"))]))
    if isinstance(want, (list, tuple)):
        return _and([d.is_type(node, "array"), d.length_is(node, len(want)),
                     *(_matches(d, d.index(node, i), w) for i, w in enumerate(want))])
    if isinstance(want, bool):
        return d.is_type(node, "true" if want else "false")
    if isinstance(want, str):
        return d.compare(node, "string", "=", _bindable(want))
    if _number(want):
        return d.compare(node, "number", "=", _bindable(want))
    raise _Untranslated  # a value no JSON holds: Python's == decides


def _operator(d: _Dialect, node: Any, op: str, want: Any) -> Sql:
    """``_compare(actual, op, want)`` of :mod:`~tiered_memory.layers.item_filters`."""
    if op == "$exists":
        present = d.present(node)
        return present if want else _not(present)
    if op in ("$in", "$nin"):
        found = _and([d.present(node), _or([_matches(d, node, w) for w in want])])
        return found if op == "$in" else _not(found)
    if op == "$eq":
        return _matches(d, node, None) if want is None else _and([d.present(node), _matches(d, node, want)])
    if op == "$ne":
        return _and([d.present(node), _not(_matches(d, node, want))])
    if _number(want):
        if isinstance(want, float) and math.isnan(want):
            return "(1=0)", []
        return d.compare(node, "number", _COMPARE[op], _bindable(want))
    if isinstance(want, str):
        return d.compare(node, "string", _COMPARE[op], _bindable(want))
    return "(1=0)", []  # LangGraph's SQL stores order numbers and strings only


def _key(d: _Dialect, key: str, want: Any) -> Sql:
    """The condition on a top-level filter key: its literal key when the value has it, else
    its dotted path (``value_at``)."""
    literal = d.top(key)
    if "." not in key:
        return _matches(d, literal, want)
    has, params = d.present(literal)
    on_literal, on_walk = _matches(d, literal, want), _matches(d, d.walk(key.split(".")), want)
    return (f"(CASE WHEN {has} THEN {on_literal[0]} ELSE {on_walk[0]} END)",
            [*params, *on_literal[1], *on_walk[1]])


_NOTHING = object()  # nothing a matching value must contain


def _contained(want: Any, element: bool = False) -> Any:
    """The JSON every value that ``match_value`` matches with ``want`` contains (jsonb's ``@>``),
    or ``_NOTHING``: an equality's value; an object's keys and a list's elements, each what it
    contains (in a list, ``None`` is a JSON null; in an object, absent or null: nothing). An empty
    object or list says nothing either (the GIN index would read every entry for it)."""
    if isinstance(want, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in want):  # operators: only $eq says a value
            return _NOTHING if want.get("$eq") is None else _contained(want["$eq"], element)
        if not all(isinstance(k, str) for k in want):
            raise _Untranslated
        inner = {_bindable(k): _contained(v) for k, v in want.items()}
        return {k: v for k, v in inner.items() if v is not _NOTHING} or _NOTHING
    if want is None:
        return None if element else _NOTHING
    if isinstance(want, (list, tuple)):
        return [c for c in (_contained(w, True) for w in want) if c is not _NOTHING] or _NOTHING
    if isinstance(want, bool):
        return want
    if isinstance(want, str) or _number(want):
        return _bindable(want)
    raise _Untranslated


def contained(filter: Mapping[str, Any] | None) -> list[list[dict[str, Any]]]:
    """JSON objects every item value that ``filter`` keeps contains (pure), for the containments
    that let PostgreSQL find an equality's rows in its GIN index of the values: each entry is the
    objects one of which the value contains. The first holds one object, the filter's plain keys;
    then a dotted key's two readings (its literal key, its path). What they cannot say is left out."""
    plain: dict[str, Any] = {}
    dotted: list[list[dict[str, Any]]] = []
    for key, want in (filter or {}).items():
        try:
            found = _contained(want)
        except _Untranslated:
            continue
        if found is _NOTHING:
            continue
        if "." not in key:
            plain[key] = found
            continue
        path = found
        for part in reversed(key.split(".")):
            path = {part: path}
        dotted.append([{key: found}, path])
    return ([[plain]] if plain else []) + dotted


#: a containment of the item's value (:func:`contained`), as the ``items_value`` index holds it
CONTAINS = f"{_Postgres.VALUE} @> ?::jsonb"


def _contains(filter: Mapping[str, Any] | None) -> list[Sql]:
    return [_or([(CONTAINS, [json.dumps(c)]) for c in either]) for either in contained(filter)]


def item_filter_sql(filter: Mapping[str, Any] | None, dialect: str, contains: bool = False
                    ) -> tuple[str, list[Any], bool]:
    """`` AND ...`` conditions on the ``items`` table's ``value`` (``?`` placeholders) for
    ``dialect`` (``"sqlite"`` or ``"postgres"``), their parameters, and whether they say exactly
    what :func:`~tiered_memory.layers.item_filters.match_filter` says (else a superset). With
    ``contains``, on PostgreSQL, the filter's containments (:func:`contained`) come first: the
    same rows, found by the ``items_value`` index."""
    d: _Dialect = _Postgres() if dialect == "postgres" else _SQLite()
    parts = _contains(filter) if contains and dialect == "postgres" else list[Sql]()
    exact = True
    for key, want in (filter or {}).items():
        try:
            parts.append(_key(d, key, want))
        except _Untranslated:
            exact = False
    if len(parts) > CHAIN_MAX:  # one condition, balanced
        parts = [_and(parts)]
    return "".join(" AND " + p[0] for p in parts), [x for p in parts for x in p[1]], exact
