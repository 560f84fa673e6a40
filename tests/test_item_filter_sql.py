"""Item filters in SQL (tiered_memory.store.item_filter_sql) and the listing's index: the database
decides what the Python check (match_filter) decides, so a listing with a selective filter reads its
page, not every row under the prefix; a prefix is a range of the items_listing index, the empty
prefix is read in the order of the items_recent index, and an existing database gains both when it
is opened."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable

import pytest

from hook_support import item_reads
from tiered_memory import InvalidInputError, TieredMemory
from tiered_memory.backends import open_layer_store
from tiered_memory.layers.items import ItemWrite, check_filter, match_filter
from tiered_memory.store.item_filter_sql import item_filter_sql
from tiered_memory.store.layer_codec import (items_lateral_sql, items_merged_sql, items_page_sql, items_recent_sql,
                                             items_under_sql, namespaces_below_sql, ns_path)
from tiered_memory.store.layer_items import MERGED_MAX, merged_at_once

VALUES: list[dict[str, Any]] = [
    {}, {"a": 1}, {"a": 1.0}, {"a": 1.5}, {"a": 0}, {"a": -5}, {"a": True}, {"a": False}, {"a": None},
    {"a": "1"}, {"a": "x"}, {"a": "Z"}, {"a": ""}, {"a": "é"}, {"a": "ÿ"}, {"a": "\U0001F600"}, {"a": "a\nb"},
    {"a": [1, 2]}, {"a": [1]}, {"a": []}, {"a": [1.0, 2]}, {"a": {"b": 1}}, {"a": {"b": {"c": 2}}},
    {"a": {"b": None}}, {"a": {}}, {"a.b": 3, "a": {"b": 4}}, {"a": {"b": [1, {"c": "d"}]}}, {"a": [{"b": 4}]},
    {"a": 2 ** 53 + 1}, {"a": 10 ** 30}, {"b": 1}, {"a": 1, "b": 1}, {"a": {"b": True}}, {"a": "x", "b": None},
]

FILTERS: list[dict[str, Any]] = [
    {"a": 1}, {"a": 1.0}, {"a": 0}, {"a": True}, {"a": False}, {"a": None}, {"a": "x"}, {"a": ""}, {"a": "é"},
    {"a": [1, 2]}, {"a": []}, {"a": [1]}, {"a": {"b": 1}}, {"a": {}}, {"a": {"b": None}}, {"a": {"b": True}},
    {"a": {"$eq": None}}, {"a": {"$ne": None}}, {"a": {"$eq": 1}}, {"a": {"$ne": 1}}, {"a": {"$ne": "x"}},
    {"a": {"$ne": True}}, {"a": {"$ne": [1, 2]}}, {"a": {"$eq": {"b": 1}}}, {"a": {"$gt": 0}}, {"a": {"$gte": 1}},
    {"a": {"$lt": 1.5}}, {"a": {"$lte": -5}}, {"a": {"$lte": "x"}}, {"a": {"$gt": "Z"}}, {"a": {"$gt": "é"}},
    {"a": {"$lt": "\U0001F600"}}, {"a": {"$gte": ""}}, {"a": {"$gt": True}}, {"a": {"$lt": None}},
    {"a": {"$gt": [1]}}, {"a": {"$gt": 2 ** 53}}, {"a": {"$gt": float(2 ** 53)}}, {"a": {"$gt": 1e300}},
    {"a": {"$gt": 1, "$lt": 3}}, {"a": {"$in": [1, "x", None]}}, {"a": {"$nin": [1, "x"]}}, {"a": {"$in": []}},
    {"a": {"$nin": []}}, {"a": {"$in": [[1], {"b": 1}]}}, {"a": {"$nin": [None]}}, {"a": {"$exists": True}},
    {"a": {"$exists": False}}, {"a": {"$gt": {"b": 1}}}, {"a.b": 4}, {"a.b": 3}, {"a.b": {"$gte": 1}},
    {"a.b.c": 2}, {"a.b": None}, {"a.b": {"$exists": True}}, {"a.b": [1, {"c": "d"}]}, {"a.b": {"$ne": 4}},
    {"a.0": 1}, {"a.0.b": 4}, {"a": 1, "b": 1}, {"b": {"$exists": False}, "a": {"$ne": None}}, {"b": None},
]

# what the SQL cannot say exactly: left to Python (the SQL selects a superset)
UNTRANSLATED: list[dict[str, Any]] = [
    {"a": 10 ** 30}, {"a": {"$gt": 2 ** 64}}, {"a": float("nan")}, {"a": {"$eq": float("inf")}},
    {"a": {"w\"q": 1}}, {"a": "nul\x00"}, {"a": 1, "b": {"$in": [2 ** 70]}},
]


def _sqlite_rows() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE items (rowid INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    conn.executemany("INSERT INTO items (rowid, value) VALUES (?, ?)",
                     [(n, json.dumps(v, ensure_ascii=False)) for n, v in enumerate(VALUES)])
    conn.execute("INSERT INTO items (rowid, value) VALUES (?, ?)", (len(VALUES), "{not json"))  # read as {}
    return conn


def _python(flt: dict[str, Any]) -> list[int]:
    return [n for n, v in enumerate([*VALUES, {}]) if match_filter(v, flt)]


@pytest.mark.parametrize("flt", FILTERS, ids=[repr(f) for f in FILTERS])
def test_the_sql_of_a_filter_selects_what_the_python_check_selects(flt: dict[str, Any]) -> None:
    check_filter(flt)
    sql, params, exact = item_filter_sql(flt, "sqlite")
    assert exact and sql
    selected = [r[0] for r in _sqlite_rows().execute(f"SELECT rowid FROM items WHERE 1=1{sql} ORDER BY rowid",
                                                    params)]
    assert selected == _python(flt)


@pytest.mark.parametrize("flt", UNTRANSLATED, ids=[repr(f) for f in UNTRANSLATED])
def test_a_condition_the_sql_cannot_say_exactly_is_left_to_python(flt: dict[str, Any]) -> None:
    sql, params, exact = item_filter_sql(flt, "sqlite")
    assert not exact
    selected = {r[0] for r in _sqlite_rows().execute(f"SELECT rowid FROM items WHERE 1=1{sql}", params)}
    assert selected >= set(_python(flt))


def test_a_listing_with_a_selective_filter_reads_one_bounded_page(memory: TieredMemory) -> None:
    """The filter was checked in Python after each page was read: one item in 3,000 read them all,
    in pages doubling to 1,000 rows. The database now returns only the rows that match."""
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("u", "n"), key=f"k{n}", user_id="u",
                                value={"n": n, "kind": "rare" if n == 7 else "common"}) for n in range(3000)])
    found: list[Any] = []
    reads = item_reads(memory, lambda: found.extend(items.search(("u",), filter={"kind": "rare"}, limit=10)))
    assert [h.item.key for h in found] == ["k7"]
    # ("u",) itself, the namespaces below it (one) and their page, merged
    assert len(reads) == 3 and reads[0].endswith("LIMIT 10") and reads[2].endswith("LIMIT 10")
    assert reads[1].startswith("WITH RECURSIVE below") and "UNION ALL" not in reads[2]


def test_a_listing_reads_the_listing_index_in_its_order(memory: TieredMemory) -> None:
    """A prefix was ``substr(ns_path, ...) = ?``, which no index serves: each page scanned the table and
    sorted it. The namespace itself is now read in the index's order (no sort), keyset pages included;
    the namespaces below it are a range of the index."""
    layers = open_layer_store(memory.store)
    layers.items_page(("u",), 10)  # the table exists

    conn: Any = memory.store.conn  # type: ignore[attr-defined]

    def plan(part: str, after: Any) -> list[str]:
        sql, params = items_page_sql(("u", "n"), 10, after, 2.0, part=part)
        return [str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    assert plan("exact", None) == ["SEARCH items USING INDEX items_listing (ns_path=?)"]
    assert plan("exact", (1.0, 5)) == ["SEARCH items USING INDEX items_listing (ns_path=? AND updated_at<?)"]
    assert plan("deeper", (1.0, 5))[0] == "SEARCH items USING INDEX items_listing (ns_path>? AND ns_path<?)"


def test_a_listing_of_every_namespace_reads_an_index_in_its_order(memory: TieredMemory) -> None:
    """The empty prefix (every namespace) read the whole table and sorted it for each page (SCAN items,
    USE TEMP B-TREE FOR ORDER BY). It now reads the items_recent index in the listing's order, filtered
    or not, and a keyset page seeks in it: a page reads the rows up to it."""
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=(u, "n"), key=f"k{n}", user_id=u, value={"n": n})
                      for n in range(20) for u in ("a", "b")])
    conn: Any = memory.store.conn  # type: ignore[attr-defined]

    def plan(sql: str, params: Any = ()) -> list[str]:
        return [str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    pages: list[Any] = []
    reads = item_reads(memory, lambda: pages.extend([items.search((), limit=5), items.search((), filter={"n": 3})]))
    assert [[h.item.key for h in page] for page in pages] == [["k19", "k19", "k18", "k18", "k17"], ["k3", "k3"]]
    assert [plan(sql) for sql in reads] == [["SCAN items USING INDEX items_recent"]] * 2
    assert plan(*items_page_sql((), 10, (1.0, 5), 2.0)) == ["SEARCH items USING INDEX items_recent (updated_at<?)"]


@pytest.mark.record_stores("postgres")
def test_a_postgres_listing_of_every_namespace_reads_an_index_in_its_order(memory: TieredMemory) -> None:
    """As on SQLite: the empty prefix's page was a sort of the whole table (Seq Scan, Sort)."""
    memory.item_store().write_many([ItemWrite(namespace=("u", str(n % 7)), key=f"k{n}", user_id="u",
                                              value={"n": n}) for n in range(300)])
    layers: Any = open_layer_store(memory.store)
    with layers.transaction() as c:  # the planner's statistics, as autovacuum gathers them
        c.execute("ANALYZE items")
    for after in (None, (memory.parts.now(), 150)):
        sql, params = items_page_sql((), 10, after, 2.0, "postgres")
        plan = "\n".join(str(r[0]) for r in layers.query(f"EXPLAIN {sql}", params))
        assert "Index Scan using items_recent on items" in plan and "Sort" not in plan, plan


