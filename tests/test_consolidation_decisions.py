"""Consolidation's decisions, pure and table-tested: which facts merge into which, which episodes
are promoted or compressed, what is pruned, and which vector ids archiving a message drops."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from consolidation_support import NOW
from time_support import DAY
from tiered_memory.layers.consolidation import (
    near_pairs,
    plan_merges,
    promotion_candidates,
    select_compressions,
    select_promotions,
    should_prune,
)
from tiered_memory.layers.episodic import Episode
from tiered_memory.layers.semantic import Fact
from tiered_memory.recall.chunking import CHUNK_OVER, vector_ids
from tiered_memory.records import NO_TIME


def _fact(fid: str, conf: float, access: int, created: float, type: str = "fact", polarity: int = 1,
          key: str | None = None, text: str | None = None) -> Fact:
    return Fact(id=fid, user_id="u", type=type, text=text or fid, confidence=conf, access_count=access,
                created_at=created, polarity=polarity, key=key)


@pytest.mark.parametrize("sims, facts, expected", [
    ([[1, .95, .2], [.95, 1, .1], [.2, .1, 1]], [_fact("a", .5, 0, 1), _fact("b", .9, 0, 2), _fact("c", .5, 0, 3)],
     [("b", ["a"])]),  # the more confident one is kept
    ([[1, .95], [.95, 1]], [_fact("a", .5, 3, 1), _fact("b", .5, 0, 0)], [("a", ["b"])]),  # then most accessed
    ([[1, .95], [.95, 1]], [_fact("a", .5, 0, 5), _fact("b", .5, 0, 1)], [("b", ["a"])]),  # then oldest
    ([[1, .95], [.95, 1]], [_fact("a", .5, 0, 1), _fact("b", .5, 0, 2, type="preference")], []),  # types differ
    ([[1, .95], [.95, 1]], [_fact("a", .5, 0, 1), _fact("b", .5, 0, 2, polarity=-1)], []),  # polarity differs
    ([[1, .91], [.91, 1]], [_fact("a", .5, 0, 1), _fact("b", .5, 0, 2)], []),  # below threshold
    ([[1, .95], [.95, 1]], [_fact("a", .5, 0, 1, key="rel:sister"), _fact("b", .5, 0, 2, key="rel:brother")],
     []),  # other slots: two facts
    ([[1, .95], [.95, 1]], [_fact("a", .5, 0, 1, key="rel:sister"), _fact("b", .5, 0, 2)],
     [("a", ["b"])]),  # one of no slot may be the same fact
    ([[1, .92], [.92, 1]], [_fact("a", .5, 0, 1), _fact("b", .5, 0, 2)], [("a", ["b"])]),  # at it: merged
    ([[1, .95, .95], [.95, 1, .95], [.95, .95, 1]], [_fact("a", .9, 0, 1), _fact("b", .5, 0, 2),
                                                     _fact("c", .5, 0, 3)], [("a", ["b", "c"])]),
    # the keeper's text stays: a duplicate it does not say all of is another fact (the rules' update,
    # resolution.says_all_of); "Tuesday" is 0.95 from "Monday" with MiniLM and the static embedder
    ([[1, .95], [.95, 1]], [_fact("a", .5, 0, 1, text="User has a meeting on Monday"),
                            _fact("b", .5, 0, 2, text="User has a meeting on Tuesday")], []),
    ([[1, .97], [.97, 1]], [_fact("a", .9, 0, 2, text="User's flight is on May 3"),
                            _fact("b", .5, 0, 1, text="User's flight is on May 4")], []),
    ([[1, .95], [.95, 1]], [_fact("a", .9, 0, 1, text="User enjoys hiking in the mountains with friends"),
                            _fact("b", .5, 0, 2, text="user enjoys hiking in the mountains.")], [("a", ["b"])]),
    ([[1, .95], [.95, 1]], [_fact("a", .9, 0, 1, text="User enjoys hiking in the mountains"),
                            _fact("b", .5, 0, 2, text="User enjoys hiking in the mountains with friends")], []),
])
def test_plan_merges(sims: list[list[float]], facts: list[Fact], expected: list[tuple[str, list[str]]]) -> None:
    near = [{int(j): float(row[j]) for j in np.flatnonzero(row >= 0.92)} for row in np.array(sims)]
    plan = plan_merges(facts, near)
    assert [(keep, list(dups)) for keep, dups in plan] == expected
    at = {f.id: i for i, f in enumerate(facts)}  # each duplicate with its similarity to the keeper
    assert all(sim == sims[at[keep]][at[d]] for keep, dups in plan for d, sim in dups.items())


def test_a_plan_leaves_no_merge_for_the_next_run() -> None:
    """Equal confidence and accesses: "allergic" (the oldest) ranks first and says less than
    "severely allergic", which takes in its own copy and with it that copy's accesses. Ranked by
    those, it now says all the first one does and outranks it: a plan that stopped there left the
    next run a merge to make (the run was not idempotent). The plan goes on till none is left."""
    facts = [_fact("p", .8, 1, 1, text="User is allergic to peanuts"),
             _fact("q", .8, 1, 2, text="User is severely allergic to peanuts"),
             _fact("r", .8, 1, 3, text="USER IS SEVERELY ALLERGIC TO PEANUTS.")]
    near = [{0: 1.0, 1: .99, 2: .98}, {0: .99, 1: 1.0, 2: .99}, {0: .98, 1: .99, 2: 1.0}]
    assert [(keep, dict(dups)) for keep, dups in plan_merges(facts, near)] == [("q", {"r": .99}), ("q", {"p": .99})]
    # a keeper more accessed than what its duplicates bring keeps its place: nothing more to merge
    busy = [replace(facts[0], access_count=5), *facts[1:]]
    assert [(keep, list(dups)) for keep, dups in plan_merges(busy, near)] == [("q", ["r"])]


def test_near_pairs_are_the_rows_of_the_similarity_matrix_at_the_threshold() -> None:
    vecs = np.random.default_rng(3).standard_normal((700, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    sims = vecs @ vecs.T
    for block in (1, 256, 1000):  # a block of one row, blocks with a partial last one, one block for all
        near = near_pairs(vecs, 0.6, block=block)
        assert len(near) == 700
        assert all(list(near[i]) == list(np.flatnonzero(sims[i] >= 0.6)) for i in range(700))
        # with each one's similarity: what put a duplicate in a merge's group (its history says it)
        assert all(near[i][j] == pytest.approx(float(sims[i, j]), abs=1e-6) for i in range(700) for j in near[i])
    assert sum(len(n) for n in near_pairs(vecs, 0.6)) > 700  # pairs besides each vector and itself


def _ep(eid: str, access: int = 0, age_days: float = 0, promoted: bool = False, compressed: bool = False,
        **kw: Any) -> Episode:
    return Episode(id=eid, user_id="u", session_id="s", summary=f"summary {eid}", access_count=access,
                   end=NOW - age_days * DAY, promoted_at=1.0 if promoted else None,
                   compressed_at=1.0 if compressed else None, **kw)


def test_select_promotions_and_compressions() -> None:
    eps = [_ep("a", access=5), _ep("b", access=2), _ep("c", access=9, promoted=True), _ep("d", access=3)]
    assert [e.id for e in select_promotions(eps, 3)] == ["a", "d"]
    eps = [_ep("old", age_days=40), _ep("new", age_days=5), _ep("done", age_days=90, compressed=True),
           replace(_ep("undated"), end=NO_TIME)]  # a time that could not be read: no age
    assert [e.id for e in select_compressions(eps, NOW, 30)] == ["old"]


@pytest.mark.parametrize("episode, expected", [
    (_ep("a", key_facts=["User runs a bakery"], decisions=["Open on Sundays"]), [("fact", "User runs a bakery")]),
    (_ep("b", decisions=["Open on Sundays"]), [("decision", "Open on Sundays")]),
    (_ep("c"), [("fact", "summary c")]),
])
def test_promotion_candidates(episode: Episode, expected: list[tuple[str, str]]) -> None:
    assert [(c.type, c.text) for c in promotion_candidates(episode)] == expected


def test_a_promoted_fact_in_a_slots_words_is_in_that_slot() -> None:
    """A key fact "User lives in Paris" is the residence slot's, as the session's own fact was:
    without the slot, the rules cannot see that a later "User lives in Berlin" replaced it."""
    cands = promotion_candidates(_ep("a", key_facts=["User lives in Paris", "User runs a bakery",
                                                     "User doesn't like coriander"]))
    assert [(c.key, c.polarity) for c in cands] == [("residence", 1), (None, 1), ("pref:coriander", -1)]


@pytest.mark.parametrize("value, access, age, expected", [
    (0.01, 0, 60, True),
    (0.01, 1, 60, False),   # accessed: kept
    (0.01, 0, 10, False),   # too young
    (0.01, 0, 30, True),    # exactly min_age_days old: old enough
    (0.05, 0, 60, False),   # worth exactly `below`: not below it
    (0.5, 0, 400, False),   # still valuable
])
def test_should_prune(value: float, access: int, age: float, expected: bool) -> None:
    assert should_prune(value, access, age, below=0.05, min_age_days=30) is expected


@pytest.mark.parametrize("lengths, chunked", [
    ({}, []),  # none held any more (a rerun): their own ids only
    ({"a": 20, "b": 1200}, []),  # short ones have no chunks
    ({"a": 1201, "b": 5}, ["a"]),
    ({"a": 5000, "b": 90_000}, ["a", "b"]),
])
def test_archived_vector_ids(lengths: dict[str, int], chunked: list[str]) -> None:
    """What consolidation deletes: each message's own vector, and the chunk ids of those its
    lengths say were chunked (over CHUNK_OVER characters)."""
    ids = vector_ids(["a", "b"], {m for m, n in lengths.items() if n > CHUNK_OVER})
    assert [i for i in ids if "\x1f" not in i] == ["a", "b"]
    assert [i for i in ids if "\x1f" in i] == [f"{m}\x1f{n}" for m in chunked for n in range(64)]
    assert vector_ids(["a"]) == ["a", *(f"a\x1f{n}" for n in range(64))]  # lengths unknown: every chunk id


def test_a_promoted_point_cites_the_turns_that_say_it() -> None:
    """A point cites the episode's turns that say all it does; one that none says (a model's words),
    or that says nothing ("OK"), the episode's last 20 turns its user holds (all 20 as written,
    without the texts: as before)."""
    ep = _ep("a", key_facts=["User is a violin teacher", "User plays in a quartet", "OK"],
             source_ids=[f"t{n}" for n in range(30)])
    said = {"t0": "I'm a violin teacher.", "t1": "Nice!", "t7": "So you teach violin? A violin teacher, great."}
    held = ("t0", "t1", "t7")
    assert [c.source_ids for c in promotion_candidates(ep, said)] == [("t0", "t7"), held, held]
    assert [c.source_ids for c in promotion_candidates(ep)] == [tuple(f"t{n}" for n in range(10, 30))] * 3
