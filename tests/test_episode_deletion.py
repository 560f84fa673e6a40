"""Deleting an episode releases the turns it covered: ``end_session`` summarises them again,
with whatever LLM is configured then (a fallback episode can be upgraded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from episode_support import CONVO, GOOD_EPISODE, NO_FACTS
from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.config import ConsolidationConfig
from tiered_memory.testing import ScriptedLLM

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def test_a_fallback_episode_deleted_is_summarised_again_by_the_model_configured_since(
        make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory()  # no LLM: the rules make the episode
    ids = memory.add_many(CONVO, session_id="s1", user_id="u")
    rules = memory.end_session("s1", user_id="u")
    assert rules.metadata["method"] == "extractive"
    memory.llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [GOOD_EPISODE]})
    assert memory.end_session("s1", user_id="u") == rules  # all covered: the episode, no call, no error
    assert memory.llm.calls == []
    memory.delete_episode(rules.id, user_id="u")
    better = memory.end_session("s1", user_id="u")
    assert better.metadata == {"method": "llm"} and better.summary == GOOD_EPISODE["summary"]
    assert better.source_ids == ids
    assert [e.id for e in memory.episodes("u")] == [better.id]
    assert memory.end_session("s1", user_id="u") == better  # once: the turns are covered again


def test_the_sessions_episodes_deleted_in_any_order_release_all_their_turns(
        make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory()
    first_ids = memory.add_many(CONVO, session_id="s1", user_id="u")
    first = memory.end_session("s1", user_id="u")
    later_ids = memory.add_many([{"role": "user", "content": "Also add monitoring with Grafana."}],
                                session_id="s1", user_id="u")
    later = memory.end_session("s1", user_id="u")
    # the older one first: the newer one still covers the session up to its own turns
    memory.delete_episode(first.id, user_id="u")
    assert memory.end_session("s1", user_id="u") == later
    memory.delete_episode(later.id, user_id="u")
    again = memory.end_session("s1", user_id="u")
    assert again.source_ids == first_ids + later_ids
    # the newest alone: only its turns are summarised again
    newest_ids = memory.add_many([{"role": "user", "content": "The dashboards go to the ops team."}],
                                 session_id="s1", user_id="u")
    newest = memory.end_session("s1", user_id="u")
    memory.delete_episode(newest.id, user_id="u")
    assert memory.end_session("s1", user_id="u").source_ids == newest_ids
    assert [e.source_ids for e in memory.episodes("u", session_id="s1")] == [first_ids + later_ids, newest_ids]


def test_a_deleted_episode_releases_only_its_own_users_session(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(config=MemoryConfig(consolidation=ConsolidationConfig(session_idle_hours=0.0)))
    for user in ("u", "v"):
        for session in ("s1", "s2"):
            memory.add_many(CONVO, session_id=session, user_id=user)
            memory.end_session(session, user_id=user)
    [target, _] = memory.episodes("u")
    memory.delete_episode(target.id, user_id="u")
    [kept] = [e for e in memory.episodes("u") if e.id != target.id]
    again = memory.consolidate("u").details["sessions"]  # the released session, idle, is summarised again
    [redone] = [e for e in memory.episodes("u") if e.id != kept.id]
    assert again == [redone.id] and redone.session_id == target.session_id
    assert redone.source_ids == target.source_ids
    held = memory.episodes("v")
    assert memory.consolidate("v").details["sessions"] == [] and memory.episodes("v") == held


def test_turns_a_cursor_covers_without_an_episode_are_summarised(make_memory: Callable[..., TieredMemory],
                                                                 tmp_path: Path) -> None:
    """An export of a store from before deletes released turns: its cursor covers turns whose
    episode is gone. end_session summarises them instead of refusing."""
    old = make_memory("old")
    ids = old.add_many(CONVO, session_id="s1", user_id="u")
    old.end_session("s1", user_id="u")
    dump = tmp_path / "old.jsonl"
    old.export_jsonl(dump)
    kept = [line for line in dump.read_text().splitlines() if json.loads(line)["type"] != "episode"]
    assert any(json.loads(line)["type"] == "cursor" for line in kept)
    dump.write_text("\n".join(kept) + "\n")
    new = make_memory("new")
    assert new.import_jsonl(dump).cursors_imported == 1
    assert new.episodes("u") == []
    assert new.end_session("s1", user_id="u").source_ids == ids
