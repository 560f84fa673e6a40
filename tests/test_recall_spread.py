"""Session spread: a question that asks for several things gives the last places of its
hits to sessions not yet among them. Pure parts, then a real memory (SQLite, Chroma, the
bundled model)."""

from __future__ import annotations

import pytest

from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.config import RetrievalConfig
from tiered_memory.errors import ConfigurationError
from tiered_memory.recall.query import is_listing_question, plan_query
from tiered_memory.recall.spread import DEPTH, spread_sessions, spread_slots


@pytest.mark.parametrize("text, listing", [
    ("What books has Melanie read?", True),
    ("Where has Melanie camped?", True),
    ("What activities does Melanie partake in?", True),
    ("How many times has Jon gone to the beach?", True),
    ("What kinds of art does Caroline make?", True),
    ("What subject have Caroline and Melanie both painted?", True),
    ("What are Maria's dogs' names?", True),
    ("What are some changes Caroline has faced?", True),
    ("What did Caroline research?", False),
    ("What is Caroline's relationship status?", False),
    ("Why did Gina start her clothing store?", False),
    ("What kind of pot did Mel make?", False),  # one kind
    ("When has Melanie been camping?", False),  # a point in time
    ("How long has Nate had his turtles?", False),
    ("What class did Jon take?", False),  # "class" is not a plural
])
def test_is_listing_question(text, listing):
    assert is_listing_question(text) is listing
    assert plan_query(text).listing is listing


@pytest.mark.parametrize("sessions, k, slots, expected", [
    ("AAAAAAAAAAAB", 10, 2, [0, 1, 2, 3, 4, 5, 6, 7, 11, 8]),  # one unseen session: the next place by rank
    ("AAAAAAAAAABCD", 10, 2, [0, 1, 2, 3, 4, 5, 6, 7, 10, 11]),
    ("AAAAAAAABBCC", 10, 2, [0, 1, 2, 3, 4, 5, 6, 7, 8, 10]),  # B is seen once the head holds it
    ("AAAAAAAAAAAA", 10, 2, list(range(10))),  # nothing to spread to: rank order
    ("AAB", 10, 2, [0, 1, 2]),  # fewer hits than k
    ("ABCDE", 3, 0, [0, 1, 2]),
    ("AAAAB", 4, 4, [0, 4, 1, 2]),  # every place spread: the first hit still leads
])
def test_spread_sessions(sessions, k, slots, expected):
    assert spread_sessions(list(sessions), k, slots) == expected


def test_spread_looks_only_within_depth():
    sessions = ["A"] * (DEPTH * 5) + ["B"]
    assert spread_sessions(sessions, 5, 1) == [0, 1, 2, 3, 4]


def test_spread_slots_share_of_k():
    config = RetrievalConfig()
    assert spread_slots(config, 10, listing=True) == 2 and spread_slots(config, 10, listing=False) == 0
    assert spread_slots(config, 40, listing=True) == 8 and spread_slots(config, 3, listing=True) == 1
    everywhere = RetrievalConfig(spread=0.3, listing_spread=0.1)
    assert spread_slots(everywhere, 10, listing=False) == 3 and spread_slots(everywhere, 10, listing=True) == 3


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.2", True, None])
def test_bad_spread_fails_when_the_memory_opens(make_memory, bad):
    for name in ("spread", "listing_spread"):
        with pytest.raises(ConfigurationError, match=name):
            make_memory(f"bad-{name}", config=MemoryConfig(retrieval=RetrievalConfig(**{name: bad})))


