"""Opens per second of an embedded memory (SQLite + Chroma + the static embedder): one folder
holding one user's few turns, opened and closed ``--opens`` times, then opened, searched and
closed as many times; each way of building Chroma's settings in turn, alternated over
``--rounds`` in one run so that both columns see the same machine load::

    python -m bench.open_speed --opens 100 --rounds 3

"built each open" is Chroma's ``Settings`` made anew for every client (what the library did
until December 2026); "as shipped" is :func:`tiered_memory.vector.chroma_client.client_settings`. Each cell is the
median over the rounds of opens per second of wall time, and of this process's CPU time (in
brackets: what another process's load on the machine moves least).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from tiered_memory import StaticEmbedder, TieredMemory  # noqa: E402
from tiered_memory.vector import chroma  # noqa: E402
from tiered_memory.vector.chroma_client import client_settings  # noqa: E402


def built_each_open(**given: Any) -> Any:
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False, **given)


def per_second(folder: Path, embedder: StaticEmbedder, opens: int, search: bool) -> tuple[float, float]:
    """Opens a second of wall time, and of this process's CPU time (steadier on a shared machine)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(opens):
        with TieredMemory(folder, embedder=embedder) as memory:
            if search:
                memory.search("hello", user_id="u")
    return opens / (time.perf_counter() - wall), opens / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--opens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    embedder = StaticEmbedder()
    ways: dict[str, Callable[..., Any]] = {"built each open": built_each_open, "as shipped": client_settings}
    found: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "m"
        with TieredMemory(folder, embedder=embedder) as memory:
            memory.add_many([{"role": "user", "content": f"hello number {i}"} for i in range(20)],
                            session_id="s", user_id="u")
        per_second(folder, embedder, 10, True)  # warm up: imports, the first client
        for _ in range(args.rounds):
            for name, way in ways.items():
                chroma.client_settings = way  # type: ignore[attr-defined]
                for search in (False, True):
                    found.setdefault((name, search), []).append(per_second(folder, embedder, args.opens, search))
        chroma.client_settings = client_settings  # type: ignore[attr-defined]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.opens} opens a round, {args.rounds} rounds, median")
    print(f"{'settings':<17}{'open+close /s (CPU /s)':>26}{'open+search+close /s (CPU /s)':>33}")
    for name in ways:
        cells = [f"{statistics.median(w for w, _ in found[name, s]):.1f} "
                 f"({statistics.median(c for _, c in found[name, s]):.1f})" for s in (False, True)]
        print(f"{name:<17}{cells[0]:>26}{cells[1]:>33}")


if __name__ == "__main__":
    main()
