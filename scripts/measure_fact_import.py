"""Peak memory (tracemalloc) of importing a generated export of facts with their history.

Not a test: it prints numbers. Each fact line holds an ``add`` and an ``edit`` entry, every
tenth line is the history of a deleted fact; the entries' places in the history (``seq``)
interleave the facts (every fact's add first, then every edit), as a long-lived memory's do::

    PYTHONPATH=. python scripts/measure_fact_import.py --facts 50000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

from tiered_memory import TieredMemory


def _change(fact_id: str, action: str, old: str | None, new: str | None, at: float, seq: int) -> dict[str, object]:
    return {"fact_id": fact_id, "action": action, "old_text": old, "new_text": new, "at": at,
            "details": {"reason": "no related fact", "method": "rules", "source_ids": []}, "seq": seq}


def write_export(path: Path, n: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            fact_id, at = f"f{i:07d}", 1_700_000_000.0 + i
            old, new = f"User likes tea number {i}", f"User likes green tea number {i} with honey"
            history = [_change(fact_id, "add", None, old, at, i), _change(fact_id, "edit", old, new, at + 1, n + i)]
            if i % 10 == 9:
                history[1] = _change(fact_id, "delete", old, None, at + 1, n + i)
                line: dict[str, object] = {"format": "tiered-memory/1", "type": "fact_history", "user_id": "u",
                                           "fact_id": fact_id, "history": history}
            else:
                line = {"format": "tiered-memory/1", "type": "fact", "history": history, "fact": {
                    "id": fact_id, "user_id": "u", "type": "preference", "text": new, "confidence": 1.0,
                    "source_ids": [], "metadata": {"method": "manual"}, "created_at": at, "updated_at": at + 1,
                    "valid_from": at, "invalid_at": None, "superseded_by": None, "access_count": 0,
                    "last_access": None, "key": None, "polarity": 1}}
            f.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "facts.jsonl"
        write_export(path, args.facts)
        with TieredMemory(Path(tmp) / "mem") as memory:
            memory.add_fact("User lives in Lisbon", user_id="warm")  # the embedder loaded before measuring
            tracemalloc.start()
            start = time.perf_counter()
            report = memory.import_jsonl(path)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            took = time.perf_counter() - start
            history = len(memory.fact_history("u"))
        print(f"{args.facts:,} fact lines ({path.stat().st_size / 1e6:.1f} MB file): {report.facts_imported:,} facts, "
              f"{report.histories_imported:,} histories, {history:,} history entries; "
              f"peak {peak / 1e6:.1f} MB (tracemalloc), {took:.1f} s")


if __name__ == "__main__":
    main()
