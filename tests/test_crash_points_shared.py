"""SIGKILL between a committed row and its vector on a shared store: PostgreSQL records with
a Chroma server's index, the deployment of many workers. A shared store has no full repair at
open (it cannot tell a crashed worker from a busy one), so what a kill cut off must be marked
in the rows themselves and indexed by the next open of any worker, as the turns left pending
are: a fact or an episode whose row committed and whose vector was never written is found by
meaning again after a restart, without ``rebuild_index()``.

The harness is ``tests/crash_support.py``'s: the child (this file run as a script) reopens the
memory, arms one kill point and starts the operation; the parent reopens and checks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from tests.crash_support import TURNS, add_old_session, child, found_by_meaning, kill_at, open_memory, run_child, step
from tiered_memory import TieredMemory
from tiered_memory.layers import semantic

pytestmark = pytest.mark.servers
SCRIPT = Path(__file__)


@pytest.fixture
def shared(make_postgres_url: Callable[[], str], chroma_url: str, chroma_collection: str,
           monkeypatch: pytest.MonkeyPatch) -> None:
    """This process and its children open a fresh database and a fresh server collection."""
    monkeypatch.setenv("TIERED_MEMORY_RECORD_STORE", make_postgres_url())
    monkeypatch.setenv("TIERED_MEMORY_VECTOR_STORE", f"{chroma_url}?collection={chroma_collection}")


def assert_found_by_meaning(memory: TieredMemory, user: str) -> None:
    """Every valid fact and every episode key point of ``user`` has its vector, of its own text."""
    have = memory.index.ids(user)
    rows = memory._rows
    for fact in memory.facts(user):
        assert f"fact:{fact.id}" in have, f"the vector of fact {fact.text!r} is missing"
        hit = memory.search_facts(fact.text, user_id=user, k=1)[0]
        assert hit.fact.id == fact.id and "vector" in hit.explanation["signals"]
    for episode in memory.episodes(user):
        points = {p for p in rows.point_ids() if p.startswith(f"ep:{episode.id}:")}
        assert points and points <= have, f"the key point vectors of episode {episode.id} are missing"
        query = np.asarray([memory.embedder.embed_query(episode.summary)], dtype=np.float32)
        found = memory.index.query(query, user_id=user, k=1, layers=["episode"])[0]
        assert found and found[0][0] in points


# a fact added: its row committed, its vector never written ----------------------------------
@step
def shared_fact_added_killed_before_its_vector(memory: TieredMemory) -> None:
    kill_at(semantic, "write_fact_vectors")  # its vector and settlement, the row written
    memory.add_fact("User plays the cello", user_id="u")


@step
def shared_fact_updated_killed_before_its_vector(memory: TieredMemory) -> None:
    kill_at(semantic, "write_fact_vectors")  # its vector and settlement, the row written
    memory.update_fact(memory.facts("u")[0].id, user_id="u", text="User speaks fluent Japanese")


@step
def shared_episode_killed_before_its_vectors(memory: TieredMemory) -> None:
    kill_at(memory._layers.episodes, "_upsert")
    memory.end_session("s", user_id="u")


def test_a_fact_added_on_a_shared_store_and_killed_before_its_vector_is_indexed_by_the_next_open(
        tmp_path: Path, shared: None) -> None:
    run_child("shared_fact_added_killed_before_its_vector", tmp_path / "w1", script=SCRIPT)
    with open_memory(tmp_path / "w2") as memory:  # another worker's open
        assert [f.text for f in memory.facts("u")] == ["User plays the cello"]
        assert_found_by_meaning(memory, "u")


def test_a_fact_updated_on_a_shared_store_and_killed_before_its_vector_is_indexed_by_its_new_text(
        tmp_path: Path, shared: None) -> None:
    with open_memory(tmp_path / "w1") as memory:
        memory.add_fact("User plays the cello", user_id="u")
    run_child("shared_fact_updated_killed_before_its_vector", tmp_path / "w1", script=SCRIPT)
    with open_memory(tmp_path / "w1") as memory:
        assert [f.text for f in memory.facts("u")] == ["User speaks fluent Japanese"]
        assert_found_by_meaning(memory, "u")


def test_an_episode_on_a_shared_store_killed_before_its_vectors_is_indexed_by_the_next_open(
        tmp_path: Path, shared: None) -> None:
    with open_memory(tmp_path / "w1") as memory:
        memory.add_many([{"role": "user", "content": "I moved to Porto in March and I adopted a cat called Miso."},
                         {"role": "assistant", "content": "Congratulations on the move and on Miso!"}],
                        session_id="s", user_id="u")
    run_child("shared_episode_killed_before_its_vectors", tmp_path / "w1", script=SCRIPT)
    with open_memory(tmp_path / "w2") as memory:
        assert len(memory.episodes("u")) == 1
        assert_found_by_meaning(memory, "u")
        assert memory.search_episodes("where did I move?", user_id="u", k=1)


# a turn stored as a duplicate of one consolidate or forget removes ------------------------
@step
def shared_consolidate_killed_after_archiving(memory: TieredMemory) -> None:  # turns archived, vectors not
    kill_at(memory.index, "delete")
    memory.consolidate("u")


@step
def shared_forget_killed_after_the_delete(memory: TieredMemory) -> None:
    kill_at(memory.index, "delete")
    memory.forget(memory.get_messages("old", user_id="u")[1].id, user_id="u")


@pytest.mark.parametrize("scenario", ["shared_consolidate_killed_after_archiving",
                                      "shared_forget_killed_after_the_delete"])
def test_a_duplicate_of_a_turn_removed_on_a_shared_store_just_before_a_kill_is_found_by_meaning_after_it(
        tmp_path: Path, shared: None, scenario: str) -> None:
    with open_memory(tmp_path / "w1") as memory:
        add_old_session(memory, "u")
        # a later session repeats a turn: stored as a duplicate of the old one, found by its vector
        again = memory.add_many([{"role": "user", "content": TURNS[1]}], session_id="new", user_id="u")[0]
        assert again not in memory.index.ids("u")  # a duplicate: no vector of its own
    run_child(scenario, tmp_path / "w1", script=SCRIPT)
    with open_memory(tmp_path / "w2") as memory:
        assert found_by_meaning(memory.search(TURNS[1], user_id="u", k=5), again)


# rebuild_index cut short: the index dropped, the turns written again, the layers not yet -------
@step
def shared_rebuild_killed_before_the_layers(memory: TieredMemory) -> None:
    kill_at(memory._layers, "reindex")
    memory.rebuild_index()


def test_a_rebuild_on_a_shared_store_killed_before_the_facts_and_episodes_is_finished_by_the_next_open(
        tmp_path: Path, shared: None) -> None:
    with open_memory(tmp_path / "w1") as memory:
        memory.add_many([{"role": "user", "content": "I moved to Porto in March and I adopted a cat called Miso."}],
                        session_id="s", user_id="u")
        memory.end_session("s", user_id="u")
        memory.add_fact("User plays the cello", user_id="u")
    run_child("shared_rebuild_killed_before_the_layers", tmp_path / "w1", script=SCRIPT)
    with open_memory(tmp_path / "w2") as memory:
        assert len(memory.episodes("u")) == 1 and "User plays the cello" in [f.text for f in memory.facts("u")]
        assert_found_by_meaning(memory, "u")


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