def test_a_listing_for_a_user_lists_that_users_items_only(memory: TieredMemory) -> None:
    """``search(prefix, user_id=...)`` kept a ranked search to the user's items, and with no query
    listed everyone's under the prefix: the user id was ignored. A listing for a user is the user's,
    on every prefix (the adapter lists with no user, as LangGraph does: everyone's, then its own check)."""
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("team", *sub), key=f"{user}{n}", user_id=user, value={"n": n})
                      for n, sub in enumerate([(), ("a",), ("a", "b")]) for user in ("ana", "bob")])
    for prefix in [(), ("team",), ("team", "a")]:
        assert {h.item.user_id for h in items.search(prefix, user_id="bob", limit=100)} == {"bob"}, prefix
        assert [h.item.key for h in items.search(prefix, user_id="bob", filter={"n": 1}, limit=1)] == ["bob1"]
    assert {h.item.user_id for h in items.search(("team",), limit=100)} == {"ana", "bob"}
    with pytest.raises(InvalidInputError):
        items.search(("team",), user_id="")


def test_a_database_made_without_the_listing_indexes_gains_them_on_open(make_memory: Callable[..., TieredMemory]
                                                                        ) -> None:
    memory = make_memory("old")
    memory.item_store().write_many([ItemWrite(namespace=("u", "n"), key="k", user_id="u", value={"a": 1})])
    path = memory.store.path  # type: ignore[attr-defined]
    memory.close()
    con = sqlite3.connect(path, isolation_level=None)  # back to the schema before the indexes (two steps)
    for index in ("items_recent", "items_listing"):
        con.execute(f"DROP INDEX {index}")
        con.execute("DELETE FROM schema_migrations WHERE name='items' AND version ="
                    " (SELECT max(version) FROM schema_migrations WHERE name='items')")
    con.close()
    again = make_memory("old")
    conn: Any = again.store.conn  # type: ignore[attr-defined]
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"items_listing", "items_recent"} <= indexes
    assert [h.item.key for h in again.item_store().search(("u",), filter={"a": 1})] == ["k"]
    assert [h.item.key for h in again.item_store().search((), filter={"a": 1})] == ["k"]


