"""Table tests of the query analysis hybrid recall runs on a question: its names, dates, keywords,
question share and speaker (``tiered_memory.recall.query``, with the speaker and date checks the
scoring applies to a turn)."""

from __future__ import annotations

import re

import pytest

from time_support import utc
from tiered_memory.recall.coverage import stem, stems
from tiered_memory.recall.query import (
    MAX_QUERY_TERMS,
    STOPWORDS,
    date_ranges,
    has_time_expression,
    is_temporal_question,
    keywords,
    plan_query,
    proper_names,
    query_terms,
    question_share,
)
from tiered_memory.recall.scoring import in_date_ranges, names_speaker, speaker_of


@pytest.mark.parametrize("text, names", [
    ("When did Caroline go to the LGBTQ support group?", {"Caroline", "LGBTQ"}),
    ("What is Caroline's identity?", {"Caroline"}),
    ("What did Mel and Jon Snow do in May?", {"Mel", "Jon", "Snow"}),
    ("what did she do", set()),
    ("Did I ever mention Lisbon?", {"Lisbon"}),
])
def test_proper_names(text, names):
    assert proper_names(text) == names


@pytest.mark.parametrize("text, expected", [
    ("What movie did Joanna watch on 1 May, 2022?", [(utc(2022, 5, 1), utc(2022, 5, 2))]),
    ("What happened on May 7th, 2023?", [(utc(2023, 5, 7), utc(2023, 5, 8))]),
    ("Where did Joanna travel to in July 2022?", [(utc(2022, 7, 1), utc(2022, 8, 1))]),
    ("What did she do in December 2022?", [(utc(2022, 12, 1), utc(2023, 1, 1))]),
    ("When did Melanie paint a sunrise in 2022?", [(utc(2022, 1, 1), utc(2023, 1, 1))]),
    ("Anything on 31 February 2023?", [(utc(2023, 2, 1), utc(2023, 3, 1))]),  # bad day: the month stays
    ("From 3 May 2023 to June 2023", [(utc(2023, 5, 3), utc(2023, 5, 4)), (utc(2023, 6, 1), utc(2023, 7, 1))]),
    ("When did Caroline go to the support group?", []),
    ("Did 25 people come?", []),
])
def test_date_ranges(text, expected):
    assert list(date_ranges(text)) == expected


@pytest.mark.parametrize("text, temporal", [
    ("When did Caroline go to the LGBTQ support group?", True),
    ("How long has Nate had his turtles?", True),
    ("In which month did they meet?", True),
    ("What year did John move?", True),
    ("What did Caroline research?", False),
    ("Where was Tim when it rained?", False),
])
def test_is_temporal_question(text, temporal):
    assert is_temporal_question(text) is temporal


@pytest.mark.parametrize("text, has", [
    ("Caroline: I went to a support group yesterday.", True),
    ("Nate: I've had them for 3 years now", True),
    ("Jo: We met last Saturday", True),
    ("Tim: It was back in 2019", True),
    ("Caroline: Thanks, that means a lot!", False),
    ("Caroline: Researching adoption agencies.", False),
    # whole words only (a maximal run of word characters), read case-insensitively
    ("We met THIS MORNING", True), ("that  morning", False),  # the pair is one space apart
    ("it's a day-to-day thing", True), ("Mayday!", False), ("in 1999.", True), ("x2022 and 2022s", False),
    ("the weekend_plan", False), ("thismorning", False), ("Busy this evening?", True),
    ("born 2001_x", False), ("2001: a year", True), ("that was it", False), ("that ago", True),
])
def test_has_time_expression(text, has):
    assert has_time_expression(text) is has


