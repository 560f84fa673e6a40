"""Whose words the LLM-free rules read (end_session on a real SQLite store, no LLM): an app's
system prompt stored as a turn is its instructions to its model, not what was said in the
session, and a tool's output is data a call returned, never what the user said."""

from __future__ import annotations

from typing import Any, Callable

from episode_support import fast_llm_config
from tiered_memory import TieredMemory
from tiered_memory.records import Episode
from tiered_memory.testing import ScriptedLLM

SYSTEM = ("You are Ava, a travel assistant. My name is Ava. Always answer in French. "
          "We decided to keep every answer short. Never reveal booking ACME-77 before 2026-03-01.")
TOOL = ("Forecast for Lisbon on 2026-03-10: sunny. Reservation HOTEL-991 held at Alfama Suites. "
        "My name is Bob and I live in Paris. We decided to cancel the order.")
CHAT = [
    {"role": "user", "content": "I want to plan a trip to Lisbon in March with my sister Marta."},
    {"role": "assistant", "content": "Lisbon in March is lovely. How many days will the trip take?"},
    {"role": "user", "content": "Five days in Lisbon, and I love grilled sardines."},
    {"role": "assistant", "content": "Then the trip to Lisbon can end at the Time Out Market for sardines."},
]


def _quoted(ep: Episode) -> list[str]:
    """Every sentence an episode quotes (what "Relevant past sessions" shows and recall indexes)."""
    return [ep.summary, *ep.decisions, *ep.key_facts, *ep.open_questions]


def _ended(memory: TieredMemory, rows: list[dict[str, Any]]) -> Episode:
    memory.add_many(rows, session_id="s", user_id="u")
    return memory.end_session("s", user_id="u")


def test_a_system_prompt_is_not_summarised_as_what_was_said(memory: TieredMemory) -> None:
    ep = _ended(memory, [{"role": "system", "content": SYSTEM}, *CHAT])
    assert ep.metadata["method"] == "extractive"
    for words in ("Ava", "French", "keep every answer short", "ACME-77", "2026-03-01"):
        assert not any(words in q for q in _quoted(ep)), (words, _quoted(ep))
        assert words not in ep.entities, ep.entities
    assert "Lisbon" in ep.summary and "Lisbon" in ep.entities and "Marta" in ep.entities  # the chat is
    assert ep.decisions == []
    ctx = memory.build_context("trip to Lisbon", user_id="u", session_id="next", max_tokens=4000)
    past = " ".join(i.text for i in ctx.section("episodes").items)
    assert "Lisbon" in past and "French" not in past and "Ava" not in past


def test_a_system_prompts_first_person_is_no_fact_about_the_user(memory: TieredMemory) -> None:
    _ended(memory, [{"role": "system", "content": SYSTEM}, *CHAT])
    texts = [f.text for f in memory.facts("u")]
    assert "User likes grilled sardines" in texts and "User's sister is Marta" in texts
    assert not any("Ava" in t for t in texts), texts


def test_a_tools_output_is_data_never_what_was_said(memory: TieredMemory) -> None:
    ep = _ended(memory, [*CHAT[:2], {"role": "tool", "content": TOOL}, *CHAT[2:]])
    for words in ("Forecast", "HOTEL-991 held", "Bob", "cancel the order"):
        assert not any(words in q for q in _quoted(ep)), (words, _quoted(ep))
    assert ep.decisions == []
    assert not any("Bob" in f.text or "Paris" in f.text for f in memory.facts("u"))
    # the names and ids it returned are the session's data: listed, after the conversation's own
    assert "HOTEL-991" in ep.entities and "Alfama Suites" in ep.entities
    assert ep.entities.index("Marta") < ep.entities.index("Alfama Suites")


def test_the_users_own_words_are_still_read(memory: TieredMemory) -> None:
    ep = _ended(memory, [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "My name is Ava. We decided to fly on 2026-03-02."}])
    assert "User's name is Ava" in [f.text for f in memory.facts("u")]
    assert ep.decisions == ["We decided to fly on 2026-03-02."]
    assert "Always answer in French" not in ep.summary


def test_a_session_of_only_a_system_prompt_quotes_nothing_of_it(memory: TieredMemory) -> None:
    ep = _ended(memory, [{"role": "system", "content": SYSTEM}])
    assert ep.summary.strip() and not any(w in ep.summary for w in ("Ava", "French", "ACME-77"))
    assert ep.entities == ep.decisions == ep.key_facts == ep.open_questions == []
    assert memory.facts("u") == []
    assert memory.end_session("s", user_id="u") == ep  # its turns are covered: not read again


def test_the_fallback_of_a_failing_model_reads_the_same_turns(make_memory: Callable[..., TieredMemory]) -> None:
    broken = ["not json"] * 2  # the model's answer, and its retry's, unusable: the rules step in
    memory = make_memory(llm=ScriptedLLM(by_task={"facts": list(broken), "episode": list(broken)}),
                         config=fast_llm_config())
    ep = _ended(memory, [{"role": "system", "content": SYSTEM}, *CHAT])
    assert ep.metadata["method"] == "extractive" and ep.metadata["reason"] == "llm failed"
    assert "Lisbon" in ep.summary and not any("Ava" in q or "French" in q for q in _quoted(ep)), _quoted(ep)
    assert not any("Ava" in f.text for f in memory.facts("u"))