@pytest.mark.parametrize("spread", [12, 40, 150], ids=["merged", "newest-then-merged", "newest-then-range"])
def test_a_listing_of_a_prefix_over_many_namespaces_reads_the_newest_rows_not_the_sorted_range(
        make_memory: Callable[..., TieredMemory], spread: int) -> None:
    """A prefix with many namespaces below it was a range of items_listing sorted for each page
    (SQLite keeps no range statistics): 84 ms a page at 100,000 items in 100 namespaces (the empty
    prefix: 1 ms). Its first page now sorts no range: below few namespaces (16) their pages are
    merged; below more (54, 200) the newest rows are read first, from items_recent, bounded. Its
    keyset pages concatenated are the whole listing (newest first, ties by the row written last:
    1,200 items written at six clock times), with a filter that keeps half, one that keeps one row
    (the newest rows fill no page: the namespaces' pages are merged, or past MERGED_MAX the range is
    read), expired items left out, one user's items, and the last pages (short ones)."""
    clock = [1_800_000_000.0]
    memory = make_memory(clock=lambda: clock[0])
    for batch in range(6):
        memory.item_store().write_many([ItemWrite(
            namespace=("u", f"n{n % spread}", "d")[:1 + (n % 7 != 0) + (n % 3 == 0)], key=f"{batch}-{n}",
            user_id="bob" if n % 4 == 0 else "ana", value={"n": n, "even": n % 2 == 0},
            ttl_minutes=1 if n % 10 == 3 else None) for n in range(batch * 200, batch * 200 + 200)])
        clock[0] += 30
    layers = open_layer_store(memory.store)
    below = len({i.namespace for i in layers.items_under(("u",))} - {("u",)})
    assert below == {12: 16, 40: 80, 150: 200}[spread] and merged_at_once(10) == 20 and MERGED_MAX == 100
    conn: Any = memory.store.conn  # type: ignore[attr-defined]
    reads = item_reads(memory, lambda: layers.items_page(("u",), 10, live_at=1e10))
    plans = [" | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}")) for sql in reads]
    assert not [p for p in plans if "ns_path>? AND ns_path<?" in p and "TEMP B-TREE" in p], plans
    assert any(("MERGE (UNION ALL)" if spread == 12 else "LIST SUBQUERY") in p for p in plans), plans

    live_at = 1_800_000_000.0 + 100  # the first batches' expiring items have expired
    for flt, user in [(None, None), ({"even": True}, None), (None, "bob"), ({"n": 1101}, None)]:
        whole = [(i.key, i.updated_at) for i in layers.items_under(("u",), live_at=live_at, filter=flt)
                 if user is None or i.user_id == user]
        tail = layers.items_page(("u",), len(whole) - 25, None, live_at, flt, user)[-1][1] if len(whole) > 40 else None
        for after, want in [(None, whole[:60]), (tail, whole[len(whole) - 25:])]:
            got: list[Any] = []
            for _ in range(6):
                page = layers.items_page(("u",), 10, after, live_at, flt, user)
                got += [(i.key, i.updated_at) for i, _ in page]
                after = page[-1][1] if page else after
            assert got == want and want, (flt, user, after)


