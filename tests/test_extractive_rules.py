"""The LLM-free fact and decision rules (pure): where a fact's object ends, what is cut off,
and what is asked or supposed rather than said."""

from __future__ import annotations

import pytest

from tiered_memory import MemoryConfig
from tiered_memory.layers.extractive import extract_episode, extract_fact_candidates, find_entities, find_ids
from tiered_memory.types import StoredMessage


def test_rules_skip_facts_whose_object_is_a_pronoun() -> None:
    msgs = [StoredMessage(id="m1", user_id="u", session_id="s", role="user", timestamp=0.0,
                          content="I went hiking in Sintra. I love it. I love hiking.")]
    texts = [c.text for c in extract_fact_candidates(msgs)]
    assert not any(t.lower().endswith(" it") for t in texts), texts
    assert any("hiking" in t for t in texts), texts


@pytest.mark.parametrize("said, fact", [
    ("I love all the yellow leaves, it looks like a painting", "User likes all the yellow leaves"),
    ("I'm an assistant manager- it's like a stepping stone", "User is an assistant manager"),
    ("I'm an expert hiker", "User is an expert hiker"),  # the article said, not always "a"
    ("I'm An Engineer at heart", "User is an Engineer at heart"),
    ("I'm a nurse at the clinic", "User is a nurse at the clinic"),
    ("I like the structure of the language, it's much easier than Spanish", "User likes the structure of the language"),
    ("I love road trips with friends and I hate traffic", "User likes road trips with friends"),
    ("I love Trader Joe's", "User likes Trader Joe's"),  # a possessive ends a name only where a person goes
])
def test_rules_end_a_fact_where_its_clause_ends(said: str, fact: str) -> None:
    msgs = [StoredMessage(id="m1", user_id="u", session_id="s", role="user", timestamp=0.0, content=said)]
    assert fact in [c.text for c in extract_fact_candidates(msgs)]


@pytest.mark.parametrize("said", [
    "I'm a big part of it!",  # what "it" is, a rule cannot tell
    "I'm a huge fan of it, that's why I go",
    "My daughter is Sara's age",
    "I like the thought of",
])
def test_rules_skip_a_fact_cut_off_mid_phrase(said: str) -> None:
    msgs = [StoredMessage(id="m1", user_id="u", session_id="s", role="user", timestamp=0.0, content=said)]
    assert [c.text for c in extract_fact_candidates(msgs)] == []


ASKED_OR_UNDECIDED = [
    "Do I like jazz?",  # the user asks: no fact said
    "Would I enjoy hiking in winter?",
    "Have we decided on the venue?",
    "If I live in Canada, do I pay tax there?",
    "We decided nothing yet.",
    "No decision yet on the caterer.",
    "I'm not sure whether we agreed on Friday.",
    "Let's go with the Lisbon venue?",  # a proposal asked, not a decision made
    "So we agreed on Friday?",
    "What decision should we make about the venue?",  # the word alone decides nothing
    "That is a tough decision.",
    "We haven't made a decision yet.",
]


@pytest.mark.parametrize("said", ASKED_OR_UNDECIDED)
def test_rules_take_no_fact_or_decision_from_a_question_or_an_undecided(said: str) -> None:
    msgs = [StoredMessage(id="m1", user_id="u", session_id="s", role="user", timestamp=0.0, content=said)]
    assert [c.text for c in extract_fact_candidates(msgs)] == []
    ep = extract_episode(msgs)
    assert ep.decisions == [] and ep.key_facts == []


def test_rules_still_take_a_fact_said_before_a_question_and_a_decision_made() -> None:
    msgs = [StoredMessage(id="m1", user_id="u", session_id="s", role="user", timestamp=0.0,
                          content="I love jazz, do you? We decided to book the Lisbon venue. We decided not to fly.")]
    assert [c.text for c in extract_fact_candidates(msgs)] == [
        "User likes jazz", "Decided: book the Lisbon venue", "Decided: not to fly"]
    assert extract_episode(msgs).decisions == ["We decided to book the Lisbon venue.", "We decided not to fly."]


def test_a_decision_stated_in_other_words_is_still_one() -> None:
    msgs = [StoredMessage(id="m1", user_id="u", session_id="s", role="user", timestamp=0.0,
                          content="Decision: we book the Lisbon venue. The decision was to fly on Friday. "
                                  "We made the decision to hire Ana.")]
    assert extract_episode(msgs).decisions == [
        "Decision: we book the Lisbon venue.", "The decision was to fly on Friday.", "We made the decision to hire Ana."]


def test_a_decision_said_again_is_listed_once() -> None:
    """The assistant confirming a decision in the user's words (or the user repeating it) listed
    it as often as it was said, each copy rendered into the context again."""
    said = "We decided to book the Lisbon venue."
    msgs = [StoredMessage(id=f"m{n}", user_id="u", session_id="s", role=role, timestamp=float(n), content=text)
            for n, (role, text) in enumerate([("user", said), ("assistant", "Great. " + said), ("user", said)])]
    assert extract_episode(msgs).decisions == [said]


LONGEST = MemoryConfig().max_content_chars  # what one message may hold


@pytest.mark.timeout(300)  # a hang guard: the quadratic ones took some half an hour each
@pytest.mark.parametrize("text, entities, ids", [
    # a run of spaces after a name: split every way between a name's two runs of space
    ("Abc" + " " * LONGEST + "x", ["Abc"], []),
    ("Abc" + " \n" * (LONGEST // 2) + "x", ["Abc"], []),
    # a run an address may be made of, with no "@": an address tried at each of its characters
    ("A" * LONGEST, [], []),
    ("a-" * (LONGEST // 2) + " ops@example.com", [], ["ops@example.com"]),
    ("x." * (LONGEST // 2) + "y+z@example.com is it", [], ["x." * (LONGEST // 2) + "y+z@example.com"]),
])
def test_the_rules_read_a_long_run_in_a_message_in_time_linear_in_it(text: str, entities: list[str],
                                                                      ids: list[str]) -> None:
    """end_session reads every turn of a session through these, with the session's lock held:
    two patterns took time quadratic in a run of spaces or of an address's characters, so a
    message of the size add takes kept end_session (and consolidate) busy for half an hour."""
    assert find_entities(text) == entities and find_ids(text) == ids
    episode = extract_episode([StoredMessage(id="m1", user_id="u", session_id="s", role="user", content=text,
                                             timestamp=1.0, seq=1)])
    points = [*episode.entities, *episode.decisions, *episode.open_questions, *episode.key_facts]
    assert 0 < len(episode.summary) <= 300 and all(len(p) <= 300 for p in points)
