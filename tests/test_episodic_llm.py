"""Episodes made by a (scripted) model: the prompt it reads, its failures and the fallback to
the rules, strict mode, and the bounds on what it returns and on how much of a session one
prompt shows."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest

from episode_support import CONVO, GOOD_EPISODE, NO_FACTS, fast_llm_config, stored
from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.errors import LLMError, LLMOutputError
from tiered_memory.layers.episodic import transcript, transcript_spans
from tiered_memory.layers.extractive import MAX_SENTENCE_CHARS, clip
from tiered_memory.quoting import quote
from tiered_memory.testing import ScriptedLLM, chatty, empty, fenced, malformed, task_of, timeout

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def test_end_session_with_llm(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [fenced(GOOD_EPISODE)]})
    memory = make_memory(llm=llm)
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    ep = memory.end_session("s1", user_id="u1")
    assert ep.metadata == {"method": "llm"}
    assert ep.summary == GOOD_EPISODE["summary"] and ep.decisions == GOOD_EPISODE["decisions"]
    assert llm.tasks() == ["facts", "episode"]
    prompt = llm.calls[1].messages[1]["content"]
    assert "BILL-42" in prompt and '"' in prompt  # the conversation is quoted


@pytest.mark.parametrize("script, error", [
    ([malformed(), malformed()], "LLMOutputError"),
    ([empty(), empty()], "LLMOutputError"),
    ([{"summary": 3, "entities": "x"}, {"summary": ""}], "LLMOutputError"),  # wrong types
    ([timeout()], "LLMError"),
    ([RuntimeError("provider exploded")], "LLMError"),
    (['{"summary": ' + "[" * 5_000] * 2, "LLMOutputError"),  # nested past the recursion limit
    ([{"summary": "\x1e\x1f"}] * 2, "LLMOutputError"),  # blank to str.strip, not to pydantic's \S
])
def test_llm_failure_falls_back_and_keeps_turns(make_memory: Callable[..., TieredMemory],
                                                script: list[Any], error: str) -> None:
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": script})
    memory = make_memory(llm=llm, config=fast_llm_config())
    ids = memory.add_many(CONVO, session_id="s1", user_id="u1")
    ep = memory.end_session("s1", user_id="u1")
    assert ep.metadata["method"] == "extractive"
    assert ep.metadata["llm_error"].startswith(error + ":")
    assert ep.source_ids == ids
    assert [m.id for m in memory.get_messages("s1", user_id="u1")] == ids


def test_llm_recovers_on_retry(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [malformed(), chatty(GOOD_EPISODE)]})
    memory = make_memory(llm=llm)
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    assert memory.end_session("s1", user_id="u1").metadata == {"method": "llm"}
    assert llm.tasks() == ["facts", "episode", "episode"]


@pytest.mark.parametrize("script, exc", [([malformed(), malformed()], LLMOutputError), ([timeout()], LLMError),
                                         (['{"entities": ' + "[" * 5_000] * 2, LLMOutputError)])
def test_strict_mode_raises_typed_errors(make_memory: Callable[..., TieredMemory], script: list[Any],
                                         exc: type[Exception]) -> None:
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": script})
    memory = make_memory(llm=llm, config=fast_llm_config(strict=True))
    ids = memory.add_many(CONVO, session_id="s1", user_id="u1")
    with pytest.raises(exc):
        memory.end_session("s1", user_id="u1")
    assert memory.episodes("u1") == []
    assert [m.id for m in memory.get_messages("s1", user_id="u1")] == ids
    # a later run with a working model compresses the same turns
    memory.llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [GOOD_EPISODE]})
    assert memory.end_session("s1", user_id="u1").source_ids == ids


def test_strict_failure_of_the_episode_writes_no_fact(make_memory: Callable[..., TieredMemory]) -> None:
    """Under strict mode, a failed episode call leaves nothing behind: the facts the same
    end_session extracted are not stored without their episode, and a retry stores them once."""
    facts = {"facts": [{"type": "preference", "text": "User prefers Postgres for billing", "sources": [1]}]}
    llm = ScriptedLLM(by_task={"facts": [facts], "episode": [timeout()]})
    memory = make_memory(llm=llm, config=fast_llm_config(strict=True))
    ids = memory.add_many(CONVO, session_id="s1", user_id="u1")
    with pytest.raises(LLMError):
        memory.end_session("s1", user_id="u1")
    assert memory.facts("u1") == [] and memory.episodes("u1") == []
    memory.llm = ScriptedLLM(by_task={"facts": [facts], "episode": [GOOD_EPISODE]})
    assert memory.end_session("s1", user_id="u1").source_ids == ids
    assert [f.text for f in memory.facts("u1")] == ["User prefers Postgres for billing"]


def test_a_turn_longer_than_the_transcript_reaches_the_llm_clipped(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [GOOD_EPISODE]})
    # the prompt is the point, not the ranking: the static embedder (MiniLM took 12 s on the 90,000 characters)
    memory = make_memory(llm=llm, config=fast_llm_config(strict=True, timeout_s=5), embedder=StaticEmbedder())
    memory.add("user", "Is this a known error? " + "frame at payments.py line 42 " * 3000, session_id="s", user_id="u")
    memory.end_session("s", user_id="u")
    assert llm.tasks() == ["facts", "episode"]
    for call in llm.calls:  # the newest turns up to 12,000 characters: one turn alone too
        prompt = call.messages[-1]["content"]
        assert len(prompt) <= 12_100 and "Is this a known error?" in prompt


def test_an_llm_episode_of_endless_lists_keeps_as_many_points_as_the_rules_and_is_recalled(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A model that lists 2,000 decisions (a loop, or every line of a pasted log) made an episode
    of 4,000 indexed key points that no context budget held: it is kept to the rules' own
    counts (20 entities, 10 of each other list), its first ones, as the model ranked them."""
    endless = {**GOOD_EPISODE, "entities": [f"Service{n}" for n in range(500)],
               "decisions": [f"Move billing shard {n} to PostgreSQL 16" for n in range(2_000)],
               "open_questions": [f"What about shard {n}?" for n in range(300)],
               "key_facts": [f"Shard {n} holds invoices" for n in range(300)]}
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [endless]})
    memory = make_memory(llm=llm)
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    episode = memory.end_session("s1", user_id="u1")
    assert episode.metadata == {"method": "llm"}
    assert episode.entities == endless["entities"][:20] and episode.decisions == endless["decisions"][:10]
    assert episode.open_questions == endless["open_questions"][:10] and episode.key_facts == endless["key_facts"][:10]
    assert memory.episodes("u1") == [episode]
    context = memory.build_context("billing migration to PostgreSQL", user_id="u1", session_id="s2")
    assert [i.id for s in context.sections if s.name == "episodes" for i in s.items] == [f"ep:{episode.id}"]


