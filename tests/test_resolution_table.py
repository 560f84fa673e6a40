"""Fact resolution, pure: :func:`~tiered_memory.layers.resolution.decide_resolution`'s table of
candidates, related facts and judgements, and what it decides (the same rules through a store:
``test_semantic.py``, ``test_semantic_resolution.py``)."""

from __future__ import annotations

import pytest

from tiered_memory.layers.resolution import Judgement, decide_resolution, says_all_of, turns_saying
from tiered_memory.records import Fact, FactCandidate


def _fact(fid: str, text: str, *, key: str | None = None, polarity: int = 1, type: str = "fact",
          invalid: bool = False) -> Fact:
    return Fact(id=fid, user_id="u", type=type, text=text, confidence=0.8, key=key, polarity=polarity,
                invalid_at=1.0 if invalid else None)


def _cand(text: str, *, key: str | None = None, polarity: int = 1, type: str = "fact") -> FactCandidate:
    return FactCandidate(type=type, text=text, confidence=0.7, key=key, polarity=polarity)


LISBON = _fact("a", "User lives in Lisbon", key="residence")
SUSHI = _fact("b", "User likes sushi", key="pref:sushi", type="preference")
TEA = _fact("c", "User drinks green tea every morning", type="preference")
SISTER = _fact("d", "User's sister is called Ana", key="rel:sister", type="relationship")
LIKES_TEA = _fact("e", "User likes tea", key="pref:tea", type="preference")
PARIS = _fact("p", "User lives in Paris", key="residence")
SISTER_ANA = _fact("g", "User's sister is Ana", key="rel:sister", type="relationship")


