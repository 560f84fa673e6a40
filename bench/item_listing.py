"""The item store's listing (the LangGraph store's ``search(namespace_prefix)`` with no query)
on SQLite (PostgreSQL with ``--record-store URL``): milliseconds a page for the empty prefix, a
prefix with many namespaces below it and one namespace, over ``--items`` items in
``--namespaces`` namespaces; then the pages of a listing that a read of the newest rows cannot
serve (a prefix whose rows are older than the rest, a filter that keeps one row in thousands, the
listing's last pages, the page past its end), each read as today and as before the namespaces'
pages were merged (``old``: the newest rows, then the prefix's range sorted; on PostgreSQL, its
read before a page without a filter merged them with ``LATERAL``), in the same run and checked to
be the same pages. A script that prints numbers, not a timed test; read the rows
against each other::

    python -m bench.item_listing
    python -m bench.item_listing --items 20000 --pages 20
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiered_memory import StaticEmbedder, TieredMemory  # noqa: E402
from tiered_memory.backends import open_layer_store  # noqa: E402
from tiered_memory.layers.items import ItemWrite  # noqa: E402
from tiered_memory.store.item_filter_sql import item_filter_sql  # noqa: E402
from tiered_memory.store.layer_codec import (item_from_row, items_page_sql, items_recent_sql,  # noqa: E402
                                             items_under_sql)
from tiered_memory.store.layer_items import recent_scans  # noqa: E402

LIVE_AT = 4e9  # the listing leaves out the items expired by now: its reads check each row, as here

#: the listing's page as one store reads it: (prefix, limit, after, filter) -> rows
Read = Callable[[Sequence[str], int, Any, Any], list[Any]]


def old_page(layers: Any) -> Read:
    """A page as the store read it before the namespaces' pages were merged: the namespace itself,
    and below it the newest rows of items_recent (twice, bounded) or else the sorted range."""
    def deeper(prefix: Sequence[str], limit: int, after: Any, where: tuple[str, list[Any]]) -> list[Any]:
        scans = recent_scans(limit)
        range_sql, range_params = items_under_sql(prefix, "1", layers.dialect, "deeper")
        held = int(layers.query(f"SELECT count(*) FROM ({range_sql} LIMIT ?) AS deeper",
                                [*range_params, scans[-1]])[0][0])
        for scan in scans if held >= scans[-1] else ():
            rows = layers.query(*items_recent_sql(prefix, limit, after, LIVE_AT, layers.dialect, where, scan))
            if len(rows) >= limit:
                return list(rows)
        return list(layers.query(*items_page_sql(prefix, limit, after, LIVE_AT, layers.dialect, where, "deeper")))

    def read(prefix: Sequence[str], limit: int, after: Any, flt: Any) -> list[Any]:
        where = item_filter_sql(flt, layers.dialect)[:2]
        rows = [*layers.query(*items_page_sql(prefix, limit, after, LIVE_AT, layers.dialect, where, "exact")),
                *deeper(prefix, limit, after, where)]
        rows.sort(key=lambda r: (float(r[-2]), int(r[-1])), reverse=True)
        return [(item_from_row(r), (float(r[-2]), int(r[-1]))) for r in rows[:limit]]
    return read


def new_page(layers: Any) -> Read:
    return lambda prefix, limit, after, flt: list(layers.items_page(prefix, limit, after, LIVE_AT, flt))


def ms_a_page(read: Read, prefix: Sequence[str], limit: int, pages: int, after: Any = None, flt: Any = None,
              advance: bool = True) -> tuple[float, list[Any]]:
    """Milliseconds a keyset page of ``pages`` pages from ``after`` (or the page after ``after``
    ``pages`` times, not ``advance``), and the cursors read."""
    read(prefix, limit, after, flt)  # warm the cache
    cursors: list[Any] = []
    began = time.perf_counter()
    for _ in range(pages):
        page = read(prefix, limit, after, flt)
        cursors += [c for _, c in page]
        after = page[-1][1] if page and advance else after
    return (time.perf_counter() - began) * 1000 / pages, cursors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--pages", type=int, default=10, help="pages read (keyset) per prefix")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--older", type=int, default=20_000, help='items under ("o",), written first')
    parser.add_argument("--record-store", default=None, help="a PostgreSQL URL (an empty database); else SQLite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        memory = TieredMemory(Path(folder) / "m", embedder=StaticEmbedder(), record_store=args.record_store)
        items = memory.item_store()
        batch = 5000
        for start in range(0, args.older + args.items, batch):  # ("o",) first: older than every other row
            items.write_many([ItemWrite(namespace=("o" if n < args.older else "u", f"n{n % args.namespaces}"),
                                        key=f"k{n}", user_id="u", value={"n": n, "rare": n % 5000 == 4321})
                              for n in range(start, min(start + batch, args.older + args.items))])
        shape = f"({args.items} items, {args.namespaces} namespaces; {args.older} older)"
        for label, prefix in [("empty prefix", ()), ('prefix ("u",)', ("u",)), ("one namespace", ("u", "n0"))]:
            items.search(prefix, limit=args.limit)  # warm the cache
            began = time.perf_counter()
            for page in range(args.pages):
                items.search(prefix, limit=args.limit, offset=page * args.limit)
            ms = (time.perf_counter() - began) * 1000 / args.pages
            print(f"{label:24} {ms:8.2f} ms a page {shape}")
        layers = open_layer_store(memory.store)
        whole = layers.items_page(("u",), args.items, None)
        last = whole[-args.limit * args.pages // 2 - 1][1]  # the cursor half the pages before the end
        limit = args.limit
        cases = [('first pages of ("u",)', ("u",), None, None, True, limit),
                 ('first pages, limit x10', ("u",), None, None, True, 10 * limit),
                 ('older prefix ("o",)', ("o",), None, None, True, limit),
                 ("filter: 1 row in 5,000", ("u",), None, {"rare": True}, True, limit),
                 ('last pages of ("u",)', ("u",), last, None, True, limit),
                 ('the page past the end', ("u",), whole[-1][1], None, False, limit)]
        for label, prefix, after, flt, advance, limit in cases:
            now, read = ms_a_page(new_page(layers), prefix, limit, args.pages, after, flt, advance)
            before, was = ms_a_page(old_page(layers), prefix, limit, args.pages, after, flt, advance)
            assert read == was, label  # the same pages, the same cursors
            print(f"{label:24} {now:8.2f} ms a page, old {before:8.2f} ({before / now:5.1f}x) {shape}")
        memory.close()


if __name__ == "__main__":
    main()
