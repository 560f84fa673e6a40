"""The merge step against another writer between its plan and its write, and during it.

A merge reads the group it planned, then writes (the keeper absorbs, the duplicates are
soft-deleted). Another process's delete or edit of the keeper that commits between the
two made the duplicates go into a fact that was gone or no longer said what they said:
their content vanished from recall. The check that the group is as planned is part of the
merge's write transaction now. The other writer is forced in deterministically, just before
that transaction begins, through the public API (on PostgreSQL a separate process's commit
looks the same to the merge; on SQLite the folder lock keeps other processes out, so another
writer there is a raw transaction, checked too).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from hook_support import before_first_write
from tiered_memory import TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

DAY = 86400.0
KEEP = "User enjoys hiking in the mountains"
DUP = "User enjoys hiking in the mountains."


def _import_facts(memory: TieredMemory, tmp_path: Path) -> None:
    old = time.time() - 10 * DAY
    lines = [{"format": "tiered-memory/1", "type": "fact", "fact": {
        "id": fid, "user_id": "u", "type": "preference", "text": text, "confidence": confidence,
        "source_ids": [f"m-{fid}"], "metadata": {}, "created_at": old, "updated_at": old, "valid_from": old}}
        for fid, text, confidence in [("keep", KEEP, 0.9), ("dup", DUP, 0.5)]]
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert memory.import_jsonl(path).facts_imported == 2


def test_a_keeper_deleted_between_the_plan_and_the_write_takes_no_duplicates(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    _import_facts(memory, tmp_path)
    fired = before_first_write(memory, monkeypatch, lambda: memory.delete_fact("keep", user_id="u"))
    report = memory.consolidate("u")
    assert fired
    # the duplicate was soft-deleted into the deleted keeper: the user had no fact of hiking left
    assert [f.text for f in memory.facts("u")] == [DUP]
    assert report.merged == 0 and report.details["merge"] == []
    assert [h.action for h in memory.fact_history("u", "dup")] == []
    assert memory.search_facts("hiking in the mountains", user_id="u", k=3)[0].fact.id == "dup"
    again = memory.consolidate("u")  # nothing left to merge it with: the next run leaves it too
    assert again.merged == 0 and [f.id for f in memory.facts("u")] == ["dup"]


def test_a_keeper_edited_between_the_plan_and_the_write_takes_no_duplicates(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    _import_facts(memory, tmp_path)
    fired = before_first_write(memory, monkeypatch,
                                lambda: memory.update_fact("keep", user_id="u", text="User enjoys sailing on lakes"))
    report = memory.consolidate("u")
    assert fired
    assert sorted(f.text for f in memory.facts("u")) == [DUP, "User enjoys sailing on lakes"]
    assert report.merged == 0


def test_a_keeper_deleted_by_a_raw_transaction_takes_no_duplicates(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer of the rows (no lock of this process held): its delete commits just before
    the merge's write."""
    memory = make_memory()
    _import_facts(memory, tmp_path)

    def delete() -> None:
        with memory._layers.rows.transaction() as db:
            db.execute("DELETE FROM facts WHERE user_id=? AND id=?", ("u", "keep"))

    before_first_write(memory, monkeypatch, delete)
    assert memory.consolidate("u").merged == 0
    assert [f.id for f in memory.facts("u")] == ["dup"]


def test_another_writers_edit_waits_for_the_merge_that_holds_the_group(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the merge's transaction, after it read the group: PostgreSQL's READ COMMITTED let
    another process's edit of the keeper commit there, and the merge then wrote into the edited
    fact. The group's rows are locked as read (FOR UPDATE): the edit waits for the merge's commit,
    so it edits the merged fact (one order of the two, as if they had not overlapped)."""
    memory = make_memory()
    rows = memory._layers.rows
    if rows.dialect != "postgres":
        pytest.skip("SQLite's write transaction (BEGIN IMMEDIATE) excludes every other writer")
    _import_facts(memory, tmp_path)
    real = rows.unit
    edited = threading.Event()
    waited: list[bool] = []

    def edit() -> None:
        with rows.transaction() as db:
            db.execute("UPDATE facts SET text=? WHERE user_id=? AND id=?", ("User enjoys sailing on lakes", "u", "keep"))
        edited.set()

    other = threading.Thread(target=edit)

    @contextlib.contextmanager
    def unit() -> Iterator[Any]:
        with real() as u:
            held = u.held_facts

            def holding(user_id: str, ids: Any) -> Any:
                found = held(user_id, ids)
                if not waited:  # the first group read: another writer edits its keeper now
                    other.start()
                    waited.append(not edited.wait(2.0))
                return found

            monkeypatch.setattr(u, "held_facts", holding)
            yield u

    monkeypatch.setattr(rows, "unit", unit)
    report = memory.consolidate("u")
    other.join(30)
    assert waited == [True]  # the edit committed inside the merge's transaction
    assert report.details["merge"] == ["dup"]
    [absorbed] = [h for h in memory.fact_history("u", "keep") if h.action == "absorb"]
    assert absorbed.old_text == KEEP  # merged into the fact as it was, the edit after it
    assert [f.text for f in memory.facts("u")] == ["User enjoys sailing on lakes"]
