"""Hooks into a real memory for tests: a writer forced in just before the layers' next write
transaction (the races of a read before it), the commits a call makes (reads that must not write),
and the SQL reads of the items table a call makes on SQLite (reads that must be bounded)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import pytest

from tiered_memory import TieredMemory


def before_first_write(memory: TieredMemory, monkeypatch: pytest.MonkeyPatch,
                       meanwhile: Callable[[], None]) -> list[bool]:
    """Run ``meanwhile`` once, just before the next write transaction of the memory's layers (its
    own writes open units too: they pass through); the list returned holds ``True`` once it ran."""
    rows = memory._layers.rows
    real = rows.unit
    fired: list[bool] = []

    @contextlib.contextmanager
    def unit() -> Iterator[Any]:
        if not fired:
            fired.append(True)
            meanwhile()
        with real() as u:
            yield u

    monkeypatch.setattr(rows, "unit", unit)
    return fired


def commits_during(memory: TieredMemory, call: Callable[[], Any]) -> int:
    """The transactions SQLite committed on the memory's connection while ``call()`` ran in this thread."""
    seen: list[str] = []

    def trace(sql: str) -> None:
        if threading.current_thread() is threading.main_thread() and sql.strip().upper().startswith("COMMIT"):
            seen.append(sql)

    memory.store.conn.set_trace_callback(trace)  # type: ignore[attr-defined]
    try:
        call()
    finally:
        memory.store.conn.set_trace_callback(None)  # type: ignore[attr-defined]
    return len(seen)


def item_reads(memory: TieredMemory, run: Callable[[], Any]) -> list[str]:
    """The statements reading the ``items`` table that ``run()`` sends to the memory's SQLite
    connection, as sqlite3's trace callback sees them (with their parameters filled in)."""
    seen: list[str] = []
    memory.store.conn.set_trace_callback(seen.append)  # type: ignore[attr-defined]
    try:
        run()
    finally:
        memory.store.conn.set_trace_callback(None)  # type: ignore[attr-defined]
    return [s for s in seen if "FROM items" in s]