# ---- a real memory ------------------------------------------------------------------
BOOK_SESSION = [
    "I finished reading Dune this week, the desert planet and the spice books are amazing.",
    "Reading the Dune books made me want to read more science fiction books.",
    "My book club is reading the second Dune book next, I have read half of it already.",
    "I read the Dune book on the train every morning, best book I have read.",
    "The Dune books have such a long reading list of sequels to read.",
    "I read that book review about the Dune books and agreed with most of it.",
    "Reading books about desert worlds like Dune is my favourite thing.",
    "I have read every Dune book twice now, the books never get old.",
    "The audiobook of Dune is good but I prefer to read the paper books.",
    "I lent my Dune books to my sister so she can read them too.",
    "My reading goal is fifty books this year, Dune books count for six.",
    "I read a Dune book in one night once, I could not stop reading.",
]
OTHER_BOOKS = {
    "garden": "I read a book about growing tomatoes, Charlotte's Web was on the shelf beside it.",
    "trip": "On the plane I read the book Pride and Prejudice, a lovely read.",
}
FILLER = ["The weather was rainy all day.", "We had pasta for dinner.", "The bus was late again.",
          "My knee hurts after the run.", "The cat knocked over a plant."]


@pytest.fixture
def books(make_memory):
    def make(**retrieval: object) -> TieredMemory:
        name = "books" + "".join(f"-{key}-{value}" for key, value in sorted(retrieval.items()))
        m = make_memory(name, config=MemoryConfig(retrieval=RetrievalConfig(**retrieval)))
        m.add_many([{"role": "user", "content": t} for t in BOOK_SESSION], session_id="dune", user_id="u")
        for session, text in OTHER_BOOKS.items():
            m.add_many([{"role": "user", "content": t} for t in [text, *FILLER]], session_id=session, user_id="u")
        m.add_many([{"role": "user", "content": "I read Dune books too, my favourite."}], session_id="dune",
                   user_id="other")
        return m
    return make


def sessions_of(hits):
    return [h.session_id for h in hits]


def test_a_listing_question_reaches_the_sessions_one_session_would_crowd_out(books):
    question = "What books has Mel read?"
    assert is_listing_question(question)
    plain = books(listing_spread=0.0).search(question, user_id="u", k=10)
    assert set(sessions_of(plain)) == {"dune"}  # without the spread, one session fills the ten
    spread = books().search(question, user_id="u", k=10)
    assert len(spread) == 10 and sessions_of(spread)[:8] == ["dune"] * 8
    assert [h.text for h in spread[:8]] == [h.text for h in plain[:8]]  # the head keeps its ranking
    assert set(sessions_of(spread[8:])) == {"garden", "trip"}
    assert {h.text for h in spread[8:]} == set(OTHER_BOOKS.values())
    assert all("spread" in h.explanation for h in spread[8:])
    assert not any("spread" in h.explanation for h in spread[:8])


def test_other_questions_are_ranked_as_before(books):
    question = "Which Dune book is the club reading next?"
    assert not is_listing_question(question)
    assert [h.text for h in books().search(question, user_id="u", k=10)] == \
        [h.text for h in books(listing_spread=0.0).search(question, user_id="u", k=10)]
    spread_all = books(spread=0.2).search(question, user_id="u", k=10)
    assert set(sessions_of(spread_all[8:])) == {"garden", "trip"}


def test_spread_within_one_session_with_small_k_and_filters(books):
    m = books()
    question = "What books has Mel read?"
    one = m.search(question, user_id="u", session_id="dune", k=10)
    assert len(one) == 10 and set(sessions_of(one)) == {"dune"}
    few = m.search(question, user_id="u", k=4)
    assert len(few) == 4 and sessions_of(few)[:3] == ["dune"] * 3 and few[3].session_id != "dune"  # 1 place
    # k=3 looks within the best 12 hits only, all of them the Dune session's
    assert sessions_of(m.search(question, user_id="u", k=3)) == ["dune"] * 3
    dated = m.search(question, user_id="u", k=10, filters={"role": "user"})
    assert set(sessions_of(dated[8:])) == {"garden", "trip"}
    theirs = m.search(question, user_id="other", k=10)  # another user's search spreads over their own only
    assert [h.text for h in theirs] == ["I read Dune books too, my favourite."]