def test_with_an_llm_every_turn_of_a_long_session_reaches_the_model(make_memory: Callable[..., TieredMemory]) -> None:
    """The transcript holds the newest 12,000 characters, so of a long session the model read
    only its end, while the one episode made cited (and covered) every turn: the facts and
    events of the rest never reached it and never would. Each span of turns that one transcript
    holds now gets its episode, oldest first; end_session returns the newest."""
    llm = ScriptedLLM(by_task={"facts": [], "episode": []},
                      default=lambda msgs: NO_FACTS if task_of(msgs) == "facts" else GOOD_EPISODE)
    memory = make_memory(llm=llm)
    said = [f"Turn {n}: the billing shard {n} moves to PostgreSQL next week, " + "detail " * 60 for n in range(60)]
    ids = memory.add_many([{"role": "user", "content": t} for t in said], session_id="s1", user_id="u1")
    last = memory.end_session("s1", user_id="u1")
    episodes = memory.episodes("u1", session_id="s1")
    assert last == episodes[-1] and [i for e in episodes for i in e.source_ids] == ids
    prompts = [c.messages[-1]["content"] for c in llm.calls if c.task == "episode"]
    assert len(prompts) == len(episodes) > 1
    for episode, prompt in zip(episodes, prompts):  # each episode cites the turns its model read
        assert all(said[ids.index(i)][:40] in prompt for i in episode.source_ids)


