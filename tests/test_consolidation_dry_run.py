"""``consolidate(dry_run=True)``: the report a run would return, and nothing written.

A store where every step has work, and where one step's work changes the next one's: a
stale fact that takes in a recalled duplicate is no longer stale (the merge gives it the
duplicate's accesses), and an idle session older than ``compress_after_days`` becomes an
episode that the same run archives. The dry run's report must be the one the real run that
follows returns, and every row (the audit log too) and every vector must be as before it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import ConsolidationReport, TieredMemory
from tiered_memory.cli import main

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

DAY = 86400.0


def _facts(memory: TieredMemory, tmp_path: Path) -> None:
    def fact(fid: str, text: str, confidence: float, age_days: float, accesses: int = 0) -> dict[str, Any]:
        at = time.time() - age_days * DAY
        return {"format": "tiered-memory/1", "type": "fact", "fact": {
            "id": fid, "user_id": "u", "type": "fact", "text": text, "confidence": confidence, "source_ids": [],
            "metadata": {}, "created_at": at, "updated_at": at, "valid_from": at, "access_count": accesses,
            **({"last_access": at} if accesses else {})}}

    lines = [fact("keep", "User enjoys hiking in the mountains", 0.9, 10),
             fact("dup", "User enjoys hiking in the mountains.", 0.5, 10),
             fact("stale", "User once asked about sailing boats", 0.1, 400),
             # stale too, but its duplicate was recalled: merged, it has accesses and stays
             fact("kept-stale", "User once asked about origami cranes", 0.1, 400),
             fact("recalled", "USER ONCE ASKED ABOUT ORIGAMI CRANES.", 0.05, 400, accesses=2)]
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert memory.import_jsonl(path).facts_imported == len(lines)


def _store(memory: TieredMemory, tmp_path: Path) -> None:
    _facts(memory, tmp_path)
    for s in range(2):  # old sessions, ended and recalled often: promoted and archived
        memory.add("user", f"I booked flight LX-{100 + s} to Zurich for conference {s}.", session_id=f"old{s}",
                   user_id="u", timestamp=time.time() - 60 * DAY + s)
        memory.end_session(f"old{s}", user_id="u")
    for _ in range(3):
        memory.search_episodes("flight to Zurich conference", user_id="u", k=5)
    memory.add("user", "My cat Miso likes the window seat.", session_id="idle", user_id="u",
               timestamp=time.time() - 2 * DAY)  # idle: the sessions step ends it
    memory.add("user", "The garage door code changed to 4471.", session_id="ancient", user_id="u",
               timestamp=time.time() - 90 * DAY)  # idle and old: ended and archived in the same run
    memory.facts("u")  # the accesses noted by the searches are written (a dry run reads them)


def _rows(memory: TieredMemory) -> dict[str, list[str]]:
    rows = memory._layers.rows
    if rows.dialect == "sqlite":
        tables = [r[0] for r in rows.query("SELECT name FROM sqlite_master WHERE type='table'")]
    else:
        tables = [r[0] for r in rows.query("SELECT table_name FROM information_schema.tables"
                                           " WHERE table_schema = current_schema()")]
    return {t: sorted(repr(r) for r in rows.query(f'SELECT * FROM "{t}"')) for t in tables}


def _comparable(report: ConsolidationReport, made: dict[str, str]) -> ConsolidationReport:
    """``report`` with each episode the run made named by its session, as a dry run names it."""
    return ConsolidationReport(**{**report.__dict__, "details": {
        step: sorted(made.get(i, i) for i in ids) for step, ids in report.details.items()}})


def test_a_dry_run_reports_what_the_run_does_and_writes_nothing(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    memory = make_memory()
    _store(memory, tmp_path)
    before, vectors = _rows(memory), memory.index.ids("u")
    seen: list[tuple[str, int, int]] = []
    dry = memory.consolidate("u", progress=lambda *tick: seen.append(tick), dry_run=True)
    assert _rows(memory) == before and memory.index.ids("u") == vectors  # nothing written, nothing deleted
    assert asyncio.run(memory.aconsolidate("u", dry_run=True)) == dry  # the twin
    assert _rows(memory) == before
    old = {e.id for e in memory.episodes("u")}
    real = memory.consolidate("u")
    made = {e.id: e.session_id for e in memory.episodes("u") if e.id not in old}
    assert set(made.values()) == {"idle", "ancient"}
    # every step had work, and the merge's effect on the prune was foreseen
    assert (real.sessions, real.merged, real.promoted, real.compressed, real.pruned) == (2, 2, 2, 3, 1)
    assert real.details["prune"] == ["stale"]
    assert _comparable(dry, {}) == _comparable(real, made)
    assert {s for s, *_ in seen} == {"sessions", "merge", "promote", "compress", "prune"}
    again = memory.consolidate("u", dry_run=True)  # what is left: nothing
    assert (again.sessions, again.merged, again.promoted, again.compressed, again.pruned) == (0, 0, 0, 0, 0)


def test_the_cli_dry_run_prints_the_report_and_writes_nothing(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    memory = make_memory()
    _facts(memory, tmp_path)
    if memory._layers.rows.dialect != "sqlite":
        pytest.skip("the CLI opens the folder's own store")
    before = _rows(memory)
    memory.close()
    assert main(["--path", str(tmp_path / "mem"), "consolidate", "--user", "u", "--dry-run", "--json",
                 "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["dry_run"] is True and printed["merged"] == 2 and printed["pruned"] == 1
    again = make_memory("mem")
    assert _rows(again) == before


@pytest.mark.record_stores("sqlite")
def test_a_dry_run_foresees_the_promotion_of_an_episode_the_same_run_makes(
        make_memory: Callable[..., TieredMemory]) -> None:
    """With ``promote_access_count=0`` every episode is promoted, those the sessions step makes in
    the same run too; the dry run promoted only the episodes already stored (0 where the run
    promoted 1). An episode of a session where nothing was said is never promoted, in either."""
    from tiered_memory import MemoryConfig, StaticEmbedder
    from tiered_memory.config import ConsolidationConfig

    memory = make_memory(config=MemoryConfig(consolidation=ConsolidationConfig(promote_access_count=0)),
                         embedder=StaticEmbedder())  # fast: the embedder is not the point
    memory.add("user", "I booked flight LX-100 to Zurich.", session_id="idle", user_id="u",
               timestamp=time.time() - 2 * DAY)
    memory.add("system", "You are a helpful assistant.", session_id="setup", user_id="u",
               timestamp=time.time() - 2 * DAY)
    dry = memory.consolidate("u", dry_run=True)
    real = memory.consolidate("u")
    made = {e.id: e.session_id for e in memory.episodes("u")}
    assert real.promoted == 1 and [made[i] for i in real.details["promote"]] == ["idle"]
    assert _comparable(dry, {}) == _comparable(real, made)