def test_a_listing_page_the_newest_rows_cannot_serve_merges_the_namespaces_pages(
        make_memory: Callable[..., TieredMemory]) -> None:
    """Below a prefix whose rows are older than the rest, past a cursor at the listing's end, or with
    a filter that keeps one row, the newest rows fill no page: the prefix's whole range was then
    read and sorted (bench/item_listing.py: the page past the end 5-10 times slower at 100,000 items
    in 100 namespaces). Below up to MERGED_MAX namespaces, such a page now seeks each namespace in
    items_listing's order and merges their pages: no read sorts, each namespace is one seek (past
    the cursor when there is one), and the pages are the listing's."""
    clock = [1_800_000_000.0]
    memory = make_memory(clock=lambda: clock[0])
    for batch in range(2):  # ("o",) first: older than every row of ("u",)
        memory.item_store().write_many([ItemWrite(namespace=("o", f"n{n % 30}"), key=f"o{batch}-{n}",
                                                  user_id="u", value={"n": n}) for n in range(300)])
        clock[0] += 30
    memory.item_store().write_many([ItemWrite(namespace=("u", "n"), key=f"u{n}", user_id="u", value={"n": n})
                                    for n in range(300)])
    layers = open_layer_store(memory.store)
    conn: Any = memory.store.conn  # type: ignore[attr-defined]
    whole = [(i.key, i.updated_at) for i in layers.items_under(("o",))]
    end = layers.items_page(("o",), len(whole) - 4)[-1][1]
    for after, flt, want in [(None, None, whole[:10]), (end, None, whole[-4:]), (None, {"n": 7}, whole)]:
        pages: list[Any] = []
        reads = item_reads(memory, lambda: pages.append(layers.items_page(("o",), 10, after, live_at=1e10, filter=flt)))
        assert [(i.key, i.updated_at) for i, _ in pages[0]] == [w for w in want if flt is None or w[0].endswith("-7")]
        plans = [" | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}")) for sql in reads]
        assert not [p for p in plans if "ns_path>? AND ns_path<?" in p and "TEMP B-TREE" in p], plans
        # ("o",) itself, its 30 namespaces (more than 20: the newest 80 rows are read first), then merged
        assert len(reads) == 5 and "LIMIT 80)" in reads[2] and "MERGE (UNION ALL)" in plans[4], reads
        seek = "(ns_path=? AND updated_at<?)" if after else "(ns_path=?)"
        assert plans[4].count(f"SEARCH items USING INDEX items_listing {seek}") == 30, plans[4]