@pytest.mark.parametrize("cand, related, judgement, expected", [
    (_cand("User has a cat"), [], None, ("add", None)),
    (_cand("User lives in Porto", key="residence"), [(LISBON, 0.8)], None, ("invalidate", "a")),
    (_cand("User lives in Lisbon", key="residence"), [(LISBON, 0.99)], None, ("noop", "a")),
    # the same slot said more fully refines it
    (_cand("User lives in Lisbon, Portugal", key="residence"), [(LISBON, 0.9)], None, ("update", "a")),
    (_cand("User lives in Lisbonne", key="residence"), [(LISBON, 0.9)], None, ("invalidate", "a")),  # a new word
    # the same value of the same slot in other words confirms it (a no-op), and said more fully refines it
    (_cand("User moved to Lisbon", key="residence"), [(LISBON, 0.8)], None, ("noop", "a")),
    (_cand("The user now lives in Lisbon.", key="residence"), [(LISBON, 0.9)], None, ("noop", "a")),
    (_cand("User has moved to Lisbon, Portugal", key="residence"), [(LISBON, 0.7)], None, ("update", "a")),
    (_cand("User's sister is called Ana", key="rel:sister", type="relationship"), [(SISTER_ANA, 0.9)], None,
     ("noop", "g")),
    (_cand("User’s sister is Ana", key="rel:sister", type="relationship"), [(SISTER_ANA, 0.99)], None,
     ("noop", "g")),
    (_cand("User's sister is called Maria", key="rel:sister", type="relationship"), [(SISTER_ANA, 0.8)], None,
     ("invalidate", "g")),
    (_cand("User dislikes sushi", key="pref:sushi", polarity=-1, type="preference"), [(SUSHI, 0.7)], None,
     ("invalidate", "b")),
    (_cand("user lives in lisbon."), [(LISBON, 0.9)], None, ("noop", "a")),
    (_cand("User drinks green tea with honey every morning", type="preference"), [(TEA, 0.9)], None,
     ("update", "c")),
    # an update only says the old fact more fully: "every" would be lost (tests/test_semantic_resolution.py)
    (_cand("User drinks green tea each morning", type="preference"), [(TEA, 0.9)], None, ("add", None)),
    (_cand("User drinks coffee", type="preference"), [(TEA, 0.5)], None, ("add", None)),
    (_cand("User drinks green tea each morning", type="fact"), [(TEA, 0.9)], None, ("add", None)),  # other type
    # similarity alone, with other words and no slot: at `same` (0.95) a no-op, at `merge` (0.85) an update
    (_cand("User drinks green tea each morning", type="preference"), [(TEA, 0.95)], None, ("noop", "c")),
    (_cand("User drinks green tea with honey every morning", type="preference"), [(TEA, 0.85)], None,
     ("update", "c")),
    # the other polarity of a similar fact is not a refinement of it
    (_cand("User never drinks green tea in the morning", type="preference", polarity=-1), [(TEA, 0.9)], None,
     ("add", None)),
    # the most similar fact decides, in whatever order the related facts come
    (_cand("User drinks green tea with honey every morning", type="preference"), [(SUSHI, 0.5), (TEA, 0.9)],
     None, ("update", "c")),
    (_cand("User lives in Porto", key="residence"), [(_fact("x", "User lives in Lisbon", key="residence",
                                                             invalid=True), 0.8)], None, ("add", None)),
    # a fact of another slot is another fact, however alike the words: neither refined nor repeated
    (_cand("User's brother is called Ana", key="rel:brother", type="relationship"), [(SISTER, 0.88)], None,
     ("add", None)),
    (_cand("User likes green tea", key="pref:green tea", type="preference"), [(LIKES_TEA, 0.96)], None,
     ("add", None)),
    (_cand("User likes green tea", key="pref:green tea", type="preference"), [(LIKES_TEA, 0.96), (TEA, 0.95)],
     None, ("add", None)),  # a fact of no slot is still compared: it does not say "likes", so no no-op
    # a fact of a slot is changed only by its slot's rules: a similar fact of no slot ("User works in
    # Paris", 0.90 from "User lives in Paris" with MiniLM) is another fact, not a refinement of it,
    # and a fact of no slot is not rewritten into a slot's words it would not hold
    (_cand("User works in Paris"), [(PARIS, 0.90)], None, ("add", None)),
    (_cand("User has a sister called Ana", type="relationship"), [(SISTER_ANA, 0.93)], None, ("add", None)),
    (_cand("User's sister is Ana", key="rel:sister", type="relationship"),
     [(_fact("f", "User has a sister called Ana", type="relationship"), 0.93)], None, ("add", None)),
    (_cand("Ana is User's sister", type="relationship"), [(SISTER_ANA, 0.96)], None, ("noop", "g")),  # the same
    # a fact without a key in a slot's words (no write stores one now: another writer's, a caller's) is in that slot
    (_cand("User lives in Porto", key="residence"), [(_fact("k", "User lives in Lisbon"), 0.8)], None,
     ("invalidate", "k")),
    (_cand("User likes sushi", key="pref:sushi", type="preference"),
     [(_fact("k", "User dislikes sushi", type="preference"), 0.8)], None, ("invalidate", "k")),
    (_cand("User moved to Lisbon", key="residence"), [(_fact("k", "User lives in Lisbon"), 0.8)], None, ("noop", "k")),
    (_cand("User works in Paris"), [(_fact("k", "User lives in Paris"), 0.90)], None, ("add", None)),
    # a valid LLM judgement wins over rules
    (_cand("User moved to Porto"), [(LISBON, 0.6)], Judgement(action="invalidate", target=1), ("invalidate", "a")),
    (_cand("User likes salmon sushi"), [(SUSHI, 0.8)], Judgement(action="update", target=1, text="User likes sushi, "
                                                                 "salmon best"), ("update", "b")),
    (_cand("User has a cat"), [(LISBON, 0.6)], Judgement(action="add"), ("add", None)),
    # a judgement naming a fact that is not there falls back to rules
    (_cand("User lives in Porto", key="residence"), [(LISBON, 0.8)], Judgement(action="noop", target=7),
     ("invalidate", "a")),
])
def test_decide_resolution(cand: FactCandidate, related: list[tuple[Fact, float]], judgement: Judgement | None,
                           expected: tuple[str, str | None]) -> None:
    res = decide_resolution(cand, related, same=0.95, merge=0.85, judgement=judgement)
    assert (res.action, res.target_id) == expected
    assert res.reason
    if judgement is not None and judgement.target != 7:
        assert res.method == "llm"


