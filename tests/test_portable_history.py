"""The order of the fact history through an export and an import: ``fact_history`` reads the
same, entry for entry, in a fresh store, entries of the same time across facts included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _moved(memory: TieredMemory, tmp_path: Path, again: TieredMemory) -> None:
    path = tmp_path / "dump.jsonl"
    memory.export_jsonl(path, user_id="u")
    assert again.import_jsonl(path).invalid == []
    assert again.fact_history("u") == memory.fact_history("u")
    for fact in memory.facts("u", include_invalid=True):
        assert again.fact_history("u", fact.id) == memory.fact_history("u", fact.id)


def test_entries_of_the_same_time_keep_their_order_through_an_import(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An edit that moves a fact into a slot writes its edit entry, then the slot's old fact's
    invalidate entry, at the same time. The export groups history by fact (the older fact's
    first) and the import wrote all of it by time, stable: the invalidate came back before the
    edit that caused it."""
    memory = make_memory()
    lisbon = memory.add_fact("User lives in Lisbon", user_id="u")
    tea = memory.add_fact("User likes tea", user_id="u")
    memory.update_fact(tea.id, text="User lives in Paris", user_id="u")
    assert [(c.fact_id, c.action) for c in memory.fact_history("u")] == [
        (lisbon.id, "add"), (tea.id, "add"), (tea.id, "edit"), (lisbon.id, "invalidate")]
    _moved(memory, tmp_path, make_memory("again"))


def test_a_history_written_out_of_time_order_keeps_its_order_through_an_import(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """The history reads in the order it was written, which is not always by time: here an
    older history imported after the store's own (old chats, another dump). The import wrote
    every entry by time, so in a fresh store the imported fact's entries came first."""
    old = make_memory("old")
    fact = old.add_fact("User likes tea", user_id="u")
    path = tmp_path / "old.jsonl"
    old.export_jsonl(path, user_id="u")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        for change in line.get("history", []):
            change["at"] = 1_000_000_000.0
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    memory = make_memory()
    newer = memory.add_fact("User lives in Lisbon", user_id="u")
    assert memory.import_jsonl(path).facts_imported == 1
    assert [c.fact_id for c in memory.fact_history("u")] == [newer.id, fact.id]
    _moved(memory, tmp_path, make_memory("again"))
