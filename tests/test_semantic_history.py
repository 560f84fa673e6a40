"""What a fact's history says of an edit: the old and new value of each thing that changed,
read back from ``fact_history`` and through an export and import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.layers.changes import bounded_details, edit_details
from tiered_memory.records import Fact
from tiered_memory.testing import ScriptedLLM

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _round_trip(memory: TieredMemory, again: TieredMemory, tmp_path: Path) -> None:
    path = tmp_path / "dump.jsonl"
    memory.export_jsonl(path, user_id="u1")
    report = again.import_jsonl(path)
    assert (report.invalid, report.facts_imported) == ([], 1)
    assert again.fact_history("u1") == memory.fact_history("u1")


def test_an_edit_entry_says_what_changed_from_what(make_memory: Callable[..., TieredMemory],
                                                   tmp_path: Path) -> None:
    """It held only the new type and confidence (None and None for a metadata edit): the old
    confidence, the old type and what the metadata was could not be read back."""
    memory = make_memory()
    fact = memory.add_fact("User drinks green tea", user_id="u1", confidence=0.6,
                           metadata={"origin": "settings page", "kept": 1})
    memory.update_fact(fact.id, user_id="u1", type="preference", confidence=0.9)
    memory.update_fact(fact.id, user_id="u1", metadata={"origin": "import", "kept": 1, "tag": ["tea"]})
    memory.update_fact(fact.id, user_id="u1", text="User drinks black tea")
    retyped, remeta, retext = memory.fact_history("u1", fact.id)[1:]
    assert (retyped.action, retyped.details) == ("edit", {
        "type": "preference", "confidence": 0.9, "old_type": "fact", "old_confidence": 0.6})
    # "kept" was given as it was: not a change; "tag" is new (in metadata_keys, not old_metadata)
    assert (remeta.action, remeta.details) == ("edit", {
        "type": None, "confidence": None, "metadata_keys": ["origin", "tag"],
        "old_metadata": {"origin": "settings page"}})
    assert (retext.old_text, retext.new_text, retext.details) == (
        "User drinks green tea", "User drinks black tea", {"type": None, "confidence": None})
    _round_trip(memory, make_memory("again"), tmp_path)


def test_an_edit_entry_stays_within_what_an_import_takes(make_memory: Callable[..., TieredMemory],
                                                         tmp_path: Path) -> None:
    """The old values of a fact's metadata near the limit, beside the rest of the entry, would be
    past it: the entry names the keys and says the old values were left out, and exports whole."""
    config = MemoryConfig(max_metadata_bytes=2000)
    memory = make_memory(config=config)
    fact = memory.add_fact("User drinks green tea", user_id="u1", metadata={"note": "a" * 1900})
    memory.update_fact(fact.id, user_id="u1", confidence=0.5, metadata={"note": "b" * 1900})
    edit = memory.fact_history("u1", fact.id)[-1]
    assert edit.details == {"type": None, "confidence": 0.5, "old_confidence": 1.0,
                            "metadata_keys": ["note"], "old_metadata_left_out": True}
    _round_trip(memory, make_memory("again", config=config), tmp_path)


def test_edit_details_give_up_old_values_then_key_names_to_stay_within_the_limit() -> None:
    old = Fact(id="f", user_id="u", type="fact", text="t", confidence=1.0, metadata={"k1": "x" * 50})
    meta = {"k1": "y", **{f"k{i}": i for i in range(2, 30)}}

    def at(limit: int) -> dict[str, object]:
        return edit_details(old, type="fact", confidence=1.0, metadata=meta, max_bytes=limit)

    keys = sorted(meta)
    assert at(10_000) == {"type": None, "confidence": None, "metadata_keys": keys, "old_metadata": {"k1": "x" * 50}}
    assert at(300) == {"type": None, "confidence": None, "metadata_keys": keys, "old_metadata_left_out": True}
    assert at(100) == {"type": None, "confidence": None, "metadata_keys_changed": 29}
    assert at(50) == {"type": None, "confidence": None}  # under what any entry takes: nothing more
    assert old.metadata == {"k1": "x" * 50}  # the fact as it was


def test_a_models_fact_of_a_long_session_keeps_its_add_entry_within_the_limit(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A model's fact that cites every turn of a long session (60): its add entry named them all,
    2,224 bytes past a limit of 1,000, and the export left the live fact out. The entry names those
    that fit and counts the rest; the fact itself keeps them all."""
    config = MemoryConfig(max_metadata_bytes=1000)
    episode = {"summary": "Walks.", "entities": [], "decisions": [], "open_questions": [], "key_facts": []}
    llm = ScriptedLLM(by_task={"facts": [{"facts": [{"type": "fact", "text": "User likes long walks",
                                                     "sources": list(range(1, 61))}]}],
                               "episode": [episode]})
    memory = make_memory(config=config, llm=llm)
    memory.add_many([{"role": "user", "content": f"walk {i}"} for i in range(60)], session_id="s", user_id="u1")
    memory.end_session("s", user_id="u1")
    [fact] = memory.facts("u1")
    [added] = memory.fact_history("u1", fact.id)
    shown = added.details["source_ids"]
    assert 0 < len(shown) < 60 and added.details["source_ids_left_out"] == 60 - len(shown)
    assert shown == fact.source_ids[:len(shown)] and len(fact.source_ids) == 60
    _round_trip(memory, make_memory("again", config=config), tmp_path)


def test_bounded_details_keep_the_first_items_of_each_list_that_fit_and_count_the_rest() -> None:
    ids = [f"id{i:02d}" for i in range(20)]
    details = {"reason": "r", "source_ids": ids, "more": [1, 2, 3]}

    def at(limit: int, given: dict[str, object] = details) -> dict[str, object]:
        out = bounded_details(given, limit)
        assert len(json.dumps(out)) <= limit or all(out[k] == [] for k in given if isinstance(given[k], list))
        return out

    assert at(10_000) == details  # within the limit: as given
    # one more id would be past 150; the room left takes one of the next list's items
    assert at(150) == {"reason": "r", "source_ids": ids[:7], "more": [1], "source_ids_left_out": 13,
                       "more_left_out": 2}
    assert at(150, {"absorbed": ["x"], "source_ids": ids}) == {  # a list that fits is whole
        "absorbed": ["x"], "source_ids": ids[:10], "source_ids_left_out": 10}
    assert at(20) == {"reason": "r", "source_ids": [], "more": [], "source_ids_left_out": 20,
                      "more_left_out": 3}  # under what any entry takes: the rest alone
    assert bounded_details({"reason": "x" * 50}, 20) == {"reason": "x" * 50}  # no list to shorten
    assert details["source_ids"] == ids and len(ids) == 20  # the caller's details as they were