@pytest.mark.parametrize("text", [
    "Caroline: I went to the LGBTQ+ support group yesterday!", "snake_case and kebab-case, e-mail@x.org",
    "Straße, café and naïve: Ünïcode words", "it's 3.5 km; 10/10 would go again", "A b c 7 _ __ -", "",
    "Ｆｕｌｌｗｉｄｔｈ text", "tabs\tand\nnew lines", "I I I me my the a 1 2 3 42",
    "Really, their hobbies: painting, cities, being busy; I'm doing x y z",
])
def test_keywords_split_ascii_and_other_text_alike(text):
    # ASCII text takes a quicker path (bytes.translate) than the regex: the same words, in order,
    # and stems (a set path for ASCII text) are the stems of those words
    seen: dict[str, None] = {}
    for tok in re.findall(r"[^\W_]+", text.lower()):
        if tok not in STOPWORDS and (len(tok) > 1 or tok.isdigit()):
            seen.setdefault(tok, None)
    assert keywords(text) == list(seen)
    assert stems(text) == frozenset(map(stem, seen))


@pytest.mark.parametrize("text, share", [
    ("What type of guitar?", 1.0),
    ("That's awesome! What type of guitar? Been playing long?", 2 / 3),
    ("Caroline: I went hiking with my kids.", 0.0),
    ("Love it! [shares a photo: what is this?]", 0.0),  # a bracketed note is no sentence of the turn
    ("hey\nu coming tonight?", 0.5),  # chat: one line, one sentence
    ("is it 3.5?", 1.0),
    ("", 0.0),
    ("[shares a photo]", 0.0),
    ("No question here. None at all!", 0.0),
])
def test_question_share(text, share):
    assert question_share(text) == pytest.approx(share)


@pytest.mark.parametrize("content, metadata, speaker", [
    ("Caroline: hi there", None, "Caroline"),
    ("Jon Snow: winter", {}, "Jon Snow"),
    ("hi: there", None, None),
    ("no speaker here", None, None),
    ("Caroline: hi", {"speaker": "Mel"}, "Mel"),
    ("Note: pay rent", {"name": "Ana"}, "Ana"),
])
def test_speaker_of(content, metadata, speaker):
    assert speaker_of(content, metadata) == speaker


@pytest.mark.parametrize("names, speaker, expected", [
    (frozenset({"Caroline"}), "Caroline", True),
    (frozenset({"Jon"}), "Jon Snow", True),
    (frozenset({"Caroline"}), "Melanie", False),
    (frozenset(), "Melanie", False),
    (frozenset({"Caroline"}), None, False),
])
def test_names_speaker(names, speaker, expected):
    assert names_speaker(names, speaker) is expected


@pytest.mark.parametrize("ts, expected", [
    (utc(2022, 5, 1), True),
    (utc(2022, 4, 26), True),   # 5 days before: within the 7-day lead
    (utc(2022, 4, 20), False),
    (utc(2022, 5, 30), True),   # reported weeks later
    (utc(2022, 6, 5), False),
])
def test_in_date_ranges(ts, expected):
    assert in_date_ranges(ts, [(utc(2022, 5, 1), utc(2022, 5, 2))], 7, 30) is expected


def test_plan_query_bundles_the_analysis():
    plan = plan_query("When did Caroline move in June 2022?")
    assert plan.temporal and plan.names == {"Caroline"}
    assert plan.dates == ((utc(2022, 6, 1), utc(2022, 7, 1)),)
    assert "caroline" in plan.terms and "when" not in plan.terms
    assert plan_query("what is it?").terms == ()


def test_a_query_is_searched_by_its_first_terms_only():
    # each of these is a keyword: every store ORs the terms, and a query of tens of thousands
    # of them was too deep for PostgreSQL and slow for both (test_keyword_scripts.py)
    words = [f"w{i}" for i in range(MAX_QUERY_TERMS + 50)]
    assert plan_query(" ".join(words)).terms == tuple(words[:MAX_QUERY_TERMS])
    assert query_terms(" ".join(words)) == words[:MAX_QUERY_TERMS]
    assert query_terms("the tea, the tea") == ["tea"]