@pytest.mark.parametrize("cand, related, judgement, expected", [
    # another value: the slot's fact is replaced, as with no judge
    (_cand("User lives in Porto", key="residence"), [(LISBON, 0.8)], Judgement(action="add"), ("invalidate", "a")),
    # the same value in other words: known; said more fully: an update
    (_cand("User moved to Lisbon", key="residence"), [(LISBON, 0.8)], Judgement(action="add"), ("noop", "a")),
    (_cand("User lives in Lisbon, Portugal", key="residence"), [(LISBON, 0.9)], Judgement(action="add"),
     ("update", "a")),
    # a contradiction the judge finds in a fact of another slot would add it beside the slot's own
    (_cand("User lives in Porto", key="residence"), [(SUSHI, 0.8), (LISBON, 0.6)],
     Judgement(action="invalidate", target=1), ("invalidate", "a")),
])
def test_a_judges_new_fact_in_an_occupied_slot_is_resolved_by_the_slots_rule(
        cand: FactCandidate, related: list[tuple[Fact, float]], judgement: Judgement,
        expected: tuple[str, str | None]) -> None:
    """A valid judgement won over the slot rule: the judge's "add" of "User lives in Porto"
    beside "User lives in Lisbon" stored a second valid residence. A judgement that would add
    the candidate as a new fact beside its slot's valid fact is the slot's rule's, and its
    reason says the judge was overruled."""
    res = decide_resolution(cand, related, same=0.95, merge=0.85, judgement=judgement)
    assert (res.action, res.target_id) == expected
    assert res.method == "rules" and f"the judge said {judgement.action}" in res.reason


@pytest.mark.parametrize("cand, related, judgement", [
    (_cand("User likes tea", key="pref:tea", type="preference"), [(LISBON, 0.6)], Judgement(action="add")),
    (_cand("User lives in Porto", key="residence"), [(_fact("x", "User lives in Lisbon", key="residence",
                                                             invalid=True), 0.8)], Judgement(action="add")),
    (_cand("User lives in Porto", key="residence"), [(LISBON, 0.8)], Judgement(action="invalidate", target=1)),
])
def test_a_judgement_that_leaves_one_fact_in_the_slot_stands(cand: FactCandidate, related: list[tuple[Fact, float]],
                                                             judgement: Judgement) -> None:
    res = decide_resolution(cand, related, same=0.95, merge=0.85, judgement=judgement)
    assert (res.action, res.method) == (judgement.action, "llm")


def test_judged_update_uses_merged_text() -> None:
    res = decide_resolution(_cand("User likes salmon sushi"), [(SUSHI, 0.8)], same=0.95, merge=0.85,
                            judgement=Judgement(action="update", target=1, text="User likes sushi, salmon best"))
    assert res.text == "User likes sushi, salmon best"


@pytest.mark.parametrize("said, fact", [
    ("I live in Berlin", "User lives in Berlin"),
    ("I moved to Lisbon last year", "User moves to Lisbon"),
    ("we were hiking in the Alps", "User hikes in the Alps"),
    ("I baked bread", "User bakes bread"),
    ("my sister loves dancing", "User's sister loved dance"),
    # irregular verbs (coverage.IRREGULAR_VERBS): "wrote" was not "written", "agreed" not "agree"
    ("I wrote a novel last year", "User has written a novel"),
    ("we went to Rome in May", "User goes to Rome in May"),
    ("I bought a red bike", "User buys a red bike"),
    ("I agreed to run the marathon", "User agrees to run the marathon"),
    ("I saw Hamilton twice", "User has seen Hamilton twice"),
    ("I was hoping for snow", "User hopes for snow"),
    # be, have, do and get are stop words ("got", "did"): so are their other forms ("getting", "done")
    ("I got married in June", "User is getting married in June"),
    ("I did yoga today", "User has done yoga today"),
])
def test_a_turn_says_a_fact_in_another_form_of_its_verbs(said: str, fact: str) -> None:
    # "lives" stemmed to "liv" and "live" (four letters) stayed whole: the fact said by the
    # user's turn was not found in it
    assert says_all_of(said, fact)
    assert turns_saying(fact, {"t1": "hello there", "t2": said}) == ("t2",)


def test_a_turn_that_does_not_say_the_verb_does_not_say_the_fact() -> None:
    assert not says_all_of("I leave Berlin", "User lives in Berlin")


@pytest.mark.parametrize("said, fact", [
    ("I love it when I win", "User loves wine"),  # "wine" stemmed to "win", "rate" to "rat", "cute" to "cut"
    ("the rate went up", "User has a rat"),
    ("what a cute hat", "User hates cuts"),
    ("I was hopping around", "User was hoping"),
])
def test_a_turn_of_a_word_the_stemmer_merged_with_another_does_not_say_the_fact(said: str, fact: str) -> None:
    assert not says_all_of(said, fact)
