"""A session in which nothing was said: only system or tool messages (an agent's setup, a
scheduled tool run). ``end_session`` ends it as always (its turns are covered, so a second call
and consolidate leave it be, and it returns an episode, as the adapters expect) but the episode
says only :data:`~tiered_memory.layers.extractive.NOTHING_SAID`: it was indexed and recalled
like any other, and showed in the context's "Relevant past sessions" for every query (with few
episodes, the nearest is shown however far). Such an episode is kept and listed by
``episodes()``, but never indexed, searched, shown in a context nor promoted to a fact; no model
is asked about a session that has no conversation to summarise.
"""

from __future__ import annotations

import time
from typing import Callable

from episode_support import fast_llm_config
from tiered_memory import TieredMemory
from tiered_memory.layers.extractive import NOTHING_SAID
from tiered_memory.testing import ScriptedLLM

DAY = 86400.0
SETUP = [{"role": "system", "content": "You are a helpful travel assistant. Answer briefly."},
         {"role": "tool", "content": "weather_lookup returned: Lisbon, 18 degrees, sunny"}]
CHAT = [{"role": "user", "content": "I want to plan a trip to Porto in May with my brother."},
        {"role": "assistant", "content": "Porto in May is lovely. Shall I look at trains?"}]


def _past_sessions(memory: TieredMemory, query: str) -> list[str]:
    context = memory.build_context(query, user_id="u", session_id="now")
    return [i.text for s in context.sections if s.name == "episodes" for i in s.items]


def test_an_episode_of_nothing_said_is_kept_but_never_recalled(memory: TieredMemory) -> None:
    memory.add_many(SETUP, session_id="setup", user_id="u")
    empty = memory.end_session("setup", user_id="u")
    assert empty.summary == NOTHING_SAID
    memory.add_many(CHAT, session_id="trip", user_id="u")
    trip = memory.end_session("trip", user_id="u")
    assert {e.id for e in memory.episodes("u")} == {empty.id, trip.id}  # listed: the session was ended
    assert not any(i.startswith(f"ep:{empty.id}:") for i in memory.index.ids("u"))
    for query in ("trip to Porto", "weather in Lisbon", "summarise the conversation", NOTHING_SAID):
        assert [h.episode.id for h in memory.search_episodes(query, user_id="u", k=10)] == [trip.id]
        assert not any(NOTHING_SAID in t for t in _past_sessions(memory, query))
    assert not any(NOTHING_SAID in t for t in _past_sessions(memory, ""))  # no query: the latest episodes
    assert memory.end_session("setup", user_id="u") == empty  # ended: not summarised again


def test_an_episode_of_nothing_said_is_never_promoted_to_a_fact(memory: TieredMemory) -> None:
    """One an older version indexed may have been recalled often: its summary became a fact."""
    memory.add_many([{**m, "timestamp": time.time() - 2 * DAY} for m in SETUP], session_id="setup", user_id="u")
    empty = memory.end_session("setup", user_id="u")
    with memory._layers.rows.transaction() as db:
        db.execute("UPDATE episodes SET access_count=5 WHERE id=?", (empty.id,))
    report = memory.consolidate("u")
    assert report.promoted == 0 and report.sessions == 0
    assert memory.facts("u") == []


def test_no_model_is_asked_about_a_session_of_nothing_said(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(["unused"] * 4)
    memory = make_memory(llm=llm, config=fast_llm_config())
    memory.add_many(SETUP, session_id="setup", user_id="u")
    ep = memory.end_session("setup", user_id="u")
    assert llm.calls == []
    assert ep.summary == NOTHING_SAID and memory.facts("u") == []
    assert ep.metadata["method"] == "extractive"
