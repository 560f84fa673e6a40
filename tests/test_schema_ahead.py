"""A store that a later version of tiered-memory migrated further still opens, so the older
workers of a rolling upgrade keep running beside the upgraded ones, and each open logs a
warning naming the store's schema version and this code's (the README's Troubleshooting)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import Embedder, TieredMemory
from tiered_memory.readonly import ReadOnlyMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def migrated_further(memory: TieredMemory) -> int:
    """Record one more ``core`` migration than this code knows, as a later version's extra step
    would (a no-op here); returns the version this code knows."""
    known = memory.store.schema_version("core")  # type: ignore[attr-defined]
    steps = ["SELECT 1"] * known  # (recorded already: only the one past them runs)
    memory.store.migrate("core", [*steps, "SELECT 1"])  # type: ignore[attr-defined]
    assert memory.store.schema_version("core") == known + 1  # type: ignore[attr-defined]
    return int(known)


def ahead(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "later version of tiered-memory" in r.getMessage()]


def test_a_store_of_a_later_schema_opens_and_warns_naming_both_versions(
        make_memory: Callable[..., TieredMemory], caplog: pytest.LogCaptureFixture) -> None:
    m = make_memory("m")
    m.add("user", "I moved to Lisbon last spring", session_id="s", user_id="u")
    known = migrated_further(m)
    m.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        again = make_memory("m")
    assert "Lisbon" in again.search("where do I live?", user_id="u", k=1)[0].text  # it opened, and reads
    said = ahead(caplog)
    assert len(said) == 1, said
    assert f"'core' at version {known + 1}" in said[0] and f"knows version {known}" in said[0]


def test_a_read_only_open_of_a_later_schema_warns_too(tmp_path: Path, embedder: Embedder,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with TieredMemory(tmp_path / "m", embedder=embedder) as m:
        m.add("user", "I moved to Lisbon last spring", session_id="s", user_id="u")
        known = migrated_further(m)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tiered_memory"), ReadOnlyMemory(tmp_path / "m") as ro:
        assert ro.stats().messages == 1
    said = ahead(caplog)
    assert len(said) == 1 and f"'core' at version {known + 1}" in said[0], said
