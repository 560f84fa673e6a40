"""On PostgreSQL, the item store's listing and filtered search are planned with their values, and
so is a large user's keyword search of items and of turns.

psycopg prepares a statement run five times on a connection; PostgreSQL may then reuse a generic
plan, one that cannot see the namespace prefix, the filter's values or how many rows a read scans
(a page of a filter that keeps one item in 5,000 took 467 ms that way, 91 ms planned with its
values: ``docs/langgraph_store.md``). The statements of a filtered listing page, of a count of a
prefix and of a filtered search or of a user's listing must never be planned generically, nor the
keyword match of a large user's items or turns (``keyword_search``, ``candidates``); a point lookup
may stay prepared, and so may a page without a filter or a user (its seeks serve any prefix), and a
small user's match row by row (it reads the user's rows whatever the plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.layers.items import ItemWrite
from tiered_memory.store.postgres import PostgresRecordStore
from tiered_memory.types import StoredMessage

pytestmark = pytest.mark.servers


def test_a_listing_run_again_is_planned_with_its_values(make_postgres_url: Callable[[], str],
                                                       tmp_path: Path) -> None:
    # one connection: every read is on it, and so are the prepared statements read below. "u" is
    # a large user to keyword search (matched through the GIN index, not row by row), one of many
    # users: a generic plan took the average user's few rows and read all of u's to match a word
    store = PostgresRecordStore(make_postgres_url(), max_size=1, user_scan_rows=100)
    memory = TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), record_store=store)
    try:
        items = memory.item_store()
        items.write_many([ItemWrite(namespace=("u", f"n{n % 4}"), key=f"k{n}", user_id="u", text=f"note {n}",
                                    value={"n": n, "rare": n % 50 == 7, "text": f"note {n}"}) for n in range(200)]
                         + [ItemWrite(namespace=("o",), key=f"k{n}", user_id=f"o{n}", value={}) for n in range(300)])
        rare = sorted(f"k{n}" for n in range(200) if n % 50 == 7)
        for _ in range(8):  # past psycopg's prepare_threshold (5) and PostgreSQL's five custom plans
            assert sorted(h.item.key for h in items.search(("u",), filter={"rare": True}, limit=10)) == rare
            assert len(items.search(("u",), user_id="u", limit=10)) == 10
            assert len(items.search((), filter={"n": {"$gte": 190}}, limit=20)) == 10
            assert len(items.search(("u",), query="note", user_id="u", filter={"rare": True}, limit=10)) == 4
            assert [h.item.key for h in items.search(("u",), query="157", user_id="u", limit=1)] == ["k157"]
            assert items.get(("u", "n3"), "k7") is not None
        generic = store.query("SELECT statement FROM pg_prepared_statements WHERE generic_plans > 0"
                              " AND statement LIKE 'SELECT%%' AND statement LIKE '%%FROM items%%'")
        assert [s for (s,) in generic if "key=" not in s.replace(" ", "")] == []
        lookups = store.query("SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%FROM items%%'")
        assert any("key=" in s.replace(" ", "") for (s,) in lookups)  # a point lookup stays prepared
    finally:
        memory.close()


def test_a_large_users_turn_search_run_again_is_planned_with_its_values(make_postgres_url: Callable[[], str]) -> None:
    # the turns' keyword match, as the items': "u" is past user_scan_rows (matched through the GIN
    # index), one of many users with a few turns each; a generic plan took the average user's few
    # rows and read every turn of u to match a word (bench/item_plans.py, turn_keyword_rounds)
    store = PostgresRecordStore(make_postgres_url(), max_size=1, user_scan_rows=100)
    try:
        store.insert_messages([StoredMessage(id=f"u{n}", user_id="u", session_id=f"s{n % 3}", role="user",
                                             content=f"turn {n}{' zebra' if n % 50 == 7 else ''}", timestamp=n)
                               for n in range(200)]
                              + [StoredMessage(id=f"o{n}", user_id=f"o{n % 150}", session_id="s", role="user",
                                               content=f"other zebra {n}", timestamp=n) for n in range(300)],
                              indexed=True)
        rare = {"u7", "u57", "u107", "u157"}
        for _ in range(12):  # prepared at the 6th run (psycopg's prepare_threshold), then 5 custom plans
            assert {i for i, _ in store.keyword_search("u", ["zebra"], k=10)} == rare
            assert {i for i, _ in store.keyword_search("u", ["zebra"], k=10, session_id="s1")} == {"u7", "u157"}
            records, matches = store.candidates("u", ["u1"], ["zebra"], k=10)
            assert {i for i, _ in matches} == rare and set(records) == rare | {"u1"}
            assert {i for i, _ in store.keyword_search("o7", ["zebra"], k=10)} == {"o7", "o157"}  # row by row
        generic = store.query("SELECT statement FROM pg_prepared_statements WHERE generic_plans > 0"
                              " AND statement LIKE '%%FROM messages%%'")
        assert [s for (s,) in generic if "@@" in s and "OFFSET 0" not in s] == []
        fenced = store.query("SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%OFFSET 0%%'")
        assert fenced  # a small user's match, the user's rows whatever the plan, stays prepared
    finally:
        store.close()
