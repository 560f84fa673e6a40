"""Reads commit nothing and embed the query once; access counts arrive in batches and
count what reached the caller, on every layer."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import pytest

from hook_support import commits_during
from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.parts import AccessLog
from tiered_memory.testing import CountingEmbedder


@pytest.fixture
def counted(make_memory: Callable[..., TieredMemory], embedder: Any) -> Iterator[tuple[TieredMemory, CountingEmbedder]]:
    emb = CountingEmbedder(embedder)
    memory = make_memory("reads", embedder=emb, config=MemoryConfig(access_flush_size=10_000,
                                                                    access_flush_seconds=3600))
    memory.add_many([{"role": "user", "content": "I adopted a greyhound called Pixel."},
                     {"role": "assistant", "content": "Pixel is a great name for a greyhound."}],
                    session_id="old", user_id="u")
    memory.end_session("old", user_id="u")
    memory.add_fact("User lives in Porto", user_id="u")
    memory.working_memory("now", user_id="u").remember("user wants dog-friendly cafes", type="goal")
    memory.add("user", "Any plans for the weekend?", session_id="now", user_id="u")
    yield memory, emb


def test_search_and_build_context_commit_nothing(counted: tuple[TieredMemory, CountingEmbedder]) -> None:
    memory, _ = counted
    assert commits_during(memory, lambda: memory.search("what is my dog called?", user_id="u")) == 0
    assert commits_during(memory, lambda: memory.search_sessions("what is my dog called?", user_id="u")) == 0
    assert commits_during(memory, lambda: memory.build_context(
        "dog-friendly places for Pixel?", user_id="u", session_id="now")) == 0
    assert commits_during(memory, lambda: memory.search_facts("where do I live", user_id="u")) == 0
    assert commits_during(memory, lambda: memory.search_episodes("greyhound", user_id="u")) == 0
    assert memory.parts.access.pending > 0  # noted, not written


def test_build_context_embeds_the_query_once(counted: tuple[TieredMemory, CountingEmbedder]) -> None:
    memory, emb = counted
    emb.queries.clear()
    ctx = memory.build_context("dog-friendly places for Pixel where I live in Porto?", user_id="u", session_id="now")
    assert emb.queries == ["dog-friendly places for Pixel where I live in Porto?"]
    names = {s.name for s in ctx.sections if s.items}
    assert {"session", "facts", "episodes"} <= names  # every section was served by that one vector


def test_access_counts_are_what_reached_the_caller_and_arrive_in_a_batch(
        counted: tuple[TieredMemory, CountingEmbedder]) -> None:
    memory, _ = counted
    hits = memory.search("greyhound Pixel", user_id="u", k=1)
    fact_hits = memory.search_facts("Porto", user_id="u", k=1)
    ep_hits = memory.search_episodes("greyhound", user_id="u", k=1)
    ctx = memory.build_context("Pixel", user_id="u", session_id="now", max_tokens=60)
    kept = {i.id for s in ctx.sections for i in s.items}
    dropped = {d.id for d in ctx.dropped if d.section != "recent"}
    # a flush writes them all in one go, and the listings show them
    facts = {f.id: f for f in memory.facts("u")}
    episodes = {e.id: e for e in memory.episodes("u")}
    assert memory.parts.access.pending == 0
    assert facts[fact_hits[0].fact.id].access_count == 1 + (f"fact:{fact_hits[0].fact.id}" in kept)
    assert episodes[ep_hits[0].episode.id].access_count == 1 + (f"ep:{ep_hits[0].episode.id}" in kept)
    for d in dropped:  # what the budget dropped was not handed over, so it does not count
        prefix, _, rest = d.partition(":")
        if prefix == "fact":
            assert facts[rest].access_count == (1 if rest == fact_hits[0].fact.id else 0)
    assert hits  # turns are counted too (the messages table keeps no count in its records)


def test_close_writes_pending_counts(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("close-flush", config=MemoryConfig(access_flush_size=10_000, access_flush_seconds=3600))
    memory.add_fact("User plays the cello", user_id="u")
    memory.search_facts("cello", user_id="u")
    memory.close()
    again = make_memory("close-flush")
    assert [f.access_count for f in again.facts("u")] == [1]


def test_the_access_log_flushes_by_size_in_the_background() -> None:
    written: list[tuple[str, list[str], float]] = []
    done = threading.Event()

    def toucher(user: str, ids: list[str], now: float) -> None:
        written.append((user, ids, now))
        done.set()

    log = AccessLog({"fact": toucher}, threading.RLock(), flush_size=3, flush_seconds=3600)
    log.note("fact", "u", ["a", "b"], 1.0)
    assert written == [] and log.pending == 2
    log.note("fact", "u", ["a"], 2.0)  # reaches the size: the background thread writes
    assert done.wait(10)
    assert written == [("u", ["a", "b", "a"], 2.0)] and log.pending == 0
    log.note("fact", "v", ["c"], 3.0)
    log.close()
    assert written[-1] == ("v", ["c"], 3.0)
    log.note("fact", "v", ["d"], 4.0)  # after close nothing is kept
    assert log.pending == 0
