"""The merge step of consolidation, read through the facts a user sees afterwards.

Near-duplicates are imported (an import runs no resolution, so both stay), with the access
counts, last accesses and sources a months-old memory would hold; the merge must leave one
fact that carries what the group had.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.embedding import Embedder, embed
from tiered_memory.records import FactChange

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

DAY = 86400.0


def _import_facts(memory: TieredMemory, tmp_path: Path, facts: list[dict[str, Any]]) -> None:
    old = time.time() - 10 * DAY
    lines = [{"format": "tiered-memory/1", "type": "fact", "fact": {
        "user_id": "u", "type": "preference", "metadata": {}, "created_at": old, "updated_at": old,
        "valid_from": old, **f}} for f in facts]
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert memory.import_jsonl(path).facts_imported == len(facts)


def test_a_merged_fact_keeps_the_groups_accesses_and_its_latest_access(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    memory = make_memory()
    recent = time.time() - DAY
    _import_facts(memory, tmp_path, [
        # the keeper (most confident), never read since it was stored
        {"id": "keep", "text": "User enjoys hiking in the mountains", "confidence": 0.9,
         "source_ids": ["m1"], "access_count": 0},
        # its near-duplicate, recalled four times, last yesterday
        {"id": "dup", "text": "User enjoys hiking in the mountains.", "confidence": 0.5,
         "source_ids": ["m2"], "access_count": 4, "last_access": recent},
    ])
    report = memory.consolidate("u")
    assert report.details["merge"] == ["dup"]
    [fact] = memory.facts("u")
    assert fact.id == "keep" and fact.confidence == 0.9
    assert fact.source_ids == ["m1", "m2"]
    assert fact.access_count == 4
    assert fact.last_access == pytest.approx(recent)  # was None: four accesses, and never a last one


def test_a_merge_keeps_the_keepers_own_later_access(make_memory: Callable[..., TieredMemory],
                                                    tmp_path: Path) -> None:
    memory = make_memory()
    earlier, later = time.time() - 5 * DAY, time.time() - DAY
    _import_facts(memory, tmp_path, [
        {"id": "keep", "text": "User enjoys hiking in the mountains", "confidence": 0.9,
         "source_ids": [], "access_count": 2, "last_access": later},
        {"id": "dup", "text": "User enjoys hiking in the mountains.", "confidence": 0.5,
         "source_ids": [], "access_count": 1, "last_access": earlier},
    ])
    memory.consolidate("u")
    [fact] = memory.facts("u")
    assert (fact.access_count, fact.last_access) == (3, pytest.approx(later))


def test_the_keeper_of_a_merge_has_the_merge_in_its_history(make_memory: Callable[..., TieredMemory],
                                                             tmp_path: Path, embedder: Embedder) -> None:
    """Only the duplicates had a history entry ("merge", merged_into): the keeper's own read as if
    nothing had happened to it, though it took their sources and accesses. The duplicate's says
    why it was merged too: its similarity to the keeper (it said only merged_into). The keeper's
    says what it took in and what it was (it named the duplicates only: its sources, accesses and
    update time before the merge were nowhere, so the merge could be neither explained nor undone)."""
    memory = make_memory()
    _import_facts(memory, tmp_path, [
        {"id": "keep", "text": "User enjoys hiking in the mountains", "confidence": 0.9, "source_ids": ["m1"]},
        {"id": "dup", "text": "User enjoys hiking in the mountains.", "confidence": 0.5, "source_ids": ["m2"],
         "access_count": 2, "last_access": time.time() - DAY, "updated_at": time.time() - 2 * DAY},
    ])
    before = memory.facts("u")
    memory.consolidate("u")
    [absorbed] = memory.fact_history("u", "keep")
    was = next(f for f in before if f.id == "keep")
    assert (absorbed.action, absorbed.details) == ("absorb", {"absorbed": ["dup"], "source_ids": ["m2"], "before": {
        "access_count": 0, "last_access": None, "updated_at": pytest.approx(was.updated_at, abs=1e-3)}})
    assert absorbed.old_text == absorbed.new_text == "User enjoys hiking in the mountains"
    [merged] = memory.fact_history("u", "dup")
    keep, dup = embed(embedder, ["User enjoys hiking in the mountains", "User enjoys hiking in the mountains."])
    similarity = float(keep @ dup / np.linalg.norm(keep) / np.linalg.norm(dup))
    assert (merged.action, merged.at) == ("merge", absorbed.at)
    assert merged.details == {"merged_into": "keep", "similarity": pytest.approx(similarity, abs=1e-3)}
    assert merged.details["similarity"] == round(merged.details["similarity"], 3)


def test_a_second_run_finds_no_merge_the_first_one_left(make_memory: Callable[..., TieredMemory],
                                                          tmp_path: Path) -> None:
    """Three facts as equally confident and recalled: the oldest says least, and the fuller one
    took in its copy and that copy's accesses. The first run stopped there; a second one, the
    fuller fact now the most accessed, merged the oldest into it: consolidate was not idempotent.
    One run does both merges now, each in the history, and the next one finds nothing."""
    memory = make_memory()
    _import_facts(memory, tmp_path, [
        {"id": "p", "text": "User is allergic to peanuts", "confidence": 0.8, "access_count": 1},
        {"id": "q", "text": "User is severely allergic to peanuts", "confidence": 0.8, "access_count": 1},
        {"id": "r", "text": "USER IS SEVERELY ALLERGIC TO PEANUTS.", "confidence": 0.8, "access_count": 1}])
    first = memory.consolidate("u")
    assert sorted(first.details["merge"]) == ["p", "r"]
    [fact] = memory.facts("u")
    assert (fact.id, fact.access_count) == ("q", 3)
    merged = {c.fact_id: c.details["merged_into"] for c in memory.fact_history("u") if c.action == "merge"}
    assert merged == {"p": "q", "r": "q"}
    assert memory.consolidate("u").merged == 0


def test_the_merge_step_never_holds_every_pair_of_a_big_users_facts(make_memory: Callable[..., TieredMemory],
                                                                     tmp_path: Path) -> None:
    """A user's facts grow for years: the merge compares each with every other, and held all those
    similarities at once (n x n floats: 10 GB for 50,000 facts). It holds a block of rows at a time
    now: with 3,000 facts, the run's peak stays under half of that matrix (36 MB)."""
    import tracemalloc

    n = 3000
    # the shipped static embedder: the import embeds the 3,000 facts in about a second, where
    # MiniLM took most of the test's time; the matrix is n x n whatever the vectors' width
    memory = make_memory(embedder=StaticEmbedder())
    words = ("tea jazz chess sailing pottery opera garden attic kitchen violin orchids surfing cameras marathon "
             "poetry espresso lisbon oslo kyoto lima cairo quito hanoi dublin tango salsa waltz ballet cello flute "
             "harp drums piano guitar banjo lute oboe tuba kayak canoe yacht ferry train tram bike scooter rover "
             "falcon otter badger heron lynx bison moose panda koala lemur gecko cobra").split()
    rng = random.Random(5)  # facts of few words in common: the merge's pairs, not its text checks
    _import_facts(memory, tmp_path, [
        {"id": f"f{i}", "text": "User noted " + " ".join(rng.sample(words, 6)), "confidence": 0.8}
        for i in range(n)] + [
        {"id": "keep", "text": "User enjoys hiking in the mountains", "confidence": 0.9},
        {"id": "dup", "text": "User enjoys hiking in the mountains.", "confidence": 0.5}])
    tracemalloc.start()
    try:
        report = memory.consolidate("u")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "dup" in report.details["merge"] and "keep" not in report.details["merge"]
    assert peak < n * n * 4 / 2, f"peak {peak / 1e6:.0f} MB"