def test_transcript_spans_show_every_turn_whole() -> None:
    rows = [{"role": "user", "content": f"turn {n} " + "word " * (n * 40)} for n in range(30)]
    rows.insert(10, {"role": "assistant", "content": "a pasted log " * 2_000})  # alone longer than a prompt
    msgs = stored(rows)
    spans = transcript_spans(msgs, max_chars=3_000)
    assert [m for span in spans for m in span] == msgs and len(spans) > 2
    for span in spans:
        shown = transcript(span, max_chars=3_000)
        assert shown.count("\n") == len(span) - 1 and len(shown) <= 3_000
        assert len(span) == 1 or all(quote(m.content) in shown for m in span)


def test_an_llm_episodes_long_points_are_cut_as_the_rules_cut_a_sentence(
        make_memory: Callable[..., TieredMemory]) -> None:
    """Each entity, decision, open question and key fact is a bullet of a summary: a model
    that pastes a log into one (up to a fact's 5,000 characters, or past it) has it cut at a
    word, with an ellipsis, as the rules cut a sentence (300 characters), not refused."""
    long = " ".join(f"shard{n} moves to PostgreSQL 16 in eu-west-1" for n in range(200))  # 8,000 characters
    wordy = {**GOOD_EPISODE, "entities": ["BILL-42", "Billing" * 60], "decisions": [long[:5_000], "Keep BILL-42"],
             "open_questions": [long], "key_facts": [long[:4_000] + ".", "Budget approved: $4,000"]}
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [wordy]})
    memory = make_memory(llm=llm)
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    episode = memory.end_session("s1", user_id="u1")
    assert episode.metadata == {"method": "llm"} and llm.tasks() == ["facts", "episode"]  # taken, not asked again
    for kind in ("entities", "decisions", "open_questions", "key_facts"):
        for said, kept in zip(wordy[kind], getattr(episode, kind), strict=True):
            assert kept == clip(said) and len(kept) <= MAX_SENTENCE_CHARS
    assert episode.decisions[1] == "Keep BILL-42" and episode.key_facts[1] == "Budget approved: $4,000"
    assert episode.decisions[0].endswith("\u2026") and long.startswith(episode.decisions[0][:-1])
    assert memory.episodes("u1") == [episode]


@pytest.mark.record_stores("sqlite")
def test_an_llm_episodes_invalid_points_are_dropped_and_the_episode_kept(
        make_memory: Callable[..., TieredMemory], caplog: pytest.LogCaptureFixture) -> None:
    """One entity that is no string (an object, null, a number), or a list that is no list,
    made the whole episode invalid: asked again, then the rules' episode replaced the model's.
    Each point is validated alone and a list field that is not a list is left empty: dropped
    and logged with their count; the summary and the valid points are kept, not asked again."""
    answer = {**GOOD_EPISODE, "entities": ["BILL-42", {"name": "Maria"}, None, 42, "eu-west-1"],
              "decisions": "none", "open_questions": [["How to archive old invoices"]]}
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS], "episode": [answer]})
    memory = make_memory(llm=llm, embedder=StaticEmbedder())
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        episode = memory.end_session("s1", user_id="u1")
    assert llm.tasks() == ["facts", "episode"] and episode.metadata == {"method": "llm"}
    assert episode.summary == GOOD_EPISODE["summary"] and episode.key_facts == GOOD_EPISODE["key_facts"]
    assert (episode.entities, episode.decisions, episode.open_questions) == (["BILL-42", "eu-west-1"], [], [])
    [warning] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "5 invalid entries" in warning and "entities.1" in warning and "decisions" in warning
