"""Table tests of the pure retrieval decisions, plus real-memory cases where hybrid recall
finds what plain vector search misses (the benchmark's own parsing: ``test_bench_locomo.py``)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from tiered_memory.recall.coverage import stem, stems
from tiered_memory.recall.query import (
    QueryPlan,
    date_ranges,
    has_time_expression,
    is_temporal_question,
    keywords,
    plan_query,
    proper_names,
    STOPWORDS,
    question_share,
)
from tiered_memory.recall.scoring import (
    Candidate,
    TurnWeights,
    base_scores,
    in_date_ranges,
    names_speaker,
    rrf_fuse,
    score_turns,
    session_shares,
    speaker_of,
)

DAY = 86400.0


def utc(y: int, m: int, d: int) -> float:
    return datetime(y, m, d, tzinfo=timezone.utc).timestamp()


# ---- query analysis ------------------------------------------------------------
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


# ---- scoring --------------------------------------------------------------------
def cand(i: str, *, sim: float | None = None, bm25: float | None = None, session: str = "s1",
         ts: float = 0.0, text: str = "x", speaker: str | None = None) -> Candidate:
    return Candidate(id=i, session_id=session, timestamp=ts, text=text, speaker=speaker,
                     similarity=sim, bm25=bm25)


PLAIN = TurnWeights(neighbor_weight=0, reply_weight=0, question_penalty=0, speaker_boost=0, time_boost=0,
                    date_boost=0, session_weight=0, recency_boost=0)
EMPTY = QueryPlan(text="q", terms=())


@pytest.mark.parametrize("cands, expected", [
    # cosine + 0.5 x bm25 / best bm25
    ([cand("a", sim=0.5, bm25=4.0), cand("b", sim=0.4, bm25=2.0)], {"a": 1.0, "b": 0.65}),
    # not a vector candidate: the lowest similarity seen
    ([cand("a", sim=0.5), cand("b", sim=0.3), cand("c", bm25=1.0)], {"a": 0.5, "b": 0.3, "c": 0.8}),
    # no vector candidates at all, no bm25
    ([cand("a"), cand("b", bm25=0.0)], {"a": 0.0, "b": 0.0}),
])
def test_base_scores(cands, expected):
    got = base_scores(cands, EMPTY, PLAIN)
    assert got == pytest.approx(expected)


def test_date_boost_goes_to_turns_dated_near_a_named_date():
    plan = plan_query("What did Jo do in May 2022?")
    w = TurnWeights(date_boost=0.2)
    got = base_scores([cand("in", sim=0.3, ts=utc(2022, 5, 20)), cand("out", sim=0.3, ts=utc(2021, 5, 20))],
                      plan, w)
    assert got["in"] == pytest.approx(0.5) and got["out"] == pytest.approx(0.3)


def test_neighbor_lifts_the_reply_to_a_matching_question():
    cands = [cand("question", sim=0.6), cand("reply", sim=0.3), cand("other", sim=0.4)]
    w = TurnWeights(neighbor_weight=0.3, speaker_boost=0, time_boost=0, session_weight=0)
    order = [s.id for s in score_turns(cands, {"reply": "question"}, EMPTY, w, now=0)]
    assert order == ["question", "reply", "other"]
    without = [s.id for s in score_turns(cands, {}, EMPTY, w, now=0)]
    assert without == ["question", "other", "reply"]


@pytest.mark.parametrize("reply_weight, question_penalty, order", [
    (0.0, 0.0, ["question", "reply", "other"]),  # the question echoes the query: 0.7 against 0.3 + 0.3 x 0.7
    (0.3, 0.0, ["reply", "question", "other"]),  # its reply gains 0.6 x 0.7: 0.72 against 0.7
    (0.0, 0.25, ["reply", "question", "other"]),  # the question loses 0.25: 0.45 against 0.51
    (0.0, 0.15, ["question", "reply", "other"]),  # 0.55 against 0.51
])
def test_a_question_passes_its_match_to_its_reply(reply_weight, question_penalty, order):
    cands = [cand("question", sim=0.7, text="What instruments do you play?"),
             cand("reply", sim=0.3, text="I play clarinet. Started young."),
             cand("other", sim=0.2, text="Nice weather today.")]
    w = TurnWeights(neighbor_weight=0.3, reply_weight=reply_weight, question_penalty=question_penalty,
                    speaker_boost=0, time_boost=0, session_weight=0, session_coverage_weight=0)
    scored = score_turns(cands, {"reply": "question", "other": "reply"}, EMPTY, w, now=0)
    assert [s.id for s in scored] == order
    question = next(s for s in scored if s.id == "question")
    assert ("question" in question.parts) is bool(question_penalty)
    reply = next(s for s in scored if s.id == "reply")
    assert reply.parts["neighbor"]["contribution"] == pytest.approx((0.3 + reply_weight) * 0.7)
    other = next(s for s in scored if s.id == "other")  # the reply before it is no question
    assert other.parts["neighbor"]["contribution"] == pytest.approx(0.3 * 0.3)


@pytest.mark.parametrize("query, text, speaker, boosted", [
    ("What did Caroline paint?", "Caroline: a lake", "Caroline", {"speaker"}),
    ("What did Melanie paint?", "Caroline: a lake", "Caroline", set()),
    ("When did Caroline paint?", "Caroline: a lake last week", "Caroline", {"speaker", "time"}),
    ("What did Caroline paint?", "Caroline: a lake last week", "Caroline", {"speaker"}),
])
def test_speaker_and_time_boosts(query, text, speaker, boosted):
    w = TurnWeights(neighbor_weight=0, session_weight=0, session_coverage_weight=0, speaker_boost=0.1, time_boost=0.1)
    [s] = score_turns([cand("a", sim=0.5, text=text, speaker=speaker)], {}, plan_query(query), w, now=0)
    assert {p for p in s.parts if p in {"speaker", "time"}} == boosted
    assert s.score == pytest.approx(0.5 + 0.1 * len(boosted))


def test_session_shares_and_weight():
    shares = session_shares({"a": 0.8, "b": 0.2, "c": 0.6, "d": 0.1}, {"a": "s1", "b": "s1", "c": "s2", "d": "s3"}, 3)
    assert shares == pytest.approx({"s1": 1.0, "s2": 0.6})
    cands = [cand("a", sim=0.5, session="s1"), cand("b", sim=0.45, session="s1"),
             cand("c", sim=0.46, session="s2")]
    w = TurnWeights(neighbor_weight=0, speaker_boost=0, time_boost=0, session_weight=0.1, session_top=3)
    order = [s.id for s in score_turns(cands, {}, EMPTY, w, now=0)]
    assert order == ["a", "b", "c"]  # b's session holds the best turn


def test_recency_boost_and_deterministic_ties():
    w = TurnWeights(neighbor_weight=0, session_weight=0, recency_boost=0.1, recency_half_life_days=30)
    cands = [cand("old", sim=0.5, ts=0.0), cand("new", sim=0.5, ts=100 * DAY)]
    assert [s.id for s in score_turns(cands, {}, EMPTY, w, now=100 * DAY)] == ["new", "old"]
    tie = [cand("b", sim=0.5), cand("a", sim=0.5)]
    assert [s.id for s in score_turns(tie, {}, EMPTY, PLAIN, now=0)] == ["a", "b"]


def test_length_weight_prefers_the_shorter_of_equal_matches():
    """``length_weight`` subtracts weight x log(length / the candidates' median length): among
    equal similarities the shorter turn comes first, the median one keeps its score."""
    w = replace(PLAIN, session_coverage_weight=0, exchange_weight=0, session_best_weight=0, length_weight=0.1)
    cands = [cand("long", sim=0.5, text="x" * 80), cand("mid", sim=0.5, text="x" * 20),
             cand("short", sim=0.5, text="x" * 5)]
    scored = score_turns(cands, {}, EMPTY, w, now=0)
    assert [s.id for s in scored] == ["short", "mid", "long"]
    got = {s.id: s.score for s in scored}
    assert got == pytest.approx({"short": 0.5 + 0.1 * math.log(4), "mid": 0.5, "long": 0.5 - 0.1 * math.log(4)})
    assert [s.parts["length"]["contribution"] for s in scored] == pytest.approx(
        [0.1 * math.log(4), 0.0, -0.1 * math.log(4)])


def test_rrf_fuse_still_weights_ranks():
    fused = rrf_fuse({"vector": ["a", "b"], "keyword": ["b"]}, {"vector": 1.0, "keyword": 1.0}, k=60)
    assert [f.id for f in fused] == ["b", "a"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)


# ---- one real memory ------------------------------------------------------------------
RESEARCH_CHAT = [  # (speaker, text): the reply at 2 shares no word with "What did Caroline research?"
    ("Caroline", "I studied painting techniques for my art class."),
    ("Melanie", "What are you researching these days, Caroline?"),
    ("Caroline", "Adoption agencies, mostly."),
    ("Caroline", "I read about hiking trails near the lake."),
    ("Melanie", "Cool! My kids love the beach, we went camping last week."),
    ("Caroline", "I looked into the history of the city museum for fun."),
    ("Melanie", "I ran a charity race for mental health on Sunday."),
    ("Caroline", "I'm studying psychology and counseling, it's a lot of reading."),
    ("Caroline", "I learned a lot about healthy recipes, dinner was great."),
]


def test_hybrid_finds_the_reply_plain_vector_search_misses(memory):
    """The answer ("Caroline: Adoption agencies, mostly.") shares no word with the
    question; its meaning lives in the turn before it. The hybrid search ranks it first;
    plain cosine does not (4th with MiniLM, 2nd with the static default)."""
    base = datetime(2023, 5, 8, tzinfo=timezone.utc).timestamp()
    ids = memory.add_many([{"role": "user", "content": f"{s}: {t}", "timestamp": base} for s, t in RESEARCH_CHAT],
                          user_id="u", session_id="s1")
    answer, query = ids[2], "What did Caroline research?"
    hits = memory.search(query, user_id="u", k=1)
    assert [h.id for h in hits] == [answer]
    signals = hits[0].explanation["signals"]
    assert {"vector", "previous_question", "speaker"} <= set(signals)
    # the seed recipe: nearest neighbours by cosine alone
    from tiered_memory.embedding import embed_query

    plain = memory.index.query(embed_query(memory.embedder, query)[None, :], user_id="u", k=1, layers=["turn"])[0]
    assert answer not in [i for i, _ in plain]


def test_a_reply_after_reactions_is_found_by_the_question_it_answers(memory):
    """Real chat puts reactions between a question and its reply ("omg", "hahaha"). The reply
    ("Adoption agencies, mostly.") shares no word with the query; it is found through the
    question it answers, two reactions back, and the reactions themselves are not."""
    base = datetime(2023, 5, 8, tzinfo=timezone.utc).timestamp()
    turns = [*RESEARCH_CHAT[:2], ("Caroline", "hahaha"), ("Caroline", "omg ok"), *RESEARCH_CHAT[2:]]
    # a big store, so that the reply and the question are fetched as neighbours, not all at once
    filler = [{"role": "user", "content": f"Bo: note {n} about the {w} and the {v}", "timestamp": base}
              for n, (w, v) in enumerate((w, v) for w in ("garden", "kitchen", "office", "garage", "attic")
                                         for v in ("weather", "traffic", "market", "music", "dinner"))]
    memory.add_many(filler * 8, user_id="u", session_id="s0")
    ids = memory.add_many([{"role": "user", "content": f"{s}: {t}", "timestamp": base} for s, t in turns],
                          user_id="u", session_id="s1")
    hits = memory.search("What did Caroline research?", user_id="u", k=3)
    assert hits[0].id == ids[4]
    assert hits[0].explanation["signals"]["previous_question"]["value"] > 0
    ten = memory.search("What did Caroline research?", user_id="u", k=10)
    assert not {ids[2], ids[3]} & {h.id for h in ten}
    assert all(h.explanation["signals"] for h in ten)  # the ones moved up past reactions are explained too


def test_the_answer_outranks_the_question_that_echoes_the_query(make_memory):
    """A question in a chat repeats the words of a later query about it ("You play any
    instruments?"); the fact is in the reply. By default the reply comes first; with the
    question signals off (the hand fusion's; or the learned table's, with the speaker's name,
    which picks the one who replied), the question does."""
    from dataclasses import replace

    from tiered_memory import MemoryConfig, RetrievalConfig
    from tiered_memory.recall.fusion import LEARNED

    turns = [
        "Caroline: You play any instruments, Melanie?",
        "Melanie: Yeah, clarinet, since I was young. It helps me relax.",
        "Caroline: I went to a pottery class with friends last weekend.",
        "Melanie: The kids loved the beach trip, we go once or twice a year.",
        "Caroline: My counseling course starts next month.",
    ]
    hand = replace(MemoryConfig().retrieval, turn_fusion="hand")
    hand_off = replace(hand, reply_weight=0.0, question_penalty=0.0)
    learned_off = replace(MemoryConfig().retrieval, fusion_weights={
        n: w for n, w in LEARNED.items() if n not in ("previous_question", "question", "previous_keyword", "speaker")})
    for name, config, first, penalised in (
            ("on", MemoryConfig(), 1, True), ("hand", replace(MemoryConfig(), retrieval=hand), 1, True),
            ("hand-off", replace(MemoryConfig(), retrieval=hand_off), 0, False),
            ("learned-off", replace(MemoryConfig(), retrieval=learned_off), 0, False)):
        memory = make_memory(name, config=config)
        ids = memory.add_many([{"role": "user", "content": t} for t in turns], user_id="u", session_id="s1")
        hits = memory.search("What instruments does Melanie play?", user_id="u", k=3)
        assert hits[0].id == ids[first]
        question = next(h for h in hits if h.id == ids[0])
        assert ("question" in question.explanation["signals"]) is penalised


TRIP = ["We finally booked the trip to Lisbon!", "Amazing, you have wanted that for years.",
        "My cousin says the food there is great.", "The second week of June, right after my exams."]
ELSEWHERE = ["The school trip went to the science museum.", "My trip to the dentist took ages.",
             "A road trip along the coast sounds fun.", "Lisbon has lovely old trams.",
             "The business trip to Berlin was tiring.", "We might trip over these cables.",
             "A day trip to the lake would be nice.", "Porto and Lisbon are both in Portugal.",
             "The camping trip got rained out.", "Her trip to Rome was short.", "My birthday is in June.",
             "Exams start next week.", "When is the concert again?", "The festival is the first week of July.",
             "When do you leave for the airport?", "School ends in the middle of June.",
             "The wedding is on a Saturday in May."]


@pytest.mark.parametrize("window", [1, 3])
def test_the_best_matches_bring_the_turns_of_their_topic(make_memory, window):
    """In a long history the pool holds a small share of the user's turns, and the answer may be
    a few turns after the best match with none of the query's words ("The second week of June").
    The best candidates bring the turns within ``neighbor_wide_window`` of them into the pool
    (3 by default); with 1, only the turn either side, the answer is never a candidate."""
    from dataclasses import replace

    from tiered_memory import MemoryConfig, RetrievalConfig
    from tiered_memory.recall.search import gather_pool

    # a pool of 6 vector and 6 keyword candidates stands in for a long history's 150
    config = RetrievalConfig(candidates=4, neighbor_wide_window=window)
    memory = make_memory(config=replace(MemoryConfig(), retrieval=config))
    for n, text in enumerate(ELSEWHERE):
        memory.add_many([{"role": "user", "content": text}, {"role": "assistant", "content": f"ok {n}"}],
                        user_id="u", session_id=f"other{n}")
    ids = memory.add_many([{"role": "user" if n % 2 == 0 else "assistant", "content": t} for n, t in enumerate(TRIP)],
                          user_id="u", session_id="trip")
    query = "When is the Lisbon trip?"
    pool = gather_pool(store=memory.store, index=memory.index, embedder=memory.embedder, config=config,
                       query=query, user_id="u", k=3)
    assert pool is not None
    candidates = {c.id for c in pool.candidates}
    hits = [h.id for h in memory.search(query, user_id="u", k=3)]
    assert ids[0] in candidates and ids[0] in hits  # the best match, either way
    assert (ids[3] in candidates) is (window == 3)
    assert (ids[3] in hits) is (window == 3)