def test_a_big_merges_absorb_entry_stays_within_what_an_import_takes(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """The keeper's absorb entry named every duplicate: past max_metadata_bytes, the export left the
    keeper itself out ("whose stored values import_jsonl would refuse"), so the fact was lost on a move.
    It names those that fit and counts the rest; each duplicate's own merge entry names the keeper."""
    config = MemoryConfig(max_metadata_bytes=320)  # the entry says what the keeper was too
    memory = make_memory(config=config)
    _import_facts(memory, tmp_path, [
        {"id": "keep", "text": "User enjoys hiking in the mountains", "confidence": 0.9}] + [
        {"id": f"duplicate-{i:020d}", "text": "User enjoys hiking in the mountains" + "." * (i + 1),
         "confidence": 0.5} for i in range(8)])
    assert memory.consolidate("u").merged == 8
    [absorbed] = memory.fact_history("u", "keep")
    shown = absorbed.details["absorbed"]
    assert 0 < len(shown) < 8 and absorbed.details["absorbed_left_out"] == 8 - len(shown)
    memory.export_jsonl(tmp_path / "dump.jsonl")
    again = make_memory("again", config=config)
    assert again.import_jsonl(tmp_path / "dump.jsonl").invalid == []
    assert [f.id for f in again.facts("u")] == ["keep"]
    def by_fact(history: list[FactChange]) -> list[FactChange]:  # a merge's entries share one time
        return sorted(history, key=lambda h: (h.fact_id, h.at, h.action))

    assert by_fact(again.fact_history("u")) == by_fact(memory.fact_history("u"))