@pytest.mark.record_stores("postgres")
def test_a_postgres_page_of_the_newest_rows_or_the_merged_namespaces_is_the_pages_range_read(memory: TieredMemory
                                                                                             ) -> None:
    """The reads a listing page tries before the range (the newest rows; the namespaces below the
    prefix, found by a seek each, and their pages merged) are portable SQL: on PostgreSQL a page
    they give is the one the range read gives (after a cursor, with a filter, ties on updated_at),
    and the namespaces come in code-point order, as items_listing holds them, whatever the
    database's collation."""
    labels = ["a", "B", "é", "_", "Z"]
    memory.item_store().write_many([ItemWrite(namespace=("u", labels[n % 5], "d")[:2 + n % 2], key=f"k{n}",
                                              user_id="u", value={"even": n % 4 < 2}) for n in range(60)])
    layers: Any = open_layer_store(memory.store)
    paths = [r[0] for r in layers.query(*namespaces_below_sql(("u",), 101, "postgres"))]
    assert paths == sorted(ns_path(ns) for ns in {("u", x, *d) for x in labels for d in [(), ("d",)]})
    assert [r[0] for r in layers.query(*namespaces_below_sql(("u",), 3, "postgres"))] == paths[:3]
    where = item_filter_sql({"even": True}, "postgres")[:2]
    first = layers.query(*items_page_sql(("u",), 10, None, 2.0, "postgres", where, "deeper"))
    for after in (None, (float(first[3][-2]), int(first[3][-1]))):
        ranged = layers.query(*items_page_sql(("u",), 5, after, 2.0, "postgres", where, "deeper"))
        newest = layers.query(*items_recent_sql(("u",), 5, after, 2.0, "postgres", where, 30))
        merged = layers.query(*items_merged_sql(paths, 5, after, 2.0, "postgres", where))
        lateral = layers.query(*items_lateral_sql(paths, 5, after, 2.0, where))
        assert len(newest) == 5 and newest == ranged == merged == lateral, after


@pytest.mark.record_stores("postgres")
def test_a_postgres_page_the_newest_rows_cannot_serve_seeks_each_namespaces_page(memory: TieredMemory) -> None:
    """On PostgreSQL a page below a prefix that the newest rows could not fill (rows older than
    the rest, a page past a cursor, the page past the end) read the namespaces' range past the
    cursor whole: 44-56 ms a page at 100,000 items (bench/item_listing.py). It now seeks each
    namespace's page (LATERAL, items_listing's Index Cond, no Seq Scan) and sorts at most ``limit`` rows a
    namespace: the same pages. A filtered page, whose few rows left each namespace read to its
    end (2-5 times slower), reads the range as before."""
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("o", f"n{n % 12}"), key=f"k{n}", user_id="u",
                                value={"even": n % 2 == 0}) for n in range(120)])
    items.write_many([ItemWrite(namespace=("u", f"n{n % 3}"), key=f"k{n}", user_id="u", value={})
                      for n in range(200)])  # newer: the newest rows hold none of ("o",)
    layers: Any = open_layer_store(memory.store)
    with layers.transaction() as c:  # the planner's statistics, as autovacuum gathers them
        c.execute("ANALYZE items")
    statements: list[tuple[str, list[Any]]] = []
    query = layers.query
    layers.query = lambda sql, params=(): statements.append((sql, list(params))) or query(sql, params)

    def lateral() -> list[tuple[str, list[Any]]]:
        return [(sql, params) for sql, params in statements if "LATERAL" in sql]

    whole = query(*items_page_sql(("o",), 200, None, 1e10, "postgres"))
    cursors = [(float(r[-2]), int(r[-1])) for r in whole]
    for after in (None, cursors[37], cursors[-3], cursors[-1]):  # the newest rows past cursors[37] serve it
        statements.clear()
        page = [c for _, c in layers.items_page(("o",), 5, after, live_at=1e10)]
        assert page == (cursors[cursors.index(after) + 1:][:5] if after else cursors[:5]), after
        assert len(lateral()) == (after != cursors[37]), statements
        if after == cursors[37]:
            continue
        plan = "\n".join(str(r[0]) for r in query(f"EXPLAIN {lateral()[0][0]}", lateral()[0][1]))
        seeks = [line for line in plan.splitlines() if "Index Cond: (" in line and "= below.path" in line]
        assert "items_listing" in plan and seeks and "Seq Scan" not in plan, plan
    statements.clear()
    evens = [(float(r[-2]), int(r[-1])) for r in query(*items_page_sql(
        ("o",), 5, None, 1e10, "postgres", item_filter_sql({"even": True}, "postgres")[:2]))]
    assert [c for _, c in layers.items_page(("o",), 5, None, live_at=1e10, filter={"even": True})] == evens
    assert len(evens) == 5 and not lateral(), statements


