"""The item store's listing (the LangGraph store's ``search(namespace_prefix)`` with no query)
on SQLite: milliseconds a page for the empty prefix, a prefix with many namespaces below it and
one namespace, over ``--items`` items in ``--namespaces`` namespaces. A script that prints
numbers, not a timed test; read the prefix's row against the others::

    python -m bench.item_listing
    python -m bench.item_listing --items 20000 --pages 20
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiered_memory import StaticEmbedder, TieredMemory  # noqa: E402
from tiered_memory.layers.items import ItemWrite  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--namespaces", type=int, default=100)
    parser.add_argument("--pages", type=int, default=10, help="pages read (keyset) per prefix")
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        memory = TieredMemory(Path(folder) / "m", embedder=StaticEmbedder())
        items = memory.item_store()
        batch = 5000
        for start in range(0, args.items, batch):
            items.write_many([ItemWrite(namespace=("u", f"n{n % args.namespaces}"), key=f"k{n}", user_id="u",
                                        value={"n": n}) for n in range(start, min(start + batch, args.items))])
        for label, prefix in [("empty prefix", ()), ('prefix ("u",)', ("u",)), ("one namespace", ("u", "n0"))]:
            items.search(prefix, limit=args.limit)  # warm the cache
            began = time.perf_counter()
            for page in range(args.pages):
                items.search(prefix, limit=args.limit, offset=page * args.limit)
            ms = (time.perf_counter() - began) * 1000 / args.pages
            print(f"{label:16} {ms:8.2f} ms a page ({args.items} items, {args.namespaces} namespaces)")
        memory.close()


if __name__ == "__main__":
    main()
