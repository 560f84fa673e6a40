"""The item store's listing on PostgreSQL, a page read again and again on one connection: planned
with its values, as the store reads it, against prepared (what it did before: psycopg prepares a
statement run five times on a connection, and PostgreSQL may then keep a generic plan, blind to the
prefix and the filter's values). Both in the same run, in alternating rounds, checked to be the same
pages; milliseconds a page are medians of the rounds. A script that prints numbers, not a timed test::

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
from tiered_memory.backends import open_layer_store  # noqa: E402
from tiered_memory.layers.items import ItemWrite  # noqa: E402
from tiered_memory.store.layer_items import LayerItems  # noqa: E402
from tiered_memory.store.postgres import PostgresRecordStore  # noqa: E402

LIVE_AT = 4e9


def ms_a_page(read: Callable[[], Any], pages: int) -> tuple[float, Any]:
    began, page = time.perf_counter(), None
    for _ in range(pages):
        page = read()
    return (time.perf_counter() - began) * 1000 / pages, page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-store", required=True, help="a PostgreSQL URL (an empty database, or this script's)")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--pages", type=int, default=10, help="reads of the page a round, each way")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    store = PostgresRecordStore(args.record_store, max_size=1)  # one connection: its prepared statements
    with tempfile.TemporaryDirectory() as folder:
        memory = TieredMemory(Path(folder) / "m", embedder=StaticEmbedder(), record_store=store)
        items, layers = memory.item_store(), open_layer_store(memory.store)
        for start in range(0, args.items if layers.count_items() < args.items else 0, 5000):  # filled once
            items.write_many([ItemWrite(namespace=("u", f"n{n % args.namespaces}"), key=f"k{n}", user_id="u",
                                        value={"n": n, "rare": n % 5000 == 4321})
                              for n in range(start, min(start + 5000, args.items))])
        with layers.transaction() as c:
            c.execute("ANALYZE items")
        half = args.items // 2
        for label, prefix, flt in [("no filter", ("u",), None),
                                   ("eq: 4,999 in 5,000", ("u",), {"rare": False}),
                                   ("$gte: a half", ("u",), {"n": {"$gte": half}}),
                                   ("eq: 1 row in 5,000", ("u",), {"rare": True}),
                                   ("eq: 1 in 5,000, every ns", (), {"rare": True})]:
            def now() -> Any:
                return layers.items_page(prefix, 10, None, LIVE_AT, flt)

            def prepared() -> Any:  # the same reads, through the shared code, as before: prepared
                return LayerItems.items_page(layers, prefix, 10, None, LIVE_AT, flt)

            ms_a_page(prepared, 6)  # past psycopg's prepare_threshold and the server's five custom plans
            ms_a_page(now, 1)
            times: dict[str, list[float]] = {"now": [], "prepared": []}
            for turn in range(args.rounds):
                for name, read in [("now", now), ("prepared", prepared)][::1 if turn % 2 else -1]:
                    ms, page = ms_a_page(read, args.pages)
                    times[name].append(ms)
                    assert page == now(), label  # the same page
            after, before = (statistics.median(times[k]) for k in ("now", "prepared"))
            print(f"{label:26} {after:8.2f} ms a page, prepared {before:8.2f} ({before / after:5.1f}x)"
                  f" ({args.items} items, {args.namespaces} namespaces)")
        generic = store.query("SELECT count(*) FROM pg_prepared_statements WHERE generic_plans > 0")[0][0]
        print(f"prepared statements with generic plans on the connection: {generic}")
        memory.close()


if __name__ == "__main__":
    main()
