"""Table tests of how hybrid recall scores and fuses its candidate turns
(``tiered_memory.recall.scoring``): base scores, the date, neighbour, reply, speaker, time,
session, recency and length signals, and rank fusion."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from time_support import DAY, utc
from tiered_memory.recall.query import QueryPlan, plan_query
from tiered_memory.recall.scoring import Candidate, TurnWeights, base_scores, rrf_fuse, score_turns, session_shares


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
