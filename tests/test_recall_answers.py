"""Answer-type matching: the kind of answer a question asks for (``recall.query.answer_kind``),
whether a turn holds one (``recall.answers``), the ``answer_type`` signal, and a real memory
ranked by it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tiered_memory import MemoryConfig, RetrievalConfig

from tiered_memory.recall.answers import capitalised, holds_answer
from tiered_memory.recall.fusion import LEARNED, signals
from tiered_memory.recall.query import NAME, NUMBER, PERSON, PLACE, plan_query
from tiered_memory.recall.scoring import Candidate


@pytest.mark.parametrize("question, kind", [
    ("How many kids does Melanie have?", NUMBER), ("how much did the bike cost", NUMBER),
    ("How long has Caroline had her friends for?", NUMBER), ("What age did he start?", NUMBER),
    ("Where did Caroline move from 4 years ago?", PLACE), ("In which city does she live?", PLACE),
    ("What country is Caroline's grandma from?", PLACE),
    ("Who supports Caroline?", PERSON), ("Whose birthday did Melanie celebrate?", PERSON),
    ("What is the name of John's dog?", NAME), ("What book did Melanie read?", NAME),
    ("Which movies has he seen?", NAME), ("What was the band called?", NAME),
    ("What does Caroline paint?", None), ("When did she go camping?", None), ("Why did Gina quit?", None),
    ("Is anyone who helps her around?", None),  # "who" not at the start: not a *who* question
])
def test_the_kind_of_answer_a_question_asks_for(question, kind):
    assert plan_query(question).answer == kind


@pytest.mark.parametrize("kind, text, holds", [
    (NUMBER, "We have 3 kids now.", True), (NUMBER, "Two of them are twins.", True),
    (NUMBER, "We went there twice last year", True), (NUMBER, "Plenty of kids here.", False),
    (NUMBER, "Someone said something.", False),
    # a number word as a whole word, any case; a speaker's name is not part of the turn
    (NUMBER, "ONE more time", True), (NUMBER, "one's enough", True), (NUMBER, "twenty-one", True),
    (NUMBER, "the one_two step", False), (NUMBER, "Seven: hi there", False), (NUMBER, "Ann: room ٣", True),
    (PLACE, "I moved from Sweden when I was small.", True), (PLACE, "We camped at the Grand Canyon.", True),
    (PLACE, "We went to the beach.", False),  # no name: not told apart from any other turn
    (PLACE, "Paris is lovely.", False),  # no place preposition
    (PERSON, "My friend Anna helped me a lot.", True), (PERSON, "Thanks, Mel! See you soon.", False),
    (PERSON, "Thanks! It means a lot.", False),  # a sentence's first word is capitalised anyway
    (PERSON, "I'm sure I've seen it, and I'll go.", False),  # I'm, I've, I'll are not names
    (PERSON, "See you on Friday in May.", False),  # weekdays and months are not people
    (PERSON, "Caroline: my mentor Jo helped.", True), (PERSON, "Caroline: thanks, Caroline said.", False),
    (NAME, 'I just read "Becoming Nicole" last week', True), (NAME, "We named him Oscar.", True),
    (NAME, "we named him oscar", False),
])
def test_whether_a_turn_holds_an_answer_of_the_kind(kind, text, holds):
    assert holds_answer(kind, text, participants={"Mel", "Caroline"}) is holds


def test_capitalised_words_inside_sentences_only_with_the_speaker_left_out():
    assert capitalised("Melanie: Yesterday Jo and Sam's dog met us at Central Park.") == {"Jo", "Sam", "Central",
                                                                                         "Park"}
    assert capitalised("") == frozenset()


def cand(i: str, text: str, speaker: str | None = None) -> Candidate:
    return Candidate(id=i, session_id="s", timestamp=0.0, text=text, similarity=0.5, speaker=speaker)


def test_the_answer_type_signal_leaves_out_the_chats_own_people():
    pool = [cand("greets", "Thanks, Maria, that is kind of you.", "John"),
            cand("names", "My coach Dana came along to the race.", "John"),
            cand("asks", "Who came along?", "Maria")]
    got = signals(pool, {}, plan_query("Who came along to John's race?"), dict.fromkeys(["greets", "names", "asks"], 0.5),
                  date_hit={}, speaker_hit={})
    assert got["names"].get("answer_type") == 1.0
    assert "answer_type" not in got["greets"] and "answer_type" not in got["asks"]
    none = signals(pool, {}, plan_query("What did John do?"), dict.fromkeys(["greets", "names", "asks"], 0.5),
                   date_hit={}, speaker_hit={})
    assert not any("answer_type" in v for v in none.values())  # a question of no kind: no signal


def test_the_shipped_table_weighs_the_answer_type():
    assert LEARNED["answer_type"] > 0


@pytest.mark.parametrize("with_answer_type", [True, False])
def test_a_memory_ranks_the_turn_that_holds_the_number_first(make_memory, with_answer_type):
    table = {n: w for n, w in LEARNED.items() if with_answer_type or n != "answer_type"}
    m = make_memory(config=replace(MemoryConfig(), retrieval=RetrievalConfig(fusion_weights=table)))
    m.add_many([{"role": "user", "content": "We have kids! Kids are great."},
                {"role": "assistant", "content": "Tell me more about them."},
                {"role": "user", "content": "We have 3 kids."}], user_id="u", session_id="s")
    hits = m.search("How many kids do we have?", user_id="u", k=3)
    if with_answer_type:  # the shipped table
        assert hits[0].text == "We have 3 kids."
        assert hits[0].explanation["signals"]["answer_type"]["value"] == 1.0
        assert "answer_type" not in hits[1].explanation["signals"]
    else:  # the closer words win without it: the test above would fail
        assert hits[0].text == "We have kids! Kids are great."