@pytest.mark.record_stores("postgres")
def test_a_postgres_filter_read_by_parallel_workers_does_not_fail(memory: TieredMemory) -> None:
    """items_value_jsonb reads a value that is not JSON as {} in an EXCEPTION block, a
    subtransaction, which no parallel worker may start; it was declared PARALLEL SAFE, so a filtered
    read the planner gave to workers failed ("cannot start subtransactions during a parallel
    operation"): a filtered items_under over 100,000 items (Parallel Seq Scan), a listing's merged
    namespaces (Parallel Append). Workers are forced here; the function is now PARALLEL UNSAFE."""
    memory.item_store().write_many([ItemWrite(namespace=("u", "n"), key=str(n), user_id="u", value={"n": n})
                                    for n in range(20)])
    layers: Any = open_layer_store(memory.store)
    sql, params = items_under_sql(("u",), dialect="postgres")
    where, args, _ = item_filter_sql({"n": 7}, "postgres")
    with layers.transaction() as c:
        c.execute("SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000"
                  " THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', true)")
        assert [r[3] for r in c.execute(sql + where, [*params, *args]).fetchall()] == ["7"]


def test_a_filter_of_many_values_or_keys_lists_on_every_path(memory: TieredMemory) -> None:
    """An ``$in`` of 1,000 values (or a filter of 1,000 keys) was one chain of 1,000 ORs (ANDs),
    deeper than SQLite parses ("Expression tree is too large (maximum depth 1000)"): the listing
    failed with a StoreError. The chain is now balanced, in the page that merges the namespaces
    below a prefix too (the filter once for each of eight: 1.5 MB of SQL, 24,000 parameters)."""
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("u", f"n{n % 8}")[:1 + n % 3 // 2], key=f"k{n}", user_id="u",
                                value={"n": n, **{f"f{k}": k for k in range(3)}}) for n in range(40)])
    many = {"n": {"$in": list(range(3, 1003))}}
    keys = {f"f{k}": k for k in range(1000)}
    found: list[Any] = []
    reads = item_reads(memory, lambda: found.extend(items.search(("u",), filter=many, limit=3)))
    assert [h.item.key for h in found] == ["k39", "k38", "k37"] and reads[-1].count(" UNION ALL ") == 7
    assert [h.item.key for h in items.search((), filter={"n": {"$nin": list(range(1000))}})] == []
    assert [h.item.key for h in items.search(("u",), filter={**keys, **{f"f{k}": {"$exists": False}
                                                                       for k in range(3, 1000)}}, limit=2)] == [
        "k39", "k38"]


@pytest.mark.record_stores("sqlite")
def test_a_listing_of_a_large_prefix_reads_a_bounded_page(memory: TieredMemory) -> None:
    """Every row under the prefix was read (no LIMIT) to return ten; the reads now ask for the
    page, and a filter is decided in the database: a filter that keeps few reads one page too."""
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("u", "n"), key=f"k{n}", user_id="u", value={"n": n, "tenth": n % 10 == 0})
                      for n in range(3000)])
    seen: list[str] = []
    memory.store.conn.set_trace_callback(seen.append)  # type: ignore[attr-defined]
    try:
        assert len(items.search(("u",), limit=10, offset=20)) == 10
        assert len(items.search(("u",), filter={"tenth": True}, limit=10)) == 10
    finally:
        memory.store.conn.set_trace_callback(None)  # type: ignore[attr-defined]
    reads = [s for s in seen if "FROM items" in s]
    below = [s for s in reads if s.startswith("WITH RECURSIVE below")]  # the namespaces below ("u",): one
    asked = [int(s.rsplit("LIMIT", 1)[1]) for s in reads if s not in below]
    # ("u",), then the page of the one namespace below it, for the page of 30 and the filtered page of 10
    assert len(below) == 2 and asked == [30, 30, 10, 10]
    assert not [s for s in reads if "count(*)" in s or "rowid IN" in s]
