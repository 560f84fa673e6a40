"""PostgreSQL's GIN index of the item values (``items_value``) and the containments that reach it
(tiered_memory.store.item_filter_sql.contained). A listing page of an equality filter that keeps few
rows parsed every row of the prefix's range to find them: 300 ms a page at 100,000 items
(bench/item_listing.py). The filter's equalities are now also said as containments of the value
(``@>``), which the index serves. A containment only narrows: every value the filter keeps contains
it, so the pages are the same; an operator other than ``$eq`` and an absent-or-null say nothing."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from test_item_filter_sql import FILTERS, VALUES
from tiered_memory import TieredMemory
from tiered_memory.backends import open_layer_store
from tiered_memory.layers.items import ItemWrite, match_filter
from tiered_memory.store.item_filter_sql import CONTAINS, contained, item_filter_sql
from tiered_memory.store.layer_codec import ns_path

CONTAINED: list[tuple[dict[str, Any], list[list[dict[str, Any]]]]] = [
    ({"a": 1, "b": "x", "c": True, "d": 1.5}, [[{"a": 1, "b": "x", "c": True, "d": 1.5}]]),
    ({"a": {"$eq": 2}}, [[{"a": 2}]]),
    ({"a": {"$eq": 2, "$gt": 0}}, [[{"a": 2}]]),
    ({"a": {"$eq": {"b": [1]}}}, [[{"a": {"b": [1]}}]]),
    ({"a": {"b": 1, "c": None}}, [[{"a": {"b": 1}}]]),  # an object's None: absent or null
    ({"a": [1, None, "x"]}, [[{"a": [1, None, "x"]}]]),  # a list's None: a null
    ({"a": [{"$gt": 1}, 2]}, [[{"a": [2]}]]),
    ({"a.b": 4}, [[{"a.b": 4}, {"a": {"b": 4}}]]),  # the literal key, or the path
    ({"a.b.c": "d", "e": 0}, [[{"e": 0}], [{"a.b.c": "d"}, {"a": {"b": {"c": "d"}}}]]),
    ({"a": 1, "b": float("inf"), "c": 2 ** 70, "d": "nul\x00", "e": {"\x00": 1}}, [[{"a": 1}]]),
    *(({"a": nothing}, []) for nothing in [
        None, {"$eq": None}, {"$ne": 1}, {"$gt": 1}, {"$lte": "x"}, {"$in": [1]}, {"$nin": [1]},
        {"$exists": True}, {}, [], {"b": None}, {"b": {"$gt": 1}}, [{"$ne": 1}], float("nan"), "\ud800"]),
]


@pytest.mark.parametrize("flt, docs", CONTAINED, ids=[repr(f) for f, _ in CONTAINED])
def test_a_filters_equalities_are_the_json_its_values_contain(flt: dict[str, Any], docs: list[Any]) -> None:
    assert contained(flt) == docs
    sql, params, _ = item_filter_sql(flt, "postgres", contains=True)
    first = [json.dumps(d) for either in docs for d in either]  # the containments come first
    assert sql.count(CONTAINS) == len(first) and params[:len(first)] == first
    assert CONTAINS not in item_filter_sql(flt, "postgres")[0]
    assert item_filter_sql(flt, "sqlite", contains=True) == item_filter_sql(flt, "sqlite")  # no such index


EQUALITIES: list[dict[str, Any]] = [
    {"a": [1, None]}, {"a": {"b": 1, "c": None}}, {"a": {"b": [1, {"c": "d"}]}}, {"a.b": {"$eq": 4}},
    {"a": [{"b": 4}]}, {"a": 1, "a.b": 4}, {"a": {"$eq": 1.0, "$ne": 2}}, {"a": "x", "b": None},
]


@pytest.mark.record_stores("postgres")
def test_a_postgres_page_of_an_equality_reads_the_value_index(make_memory: Callable[..., TieredMemory]) -> None:
    """An existing database gains the index (and the planner's statistics of it) when it opens; a
    page of a filter that keeps one row in 1,000 reads it where the page reads more than one
    namespace (a Bitmap Index Scan, no scan of the range); each containment alone holds for every
    value its filter keeps, and the pages are the filter's: the SQL of every filter of
    test_item_filter_sql is exact on PostgreSQL (its one PostgreSQL case, here, to open one store)."""
    memory = make_memory("old")
    memory.item_store().write_many([ItemWrite(namespace=("u", "v"), key=str(n), user_id="u", value=v)
                                    for n, v in enumerate(VALUES)])
    layers: Any = open_layer_store(memory.store)
    with layers.transaction() as c:
        c.execute("DROP INDEX IF EXISTS items_value")  # back to the schema before the index
        c.execute("DELETE FROM schema_migrations WHERE name='items' AND version ="
                  " (SELECT max(version) FROM schema_migrations WHERE name='items')")
        # 1,000 more rows, as another writer writes them (a put here is a few milliseconds)
        c.executemany("INSERT INTO items (id, user_id, ns_path, namespace, key, value, created_at, updated_at)"
                      " VALUES (?, 'u', ?, ?, ?, ?, 1, 1)",
                      [(f"i{n}", ns_path(("u", f"n{n % 3}")), json.dumps(["u", f"n{n % 3}"]), f"k{n}",
                        json.dumps({"kind": "rare" if n == 7 else "common", "n": n})) for n in range(1000)])
    memory.close()
    layers = open_layer_store(make_memory("old").store)
    assert layers.query("SELECT count(*) FROM pg_stats WHERE schemaname = current_schema()"
                        " AND tablename = 'items_value'")[0][0] == 1

    statements: list[tuple[str, list[Any]]] = []
    query = layers.query
    layers.query = lambda sql, params=(): statements.append((sql, list(params))) or query(sql, params)
    for prefix in [("u",), ()]:
        statements.clear()
        assert [i.key for i, _ in layers.items_page(prefix, 10, filter={"kind": "rare"})] == ["k7"]
        plans = ["\n".join(r[0] for r in query(f"EXPLAIN {sql}", params)) for sql, params in statements
                 if "@>" in sql and 'ns_path COLLATE "C" = ?' not in sql]  # not the namespace itself
        assert plans and all("Bitmap Index Scan on items_value" in p for p in plans), plans

    for flt in [*FILTERS, *EQUALITIES]:
        assert flt in EQUALITIES or item_filter_sql(flt, "postgres")[2], flt
        keep = {str(n) for n, v in enumerate(VALUES) if match_filter(v, flt)}
        narrowed = {r[0] for r in query(
            "SELECT key FROM items WHERE ns_path = ?" + "".join(
                " AND (" + " OR ".join([CONTAINS] * len(either)) + ")" for either in contained(flt)),
            [ns_path(("u", "v")), *(json.dumps(d) for either in contained(flt) for d in either)])}
        assert narrowed >= keep, flt
        assert {i.key for i, _ in layers.items_page(("u", "v"), 100, filter=flt)} == keep, flt
