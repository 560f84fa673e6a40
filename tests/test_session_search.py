"""Session search: a user's past sessions ranked by their best turn. The pure grouping, then a
real memory (SQLite, Chroma, the bundled model)."""

from __future__ import annotations

import pytest

from tiered_memory import InvalidInputError, MemoryConfig, SessionHit, TieredMemory
from tiered_memory.config import RetrievalConfig
from tiered_memory.recall.sessions import group_by_session


@pytest.mark.parametrize("sessions, k, per, expected", [
    ("AAB", 5, 3, [[0, 1], [2]]),
    ("AAAB", 5, 2, [[0, 1], [3]]),  # a session's third hit is left out
    ("ABACBD", 2, 1, [[0], [1]]),  # only the first k sessions, in the order of their best hit
    ("ABACBD", 2, 2, [[0, 2], [1, 4]]),  # their later hits still join them
    ("ABCA", 3, 1, [[0], [1], [2]]),
    ("", 3, 1, []),
])
def test_group_by_session(sessions, k, per, expected):
    assert group_by_session(list(sessions), k, per) == expected


# ---- a real memory ------------------------------------------------------------------
ROME = [
    "Our trip to Rome was wonderful, the Colosseum at night was unforgettable.",
    "In Rome we ate pasta carbonara every single day of the trip.",
    "The Vatican museums in Rome took a whole day of our trip.",
    "We threw coins in the Trevi fountain on the last evening in Rome.",
    "The Rome trip photos are finally sorted, the Pantheon ones are my favourite.",
    "Walking around Rome wore out my shoes, the trip was worth it.",
    "We took the train from Rome to Florence for a day trip.",
    "Rome in spring is busy but the gelato made up for it on the trip.",
    "Our hotel in Rome was near the Spanish Steps, perfect for the trip.",
    "I bought a leather bag in Rome on the last day of the trip.",
    "The Rome trip cost less than we feared, the flights were cheap.",
    "Next time in Rome I want to see the catacombs on the trip.",
]
LATER = "My sister wants to visit Rome next year, I told her about it."
FILLER = ["The weather was rainy all day.", "We had soup for dinner.", "The bus was late again.",
          "My knee hurts after the run.", "The cat knocked over a plant."]
CHORES = ["I still need to fix the kitchen tap.", "The laundry is piling up.", "Remind me to pay the rent."]


@pytest.fixture
def trips(make_memory) -> TieredMemory:
    m = make_memory("trips")
    m.add_many([{"role": "user", "content": t} for t in ROME], session_id="rome", user_id="u")
    m.add_many([{"role": "user", "content": t} for t in [*FILLER, LATER]], session_id="sister", user_id="u")
    m.add_many([{"role": "assistant", "content": t} for t in CHORES], session_id="chores", user_id="u")
    m.add_many([{"role": "user", "content": "Rome trip memories with the Colosseum."}], session_id="theirs",
               user_id="other")
    return m


def test_sessions_come_in_the_order_of_their_best_turn_with_their_best_turns(trips):
    question = "How was the trip to Rome and the Colosseum?"
    turns = trips.search(question, user_id="u", k=10)
    assert {h.session_id for h in turns} == {"rome"}  # the ten best turns name one session
    found = trips.search_sessions(question, user_id="u", k=2, turns=3)
    assert all(isinstance(f, SessionHit) for f in found)
    assert [f.session_id for f in found] == ["rome", "sister"]
    assert [h.text for h in found[0].hits] == [h.text for h in turns[:3]]
    assert found[1].hits[0].text == LATER
    for f in found:
        assert len(f.hits) <= 3 and {h.session_id for h in f.hits} == {f.session_id}
        assert f.score == f.hits[0].score
        assert [h.score for h in f.hits] == sorted((h.score for h in f.hits), reverse=True)
    assert found[0].score >= found[1].score


def test_every_session_of_the_pool_and_no_other_users(trips):
    found = trips.search_sessions("Rome trip Colosseum", user_id="u", k=10, turns=1)
    assert sorted(f.session_id for f in found) == ["chores", "rome", "sister"]
    assert all(len(f.hits) == 1 for f in found)
    theirs = trips.search_sessions("Rome trip Colosseum", user_id="other", k=10)
    assert [(f.session_id, [h.text for h in f.hits]) for f in theirs] == \
        [("theirs", ["Rome trip memories with the Colosseum."])]
    assert trips.search_sessions("Rome trip", user_id="nobody") == []


def test_filters_apply_to_the_turns(trips):
    found = trips.search_sessions("Rome trip Colosseum", user_id="u", k=10, filters={"role": "assistant"})
    assert [f.session_id for f in found] == ["chores"]
    assert all(h.role == "assistant" for f in found for h in f.hits)


def test_hand_scoring_ranks_sessions_too(make_memory):
    m = make_memory("hand", config=MemoryConfig(retrieval=RetrievalConfig(turn_fusion="hand")))
    m.add_many([{"role": "user", "content": t} for t in ROME[:4]], session_id="rome", user_id="u")
    m.add_many([{"role": "user", "content": t} for t in FILLER], session_id="chores", user_id="u")
    assert [f.session_id for f in m.search_sessions("the Rome trip", user_id="u", k=1)] == ["rome"]


async def test_async_twin_gives_the_same_sessions(trips):
    sync = trips.search_sessions("Rome trip", user_id="u", k=3, turns=2)
    assert [(f.session_id, [h.id for h in f.hits]) for f in await trips.asearch_sessions(
        "Rome trip", user_id="u", k=3, turns=2)] == [(f.session_id, [h.id for h in f.hits]) for f in sync]


@pytest.mark.parametrize("kwargs", [{"k": 0}, {"k": True}, {"turns": 0}, {"turns": "2"}, {"k": 2 ** 31},
                                    {"filters": {"role": 3}}, {"user_id": ""}])
def test_bad_input_is_a_typed_error(trips, kwargs):
    call = {"user_id": "u", **kwargs}
    with pytest.raises(InvalidInputError):
        trips.search_sessions("Rome trip", **call)
