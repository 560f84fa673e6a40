"""The item store's listing on PostgreSQL, a page read again and again on one connection: planned
with its values, as the store reads it, against prepared (what it did before: psycopg prepares a
statement run five times on a connection, and PostgreSQL may then keep a generic plan, blind to the
prefix and the filter's values). Both in the same run, in alternating rounds, checked to be the same
pages; milliseconds a page are medians of the rounds. Then a large user's keyword search of its items,
and of its turns (the record store's ``keyword_search`` and ``candidates``), the same way. A script
that prints numbers, not a timed test::

    python -m bench.item_plans --record-store postgresql://...  # an empty database, or one it filled
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiered_memory import StaticEmbedder, TieredMemory  # noqa: E402
from tiered_memory.layers.items import ItemWrite  # noqa: E402
from tiered_memory.store.layer_items import LayerItems  # noqa: E402
from tiered_memory.store.postgres import PostgresRecordStore  # noqa: E402
from tiered_memory.store.postgres_layers import PostgresLayerStore  # noqa: E402

LIVE_AT = 4e9


def ms_a_page(read: Callable[[], Any], pages: int) -> tuple[float, Any]:
    began, page = time.perf_counter(), None
    for _ in range(pages):
        page = read()
    return (time.perf_counter() - began) * 1000 / pages, page


def keyword_rounds(url: str, big: int, rounds: int, pages: int) -> None:
    """A large user's keyword search of its items, planned with its values (as ``keyword`` runs it)
    against the same statement prepared (as it ran before). Its own schema of the database: rows
    with text, written once by SQL (no vectors: a keyword search reads none), ``big`` of user
    "big" and 20 of each of 500 others."""
    store = PostgresRecordStore(url, schema="item_plans_keywords", max_size=1)
    layers = PostgresLayerStore(store)
    if layers.count_items() < big:
        with layers.transaction() as c:
            c.execute("DELETE FROM items")
            c.execute("INSERT INTO items (id, user_id, ns_path, namespace, key, value, text, created_at, updated_at)"
                      " SELECT 'i' || n, CASE WHEN n < ? THEN 'big' ELSE 's' || (n % 500) END, 'p', '[\"p\"]',"
                      " 'k' || n, '{}', 'note ' || n || CASE WHEN n % 5000 = 7 THEN ' zebra' ELSE '' END, n, n"
                      " FROM generate_series(0, ? - 1) AS n", (big, big + 10_000))
            c.execute("ANALYZE items")
    # keyword()'s statement for a user past user_scan_rows (matched through the GIN index)
    sql = ("SELECT t.id, ts_rank(t.tsv, q) AS s FROM items t, to_tsquery('english', fold_diacritics(%s)) AS q"
           " WHERE t.tsv @@ q AND t.user_id = %s  ORDER BY s DESC, t.rowid DESC LIMIT %s")
    for label, user, words in [("a rare word, large user", "big", ["zebra"]),
                               ("a common word, large user", "big", ["note"]),
                               ("a rare word, small user", "s7", ["zebra"])]:
        def now() -> Any:
            return layers.keyword_items(user, words, 40)

        def prepared() -> Any:  # the bounded count of the user's rows, then the match
            if user != "big":  # a small user is matched row by row, prepared both ways
                return now()
            store.read(lambda conn: store.user_rows(conn, "items", user, store.user_scan_rows))
            return [(r[0], float(r[1])) for r in store.query(sql, (" | ".join(words), user, 40))]

        ms_a_page(prepared, 11)  # prepared at the 6th run (psycopg), generic after five custom plans
        times: dict[str, list[float]] = {"now": [], "prepared": []}
        for turn in range(rounds):
            for name, read in [("now", now), ("prepared", prepared)][::1 if turn % 2 else -1]:
                ms, found = ms_a_page(read, pages)
                times[name].append(ms)
                assert found == now(), label  # the same matches
        after, before = (statistics.median(times[k]) for k in ("now", "prepared"))
        print(f"keyword: {label:26} {after:8.2f} ms, prepared {before:8.2f} ({before / after:5.1f}x)"
              f" ({big} items of the large user, 10,000 of 500 others)")
    store.close()


def turn_keyword_rounds(url: str, big: int, rounds: int, pages: int) -> None:
    """A large user's keyword search of its turns (``keyword_search``) and the search's candidates
    (``candidates``: the matches and the records of them and of the vector hits, one statement),
    planned with their values (as the store runs them) against prepared (as they ran before: the
    store's own statements with ``match_prepare`` answering psycopg's default). Its own schema: turns
    written once by SQL (no vectors: these read none), ``big`` of user "big" and 20 of each of 500 others."""
    from tiered_memory.store import postgres
    from tiered_memory.store.postgres_keywords import match_prepare

    store = PostgresRecordStore(url, schema="item_plans_turns", max_size=1)
    if store.counts()["messages"] < big:
        def fill(c: Any) -> None:
            c.execute("DELETE FROM messages")
            c.execute("INSERT INTO messages (id, user_id, session_id, role, content, timestamp, created_at, indexed)"
                      " SELECT 'm' || n, CASE WHEN n < %(big)s THEN 'big' ELSE 's' || (n %% 500) END, 's' || (n / 20),"
                      " 'user', 'turn ' || n || CASE WHEN n %% 5000 = 7 THEN ' zebra' ELSE '' END, n, n, TRUE"
                      " FROM generate_series(0, %(big)s + 9999) AS n", {"big": big})
            c.execute("ANALYZE messages")

        store.write(fill)
    hits = [f"m{n}" for n in range(0, big, big // 20)]  # what a vector search brought: 20 of the user's turns

    def searches(user: str, words: list[str]) -> list[tuple[str, Callable[[], Any]]]:
        return [("keyword_search", lambda: store.keyword_search(user, words, k=40)),
                ("candidates", lambda: store.candidates(user, hits, words, k=40))]

    for user, words in [("big", ["zebra"]), ("big", ["turn"]), ("s7", ["zebra"])]:
        label = f"{'a rare' if words == ['zebra'] else 'a common'} word, {'large' if user == 'big' else 'small'} user"
        for call, search in searches(user, words):
            def prepared(search: Callable[[], Any] = search) -> Any:
                setattr(postgres, "match_prepare", lambda fenced: None)  # psycopg's default: as before
                try:
                    return search()
                finally:
                    setattr(postgres, "match_prepare", match_prepare)

            ms_a_page(prepared, 11)  # prepared at the 6th run (psycopg), generic after five custom plans
            took = medians({"now": search, "prepared": prepared}, rounds, pages, label)
            after, before = took["now"], took["prepared"]
            print(f"turns, {call:15} {label:26} {after:8.2f} ms, prepared {before:8.2f} ({before / after:5.1f}x)"
                  f" ({big} turns of the large user, 10,000 of 500 others)")
    generic = store.query("SELECT count(*) FROM pg_prepared_statements WHERE generic_plans > 0"
                          " AND statement LIKE '%%@@%%' AND statement NOT LIKE '%%OFFSET 0%%'")[0][0]
    print(f"turns: a large user's match statements prepared with generic plans (the prepared runs): {generic}")
    store.close()


def medians(reads: dict[str, Callable[[], Any]], rounds: int, pages: int, label: str) -> dict[str, float]:
    """Milliseconds a read of each of ``reads``, medians of ``rounds`` (each round in another order),
    every read checked to give what the first gives."""
    times: dict[str, list[float]] = {name: [] for name in reads}
    names, first = list(reads), next(iter(reads.values()))
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            ms, page = ms_a_page(reads[name], pages)
            times[name].append(ms)
            assert page == first(), (label, name)  # the same page
    return {name: statistics.median(t) for name, t in times.items()}


def server_cpu(store: PostgresRecordStore) -> Callable[[], float]:
    """Seconds of CPU the server process of the store's one connection used so far (a server on
    this machine: /proc), else nothing (0.0)."""
    backend = int(store.query("SELECT pg_backend_pid()")[0][0])
    tick = os.sysconf("SC_CLK_TCK")

    def used() -> float:
        try:
            fields = Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    return used


def put_rounds(items: Any, layers: Any, store: PostgresRecordStore, rounds: int, n: int) -> None:
    """Puts, one item a write (LangGraph's put), with items_value and with it dropped, in rounds of
    either order: puts a second and CPU a put (this process and the server's), medians."""
    from tiered_memory.store.postgres_layers import VALUE_INDEX

    found: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    written = layers.count_items()
    for turn in range(rounds):
        for indexed in (True, False)[::1 if turn % 2 else -1]:
            with layers.transaction() as c:
                c.execute(VALUE_INDEX if indexed else "DROP INDEX IF EXISTS items_value")
            cpu = server_cpu(store)
            began, client, server = time.perf_counter(), time.process_time(), cpu()
            for k in range(written, written + n):
                items.write_many([ItemWrite(namespace=("w", f"n{k % 100}"), key=f"w{k}", user_id="u",
                                            value={"n": k, "rare": False})])
            wall = time.perf_counter() - began
            found[indexed].append((n / wall, (time.process_time() - client + cpu() - server) * 1000 / n))
            written += n
    with layers.transaction() as c:  # as the migration leaves it
        c.execute(VALUE_INDEX)
        c.execute("ANALYZE items")
    (rate, ms), (rate0, ms0) = ((statistics.median(r for r, _ in found[i]), statistics.median(m for _, m in found[i]))
                                for i in (True, False))
    print(f"put, one a write           {rate:8.0f} puts/s, no value index {rate0:8.0f} ({rate / rate0:5.2f}x);"
          f" CPU {ms:.2f} ms a put, no value index {ms0:.2f} ({ms / ms0:5.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-store", required=True, help="a PostgreSQL URL (an empty database, or this script's)")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--pages", type=int, default=10, help="reads of the page a round, each way")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keyword-items", type=int, default=50_000, help="the large user's items to keyword search")
    parser.add_argument("--puts", type=int, default=0, help="puts a round, with the value index and without")
    args = parser.parse_args()
    keyword_rounds(args.record_store, args.keyword_items, args.rounds, args.pages)
    turn_keyword_rounds(args.record_store, args.keyword_items, args.rounds, args.pages)
    store = PostgresRecordStore(args.record_store, max_size=1)  # one connection: its prepared statements
    with tempfile.TemporaryDirectory() as folder:
        memory = TieredMemory(Path(folder) / "m", embedder=StaticEmbedder(), record_store=store)
        items, layers = memory.item_store(), PostgresLayerStore(store)
        unindexed = PostgresLayerStore(store)  # the conditions alone, as before the value index
        unindexed.value_index = False
        for start in range(0, args.items if layers.count_items() < args.items else 0, 5000):  # filled once
            items.write_many([ItemWrite(namespace=("u", f"n{n % args.namespaces}"), key=f"k{n}", user_id="u",
                                        value={"n": n, "rare": n % 5000 == 4321})
                              for n in range(start, min(start + 5000, args.items))])
        with layers.transaction() as c:
            c.execute("ANALYZE items")
        half = args.items // 2
        for label, prefix, flt in [("no filter", ("u",), None),
                                   ("no filter, every ns", (), None),
                                   ("eq: 4,999 in 5,000", ("u",), {"rare": False}),
                                   ("$gte: a half", ("u",), {"n": {"$gte": half}}),
                                   ("eq: 1 row in 5,000", ("u",), {"rare": True}),
                                   ("eq: 1 in 5,000, every ns", (), {"rare": True}),
                                   ("eq: one item", ("u",), {"n": half})]:
            def now(on: PostgresLayerStore = layers) -> Any:
                return on.items_page(prefix, 10, None, LIVE_AT, flt)

            def prepared() -> Any:  # the same reads, through the shared code, as before: prepared
                return LayerItems.items_page(layers, prefix, 10, None, LIVE_AT, flt)

            ms_a_page(prepared, 6)  # past psycopg's prepare_threshold and the server's five custom plans
            ms_a_page(now, 1)
            took = medians({"now": now, "no value index": lambda: now(unindexed), "prepared": prepared},
                           args.rounds, args.pages, label)
            after, before, plain = took["now"], took["prepared"], took["no value index"]
            print(f"{label:26} {after:8.2f} ms a page, prepared {before:8.2f} ({before / after:5.1f}x),"
                  f" no value index {plain:8.2f} ({plain / after:5.1f}x)"
                  f" ({args.items} items, {args.namespaces} namespaces)")
        generic = store.query("SELECT count(*) FROM pg_prepared_statements WHERE generic_plans > 0")[0][0]
        print(f"prepared statements with generic plans on the connection: {generic}")
        if args.puts:
            put_rounds(items, layers, store, args.rounds, args.puts)
        memory.close()


if __name__ == "__main__":
    main()
