"""The caller's metadata of ``add_fact`` when the fact is already known: a restatement (a no-op)
or a fuller statement (an update) keeps the fact and merges the caller's keys into its metadata,
as ``update_fact`` does, and its history entry says what they were."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import InvalidInputError, MemoryConfig, TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _round_trip(memory: TieredMemory, again: TieredMemory, tmp_path: Path) -> None:
    path = tmp_path / "dump.jsonl"
    memory.export_jsonl(path, user_id="u1")
    assert again.import_jsonl(path).invalid == []
    assert again.fact_history("u1") == memory.fact_history("u1")
    assert again.facts("u1") == memory.facts("u1")


def test_a_restated_fact_takes_the_callers_metadata(make_memory: Callable[..., TieredMemory],
                                                    tmp_path: Path) -> None:
    """add_fact of a fact the user had said ("User lives in Lisbon", from their own turn) with
    {"source": "crm"} returned the known fact without the tag: it was dropped, silently. The
    given keys are merged into the kept fact (given keys win); what add_fact itself writes of a
    new fact ("method": "manual") is not, the kept fact was not added by it."""
    memory = make_memory()
    memory.add("user", "I live in Lisbon.", session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    [said] = memory.facts("u1")
    memory.update_fact(said.id, user_id="u1", metadata={"source": "chat", "seen": 1})
    kept = memory.add_fact("User lives in Lisbon", user_id="u1", metadata={"source": "crm", "tag": "vip"})
    assert kept.id == said.id and kept.text == "User lives in Lisbon"
    assert kept.metadata == {**said.metadata, "source": "crm", "seen": 1, "tag": "vip"}
    assert memory.facts("u1") == [kept]
    entry = memory.fact_history("u1", said.id)[-1]
    assert entry.action == "confirm" and entry.old_text == entry.new_text == "User lives in Lisbon"
    assert entry.details["metadata_keys"] == ["source", "tag"] and entry.details["old_metadata"] == {"source": "chat"}
    _round_trip(memory, make_memory("again"), tmp_path)


def test_a_fuller_statement_takes_the_callers_metadata(make_memory: Callable[..., TieredMemory],
                                                       tmp_path: Path) -> None:
    """add_fact of "User lives in Lisbon, Portugal" updates the known "User lives in Lisbon":
    the text changed, the caller's metadata did not reach the fact."""
    memory = make_memory()
    old = memory.add_fact("User lives in Lisbon", user_id="u1", metadata={"source": "web"})
    new = memory.add_fact("User lives in Lisbon, Portugal", user_id="u1", metadata={"source": "crm", "tag": "vip"})
    assert (new.id, new.text) == (old.id, "User lives in Lisbon, Portugal")
    assert new.metadata == {**old.metadata, "source": "crm", "tag": "vip"}
    update = memory.fact_history("u1", old.id)[-1]
    assert update.action == "update" and update.details["metadata_keys"] == ["source", "tag"]
    assert update.details["old_metadata"] == {"source": "web"} and "more fully" in update.details["reason"]
    _round_trip(memory, make_memory("again"), tmp_path)


@pytest.mark.parametrize("metadata", [None, {}, {"source": "crm"}])
def test_a_restatement_whose_metadata_adds_nothing_writes_nothing(make_memory: Callable[..., TieredMemory],
                                                                   metadata: dict[str, str] | None) -> None:
    memory = make_memory()
    fact = memory.add_fact("User lives in Lisbon", user_id="u1", metadata={"source": "crm"})
    again = memory.add_fact("User lives in Lisbon", user_id="u1", metadata=metadata)
    assert again == fact and memory.facts("u1") == [fact]
    assert [c.action for c in memory.fact_history("u1")] == ["add"]


def test_a_restatement_whose_metadata_would_pass_the_limit_is_refused(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The merge is held to max_metadata_bytes as update_fact's is (what is stored exports and
    imports whole): past it, the typed error, and the fact and its history as they were."""
    memory = make_memory(config=MemoryConfig(max_metadata_bytes=300))
    fact = memory.add_fact("User lives in Lisbon", user_id="u1", metadata={"note": "a" * 150})
    with pytest.raises(InvalidInputError, match="metadata"):
        memory.add_fact("User lives in Lisbon", user_id="u1", metadata={"other": "b" * 150})
    with pytest.raises(InvalidInputError, match="metadata"):
        memory.add_fact("User lives in Lisbon, Portugal", user_id="u1", metadata={"other": "b" * 150})
    assert memory.facts("u1") == [fact]
    assert [c.action for c in memory.fact_history("u1")] == ["add"]


def test_a_fact_said_again_with_more_confidence_takes_it(make_memory: Callable[..., TieredMemory]) -> None:
    """add_fact(text, confidence=1.0) of a fact the rules had found with less kept the lower
    confidence, silently (a no-op with nothing new wrote nothing), though an update takes the
    higher of the two. It takes the higher now, with a confirm entry saying from what; said again
    as sure, or less sure, nothing is written."""
    memory = make_memory()
    memory.add("user", "I live in Lisbon.", session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    [said] = memory.facts("u1")
    assert said.confidence < 1.0
    kept = memory.add_fact("User lives in Lisbon", user_id="u1", confidence=1.0)
    assert (kept.id, kept.confidence, kept.source_ids) == (said.id, 1.0, said.source_ids)
    assert memory.facts("u1") == [kept]
    entry = memory.fact_history("u1", said.id)[-1]
    assert entry.action == "confirm"
    assert (entry.details["confidence"], entry.details["old_confidence"]) == (1.0, said.confidence)
    for confidence in (1.0, 0.3):
        assert memory.add_fact("User lives in Lisbon", user_id="u1", confidence=confidence) == kept
    assert [h.action for h in memory.fact_history("u1", said.id)] == ["add", "confirm"]
