"""Episodic memory: end_session, the extractive rules, search, background compression (a model's
episodes: tests/test_episodic_llm.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Callable

import pytest

from episode_support import CONVO, GOOD_EPISODE, NO_FACTS, stored
from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.config import BufferConfig, EpisodeConfig
from tiered_memory.layers.episodic import rank_episodes
from tiered_memory.records import Episode
from tiered_memory.errors import NotFoundError
from tiered_memory.layers.extractive import (extract_episode, find_dates, find_entities, find_ids, find_numbers,
                                             salient_sentences)
from tiered_memory.testing import ScriptedLLM

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

DAY = 86400.0


# ---- pure helpers -------------------------------------------------------------
@pytest.mark.parametrize("fn, text, expected", [
    (find_ids, "see BILL-42, ticket #881 and ops@example.com", ["BILL-42", "#881", "ops@example.com"]),
    (find_dates, "due 2025-03-01, or March 5th, next Friday", ["2025-03-01", "March 5th", "next Friday"]),
    (find_numbers, "a budget of $4,000 and 3 servers at 25%", ["$4,000", "3", "25%"]),
    (find_entities, "Nice to meet you. Maria works with Anna at Acme Corp.", ["Maria", "Anna", "Acme Corp"]),
])
def test_rule_finders(fn: Callable[[str], list[str]], text: str, expected: list[str]) -> None:
    assert fn(text) == expected


def test_extract_episode_by_rules() -> None:
    ep = extract_episode(stored(CONVO))
    assert "BILL-42" in ep.entities and "Maria" in ep.entities
    assert any("decided" in d for d in ep.decisions)
    assert ep.open_questions == ["Not sure yet how to handle the archive of old invoices?"]
    assert ep.summary and all(s in " ".join(r["content"] for r in CONVO) for s in ep.summary.split(". ")[:1])


CHAT = [  # a transcript: a speaker's name opens each message and the other's is said in most
    "Gina: Hey Jon! Good to see you. What's up?",
    "Jon: Hey Gina! Lost my job as a banker yesterday, so I'm starting my own dance studio business.",
    "Gina: Sorry about your job, Jon. I also lost my job at Door Dash this month.",
    "Jon: Thanks, Gina! The dance studio needs good flooring. Finding a studio location is hard.",
    "Gina: That's cool, Jon! Wow Jon, same here!",
    "Jon: Cool, Gina! Thanks, Gina!",
    "Gina: My online clothing store opens next week, selling trendy clothing.",
]


def test_salient_sentences_skip_names_and_pleasantries() -> None:
    summary = salient_sentences(CHAT, k=3)
    assert len(summary) == 3
    said = " ".join(summary)
    for phatic in ("That's cool", "Wow Jon", "Cool, Gina", "Thanks, Gina!"):
        assert phatic not in said  # before: the names in every line made these the most "salient"
    assert "Lost my job as a banker" in said and "clothing store" in said  # two topics, not one twice
    assert all(s.startswith(("Jon: ", "Gina: ")) for s in summary)  # a mid-message sentence keeps its speaker


def test_salient_sentences_fall_back_to_short_ones() -> None:
    assert salient_sentences(["Hi!", "Hello there."], k=3) == ["Hi!", "Hello there."]
    assert salient_sentences([], k=3) == []


@pytest.mark.parametrize("scores, ends, weight, expected", [
    # one entry per episode, its best point wins
    ({"ep:a:0": 0.9, "ep:a:1": 0.5, "ep:b:0": 0.4}, {"a": 100.0, "b": 100.0}, 0.0, ["a", "b"]),
    # recency breaks a near tie in favour of the newer episode
    ({"ep:a:0": 0.50, "ep:b:0": 0.49}, {"a": 100.0 - 300 * DAY, "b": 100.0}, 0.2, ["b", "a"]),
    # without recency weight, relevance alone decides
    ({"ep:a:0": 0.50, "ep:b:0": 0.49}, {"a": 100.0 - 300 * DAY, "b": 100.0}, 0.0, ["a", "b"]),
    # points of unknown episodes are ignored
    ({"ep:a:0": 0.5, "ep:z:0": 0.9}, {"a": 100.0}, 0.2, ["a"]),
    ({}, {"a": 1.0}, 0.2, []),
])
def test_rank_episodes(scores: dict[str, float], ends: dict[str, float], weight: float,
                       expected: list[str]) -> None:
    point_episode = {p: p.split(":")[1] for p in scores}
    ranked = rank_episodes(scores, point_episode, ends, now=100.0, recency_weight=weight, half_life_days=30)
    assert [r[0] for r in ranked] == expected
    assert len({r[0] for r in ranked}) == len(ranked)


# ---- end_session --------------------------------------------------------------
def test_end_session_without_llm_is_extractive(memory: TieredMemory) -> None:
    ids = memory.add_many(CONVO, session_id="s1", user_id="u1")
    ep = memory.end_session("s1", user_id="u1")
    assert isinstance(ep, Episode)
    assert ep.metadata["method"] == "extractive" and ep.metadata["reason"] == "no llm configured"
    assert ep.source_ids == ids and ep.turn_count == 3 and ep.session_id == "s1"
    assert ep.start <= ep.end
    assert "BILL-42" in ep.entities
    assert len(memory.get_messages("s1", user_id="u1")) == 5  # raw messages stay
    assert memory.episodes("u1") == [ep]


@pytest.mark.parametrize("delete", ["forget", "clear_session"])
def test_a_turn_after_the_newest_were_deleted_still_gets_its_episode(make_memory: Callable[..., TieredMemory],
                                                                     delete: str) -> None:
    # a deleted newest message's seq is never given again: the session's cursor, past it,
    # would take the new turn for one an episode already holds
    memory = make_memory()
    ids = [memory.add("user", f"I like tea number {i}.", session_id="s", user_id="u") for i in range(3)]
    seqs = [m.seq for m in memory.get_messages("s", user_id="u")]
    first = memory.end_session("s", user_id="u")
    if delete == "forget":
        memory.forget(ids[-1], user_id="u")
    else:
        memory.clear_session("s", user_id="u")
    new = memory.add("user", "My brother is called Tom.", session_id="s", user_id="u")
    again = memory.end_session("s", user_id="u")
    assert again.id != first.id and new in again.source_ids
    assert memory.get_messages("s", user_id="u")[-1].seq > max(seqs)


def test_end_session_is_idempotent_and_incremental(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={"facts": [NO_FACTS, NO_FACTS], "episode": [GOOD_EPISODE, GOOD_EPISODE]})
    memory = make_memory(llm=llm)
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    first = memory.end_session("s1", user_id="u1")
    assert memory.end_session("s1", user_id="u1") == first  # nothing new: no LLM call
    assert len(llm.calls) == 2
    later = memory.add("user", "Also add monitoring with Grafana.", session_id="s1", user_id="u1")
    second = memory.end_session("s1", user_id="u1")
    assert second.id != first.id and second.source_ids == [later]
    assert [e.id for e in memory.episodes("u1", session_id="s1")] == [first.id, second.id]


def test_end_session_of_unknown_session(memory: TieredMemory) -> None:
    with pytest.raises(NotFoundError):
        memory.end_session("nope", user_id="u1")


async def test_async_and_sync_inside_a_running_loop(memory: TieredMemory) -> None:
    memory.add_many(CONVO[:2], session_id="a", user_id="u1")
    memory.add_many(CONVO[2:], session_id="b", user_id="u1")
    ep_a = await memory.aend_session("a", user_id="u1")
    ep_b = memory.end_session("b", user_id="u1")  # sync twin while a loop runs (Jupyter)
    assert {ep_a.session_id, ep_b.session_id} == {"a", "b"}


# ---- search ---------------------------------------------------------------------
def _session(memory: TieredMemory, sid: str, texts: list[str], ts: float) -> Episode:
    memory.add_many([{"role": "user", "content": t, "timestamp": ts + n} for n, t in enumerate(texts)],
                    session_id=sid, user_id="u1")
    return memory.end_session(sid, user_id="u1")


def test_search_episodes_whole_episodes_one_each(memory: TieredMemory) -> None:
    now = time.time()
    db = _session(memory, "db", ["We decided to use PostgreSQL for billing.", "Postgres replicas in eu-west-1."],
                  now - 10 * DAY)
    trip = _session(memory, "trip", ["I am planning a trip to Japan in April.", "Kyoto temples and sushi."],
                    now - 5 * DAY)
    hits = memory.search_episodes("which database did we choose for billing?", user_id="u1", k=5)
    assert [h.episode.id for h in hits][0] == db.id
    assert len({h.episode.id for h in hits}) == len(hits)
    assert hits[0].matched and "explanation" not in hits[0].matched
    assert memory.search_episodes("Japan trip", user_id="u1")[0].episode.id == trip.id
    assert memory.episodes("u1")[0].access_count >= 1  # access patterns updated


def test_search_episodes_prefers_recent_among_equals(make_memory: Callable[..., TieredMemory]) -> None:
    config = MemoryConfig(episodes=EpisodeConfig(recency_weight=0.5))
    memory = make_memory(config=config)
    now = time.time()
    old = _session(memory, "old", ["Weekly sync about the release checklist."], now - 200 * DAY)
    new = _session(memory, "new", ["Weekly sync about the release checklist."], now - 1 * DAY)
    hits = memory.search_episodes("release checklist sync", user_id="u1")
    assert [h.episode.id for h in hits] == [new.id, old.id]


def test_episodes_are_per_user(memory: TieredMemory) -> None:
    memory.add("user", "Secret project Falcon kickoff.", session_id="s", user_id="alice")
    memory.end_session("s", user_id="alice")
    memory.add("user", "Gardening tips.", session_id="s", user_id="bob")
    memory.end_session("s", user_id="bob")
    assert all(h.episode.user_id == "bob" for h in memory.search_episodes("Falcon project", user_id="bob"))



def test_an_episode_whose_id_holds_a_colon_is_found(memory: TieredMemory, tmp_path: Any) -> None:
    # an import keeps an episode's id as written, and an id may hold ":" ("slack:C1:ep-1", as a
    # message id may): its key points' vector ids are "ep:slack:C1:ep-1:0"
    old = time.time() - DAY
    episode = {"id": "slack:C1:ep-1", "user_id": "u1", "session_id": "s", "summary": "Planned the tomato garden",
               "turn_count": 1, "start": old, "end": old, "source_ids": [], "created_at": old}
    src = tmp_path / "episodes.jsonl"
    src.write_text(json.dumps({"format": "tiered-memory/1", "type": "episode", "episode": episode,
                               "points": ["Planned the tomato garden"]}) + "\n")
    assert memory.import_jsonl(src, user_id="u1").episodes_imported == 1
    assert [h.episode.id for h in memory.search_episodes("tomato garden", user_id="u1")] == ["slack:C1:ep-1"]

# ---- compress after N turns: never on the add path ------------------------------------
def test_compress_after_turns_runs_in_background(make_memory: Callable[..., TieredMemory]) -> None:
    gate = threading.Event()

    def slow_episode(messages: list[dict[str, str]]) -> dict[str, Any]:
        gate.wait(120)  # the model is "busy": add must not wait for it
        return GOOD_EPISODE

    llm = ScriptedLLM(by_task={"facts": [NO_FACTS, NO_FACTS], "episode": [slow_episode, GOOD_EPISODE]})
    config = MemoryConfig(buffer=BufferConfig(max_messages=4, max_tokens=2000),
                          episodes=EpisodeConfig(compress_after_turns=4))
    memory = make_memory(llm=llm, config=config)
    ids = []
    for n in range(6):
        ids += memory.add_many([{"role": "user", "content": f"step {n} of the rollout plan"},
                                {"role": "assistant", "content": f"ok, step {n} noted"}],
                               session_id="s1", user_id="u1")
    deadline = time.monotonic() + 60
    while "episode" not in llm.tasks() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "episode" in llm.tasks()  # the compression started in the background...
    assert memory.episodes("u1") == [] and not gate.is_set()  # ...and every add returned while it waits
    gate.set()
    memory.flush(timeout=60)
    [ep] = memory.episodes("u1")
    buffered = {m.id for m in memory.get_buffer("s1", user_id="u1")}
    assert ep.source_ids and set(ep.source_ids).isdisjoint(buffered)  # only the evicted part
    assert ep.source_ids == ids[: len(ep.source_ids)]
    rest = memory.end_session("s1", user_id="u1")  # the remainder at the end
    assert rest.id != ep.id and set(rest.source_ids) == set(ids) - set(ep.source_ids)


def test_config_is_not_mutated(memory: TieredMemory) -> None:
    before = dataclasses.asdict(memory.config)
    memory.add_many(CONVO, session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    assert dataclasses.asdict(memory.config) == before


def test_delete_episode_removes_it_from_every_read_and_releases_its_turns(
        make_memory: Callable[..., TieredMemory]) -> None:
    m = make_memory()
    m.add_many(CONVO, session_id="s1", user_id="u")
    ep = m.end_session("s1", user_id="u")
    m.add("user", "I keep bees.", session_id="t1", user_id="v")
    other = m.end_session("t1", user_id="v")
    assert [h.episode.id for h in m.search_episodes("BILL-42 migration budget", user_id="u", k=1)] == [ep.id]
    assert any(i.startswith(f"ep:{ep.id}:") for i in m.index.ids())
    with pytest.raises(NotFoundError):  # another user's id: refused, nothing removed
        m.delete_episode(ep.id, user_id="v")
    m.delete_episode(ep.id, user_id="u")
    assert m.episodes("u") == [] and m.search_episodes("BILL-42 migration budget", user_id="u", k=3) == []
    assert not any(i.startswith(f"ep:{ep.id}:") for i in m.index.ids())
    section = m.build_context("what was the BILL-42 budget?", user_id="u", session_id="s2").section("episodes")
    assert section is None or section.items == []
    assert [(e.layer, e.item_id, e.action) for e in m.audit_log("u")] == [("episode", ep.id, "delete")]
    assert [e.id for e in m.episodes("v")] == [other.id]
    with pytest.raises(NotFoundError):
        m.delete_episode(ep.id, user_id="u")
    m.add("user", "One more thing: the archive goes to cold storage.", session_id="s1", user_id="u")
    # its turns were released: summarised again, with the new one (tests/test_episode_deletion.py)
    assert m.end_session("s1", user_id="u").source_ids == [t.id for t in m.get_messages("s1", user_id="u")]


def test_an_extractive_episode_of_a_long_paste_is_short_enough_to_be_recalled(memory: TieredMemory) -> None:
    log = " ".join(f"line{i} error in module payments handler timeout" for i in range(500))  # no full stop
    memory.add("user", "here is the log " + log, session_id="s", user_id="u")
    memory.add("assistant", "I see a timeout in the payments handler.", session_id="s", user_id="u")
    episode = memory.end_session("s", user_id="u")
    assert episode.metadata["method"] == "extractive"
    assert 0 < len(episode.summary) <= 1_000  # a summary, not the paste again
    assert all(len(p) <= 400 for p in episode.key_points())
    context = memory.build_context("payments handler timeout", user_id="u", session_id="s2")
    assert [i.id for s in context.sections if s.name == "episodes" for i in s.items] == [f"ep:{episode.id}"]
