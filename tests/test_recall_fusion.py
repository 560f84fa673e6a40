"""The learned turn fusion (recall/fusion.py): the signals as table tests, the weighted
score, the typed errors of a bad table, and a real memory ranking by it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tiered_memory import MemoryConfig, RetrievalConfig
from tiered_memory.errors import ConfigurationError
from tiered_memory.recall.fusion import LEARNED, SIGNALS, check_weights, score_learned, signals, topic_windows
from tiered_memory.recall.coverage import coverage, stems, term_weights
from tiered_memory.recall.query import QueryPlan, plan_query
from tiered_memory.recall.scoring import Candidate, TurnWeights, best_first, score_turns
from tiered_memory.recall.search import turn_weights


def cand(i: str, text: str, *, session: str = "s1", sim: float | None = None, bm25: float | None = None,
         vrank: int | None = None, krank: int | None = None) -> Candidate:
    return Candidate(id=i, session_id=session, timestamp=0.0, text=text, similarity=sim, bm25=bm25,
                     vector_rank=vrank, keyword_rank=krank)


POOL = [
    cand("q", "Do you paint?", sim=0.6, bm25=2.0, vrank=1, krank=2),
    cand("a", "Yes, sunsets mostly.", sim=0.4, bm25=4.0, vrank=2, krank=1),
    cand("o", "The weather was cold today", session="s2", sim=0.2, vrank=3),
    cand("k", "paint sunsets", session="s2", bm25=1.0, krank=3),  # keyword-only: the lowest cosine
]
PREVIOUS = {"a": "q", "o": "gone"}  # "gone" is not in the pool
PLAN = plan_query("what does she paint?")
BASE = {"q": 0.8, "a": 0.9, "o": 0.2, "k": 0.3}


def values() -> dict[str, dict[str, float]]:
    return signals(POOL, PREVIOUS, PLAN, BASE, date_hit={"o": True}, speaker_hit={"a": True})


@pytest.mark.parametrize("turn, name, expected", [
    ("q", "similarity", 0.6), ("k", "similarity", 0.2),  # keyword-only: the pool's lowest cosine
    ("a", "keyword_score", 1.0), ("q", "keyword_score", 0.5), ("o", "keyword_score", 0.0),
    ("o", "date", 1.0), ("q", "date", 0.0), ("a", "speaker", 1.0), ("q", "speaker", 0.0),
    ("a", "previous_base", 0.8), ("o", "previous_base", 0.0),  # a previous turn outside the pool gives nothing
    ("a", "previous_question", 0.8 * 1.0), ("q", "question", 1.0), ("a", "question", 0.0),
    ("q", "next_similarity", 0.4), ("q", "next_keyword", 1.0), ("a", "next_similarity", 0.0),
    ("a", "previous_similarity", 0.6), ("a", "previous_keyword", 0.5),
    ("q", "session_best", 1.0), ("o", "session_best", 0.3 / 0.9), ("k", "session_best", 0.3 / 0.9),
    ("q", "session_best_similarity", 1.0), ("o", "session_best_similarity", 0.2 / 0.6),
    ("q", "vector_rank", 1.0), ("o", "vector_rank", 0.5), ("k", "vector_rank", 0.0),
    ("a", "keyword_rank", 1.0), ("k", "keyword_rank", 0.5),
    ("k", "own_terms", 1.0), ("o", "own_terms", 0.0), ("o", "session_terms", 1.0),  # "paint" is in s2's "k"
    ("a", "exchange_terms", 0.5),  # "paint" only in the question before it: half
    ("a", "time", 0.0),  # not a "when" question
])
def test_signal_values(turn, name, expected):
    assert values()[turn].get(name, 0.0) == pytest.approx(expected)


def test_topic_windows_reduce_the_session_candidates_within_the_window():
    pool = [cand(i, "x") for i in "abce"] + [cand("d", "x", session="s2")]
    places = {"a": 0, "b": 3, "c": 9, "d": 4}  # "e" has none
    base = {"a": 0.1, "b": 0.5, "c": 0.2, "d": 0.9, "e": 0.3}
    bits = {"a": 1, "b": 2, "c": 4, "d": 8, "e": 16}
    assert topic_windows(pool, 5, places, base, bits) == {
        "a": (0.5, 3), "b": (0.5, 3), "c": (0.2, 4), "d": (0.9, 8), "e": (0.3, 16)}
    assert topic_windows(pool, 6, places, base, bits)["c"] == (0.5, 6)  # b is six places before it
    assert topic_windows(pool, 0, places, base, {})["a"] == (0.1, 0)
    assert topic_windows([], 5, {}, {}, {}) == {}


def test_window_signals_read_the_turns_near_it_not_the_whole_session():
    # one session: "pottery" at place 0, "class" at 3, "class" again far away at 20
    pool = [cand("p", "I love pottery"), cand("n", "my class starts monday"), cand("far", "the class was full"),
            cand("other", "pottery class", session="s2")]
    places = {"p": 0, "n": 3, "far": 20, "other": 1}
    base = {"p": 1.0, "n": 0.2, "far": 0.2, "other": 0.5}
    got = signals(pool, {}, plan_query("pottery class?"), base, date_hit={}, speaker_hit={}, places=places)
    assert got["n"]["window_terms"] == pytest.approx(1.0) and got["p"]["window_terms"] == pytest.approx(1.0)
    assert got["far"]["window_terms"] < 1.0  # "pottery" is 20 turns away: the session holds it, the window not
    assert got["far"]["session_terms"] == pytest.approx(1.0)
    assert got["n"]["window_best"] == pytest.approx(1.0) and got["far"]["window_best"] == pytest.approx(0.2)
    assert got["other"]["window_best"] == pytest.approx(0.5)
    # an unknown position: the turn is its own window
    alone = signals(pool, {}, plan_query("pottery class?"), base, date_hit={}, speaker_hit={})
    assert alone["n"]["window_best"] == pytest.approx(0.2) and alone["p"]["window_best"] == pytest.approx(1.0)


def test_length_is_minus_log_of_length_over_the_median():
    got = values()
    lengths = sorted(len(c.text) for c in POOL)
    typical = lengths[len(lengths) // 2]
    for c in POOL:
        assert got[c.id].get("length", 0.0) == pytest.approx(-math.log(len(c.text) / typical))


def test_time_signal_needs_a_when_question_and_a_time_expression():
    pool = [cand("t", "we went last week", sim=0.3), cand("n", "we went", sim=0.3)]
    got = signals(pool, {}, plan_query("When did they go?"), {"t": 0.3, "n": 0.3}, date_hit={}, speaker_hit={})
    assert got["t"]["time"] == 1.0 and "time" not in got["n"]


def test_every_signal_is_named_and_the_table_uses_only_signals():
    assert set().union(*(v.keys() for v in values().values())) <= set(SIGNALS)
    check_weights(LEARNED)
    assert LEARNED["similarity"] == 1.0


def test_only_the_wanted_signals_are_computed():
    got = signals(POOL, PREVIOUS, PLAN, BASE, date_hit={"o": True}, speaker_hit={}, wanted={"similarity", "date"})
    assert got["o"] == {"similarity": 0.2, "date": 1.0} and got["q"] == {"similarity": 0.6}


@pytest.mark.parametrize("table, message", [
    ({"similarity": 1.0, "cosine": 0.5}, "unknown turn signal 'cosine'"),
    ({"similarity": float("nan")}, "finite number"),
    ({"similarity": True}, "finite number"),
    ({"similarity": "1"}, "finite number"),
])
def test_a_bad_table_is_a_configuration_error(table, message):
    with pytest.raises(ConfigurationError, match=message):
        check_weights(table)


def test_score_learned_is_the_weighted_sum_then_the_session_share():
    table = {"similarity": 1.0, "keyword_score": 0.5, "speaker": 2.0}
    w = TurnWeights(fusion=table)
    plan = QueryPlan(text="q", terms=(), names=frozenset({"Jo"}))
    pool = [cand("a", "x", sim=0.5, bm25=2.0), cand("b", "y", sim=0.7),
            Candidate(id="c", session_id="s2", timestamp=0.0, text="z", speaker="Jo", similarity=0.1)]
    got = {s.id: s for s in score_learned(pool, {}, plan, w, table, now=0)}
    assert got["a"].score == pytest.approx(1.0) and got["b"].score == pytest.approx(0.7)
    assert got["c"].score == pytest.approx(2.1)
    assert got["c"].parts["speaker"]["contribution"] == pytest.approx(2.0)
    assert got["a"].parts["keyword"] == {"rank": 0.0, "value": 2.0}  # the raw BM25 beside its weighted share
    assert got["a"].parts["keyword_score"]["contribution"] == pytest.approx(0.5)
    assert [s.id for s in score_learned(pool, {}, plan, w, table, now=0)] == ["c", "a", "b"]
    shared = {s.id: s.score for s in score_learned(pool, {}, plan, w, {**table, "session_share": 0.1}, now=0)}
    # session s1 sums 1.7 of the best scores, s2 2.1: s2 gets the full 0.1
    assert shared["c"] == pytest.approx(2.2) and shared["a"] == pytest.approx(1.0 + 0.1 * 1.7 / 2.1)
    top = score_learned(pool, {}, plan, w, {**table, "session_share": 0.1}, now=0)[0]
    assert top.parts["session"] == {"rank": 0.0, "value": 1.0, "contribution": pytest.approx(0.1)}


def test_only_the_best_explain_carry_their_parts():
    pool = [cand("a", "x", sim=0.5), cand("b", "y", sim=0.7), cand("c", "z", sim=0.1)]
    got = score_learned(pool, {}, PLAN, TurnWeights(), {"similarity": 1.0}, now=0, explain=1)
    assert [s.id for s in got] == ["b", "a", "c"]
    assert got[0].parts["similarity"]["contribution"] == pytest.approx(0.7) and got[1].parts == got[2].parts == {}
    full = score_learned(pool, {}, PLAN, TurnWeights(), {"similarity": 1.0}, now=0)
    assert [(s.id, s.score) for s in full] == [(s.id, s.score) for s in got] and all(s.parts for s in full)


def test_recency_is_added_to_the_learned_score_when_asked():
    pool = [Candidate(id="old", session_id="s", timestamp=0.0, text="x", similarity=0.5),
            Candidate(id="new", session_id="s", timestamp=86400.0 * 30, text="y", similarity=0.5)]
    table = {"similarity": 1.0}
    got = {s.id: s.score for s in score_learned(pool, {}, PLAN, TurnWeights(recency_boost=0.2), table,
                                                now=86400.0 * 30)}
    assert got["new"] == pytest.approx(0.7) and got["old"] == pytest.approx(0.6)


def test_the_hand_scorer_ignores_a_table():
    pool = [cand("a", "x", sim=0.5, bm25=2.0), cand("b", "y", sim=0.7)]
    hand = score_turns(pool, {}, QueryPlan(text="q", terms=()), TurnWeights(session_weight=0, fusion={"keyword_score": 9.0}),
                       now=0)
    assert {s.id: s.score for s in hand} == pytest.approx({"a": 1.0, "b": 0.7})


@pytest.mark.parametrize("retrieval, fusion", [
    (RetrievalConfig(), dict(LEARNED)),
    (RetrievalConfig(turn_fusion="hand"), None),
    (RetrievalConfig(fusion_weights={"similarity": 1.0, "keyword_score": 0.2}), {"similarity": 1.0, "keyword_score": 0.2}),
])
def test_turn_weights_choose_the_table(retrieval, fusion):
    assert turn_weights(retrieval).fusion == fusion


def test_turn_weights_copy_the_callers_table():
    table = {"similarity": 1.0}
    got = turn_weights(RetrievalConfig(fusion_weights=table)).fusion
    assert got == table and got is not table


@pytest.mark.parametrize("retrieval", [RetrievalConfig(turn_fusion="neural"),
                                       RetrievalConfig(fusion_weights={"similarity": 1.0, "bogus": 1.0}),
                                       RetrievalConfig(fusion_weights=[("similarity", 1.0)]),  # type: ignore[arg-type]
                                       # pool sizes
                                       RetrievalConfig(candidates=0),
                                       RetrievalConfig(neighbor_expand=2.5),  # type: ignore[arg-type]
                                       RetrievalConfig(neighbor_wide=-1), RetrievalConfig(neighbor_wide_window=0),
                                       RetrievalConfig(neighbor_wide_window=True),
                                       RetrievalConfig(reactions_last="yes")])  # type: ignore[arg-type]
def test_a_memory_with_a_bad_fusion_or_pool_size_does_not_open(make_memory, retrieval, tmp_path):
    with pytest.raises(ConfigurationError):
        make_memory("bad", config=replace(MemoryConfig(), retrieval=retrieval))
    assert not (tmp_path / "bad").exists()  # failed before any I/O


CHAT = [{"role": "user", "content": "Do you play any instruments?"},
        {"role": "assistant", "content": "Yes, the violin, since I was eight."},
        {"role": "user", "content": "We went hiking in the hills on Sunday."}]


def test_a_memory_ranks_by_the_learned_table_and_explains_it(make_memory):
    m = make_memory()
    m.add_many(CHAT, user_id="u", session_id="s")
    m.add_many([{"role": "user", "content": "My sister plays the cello."}], user_id="other", session_id="s")
    hits = m.search("What instrument does she play?", user_id="u", k=3)
    assert "cello" not in " ".join(h.text for h in hits)  # another user's turn never comes back
    assert hits[0].text.startswith("Yes, the violin")  # the reply, lifted by its question, above the question
    assert "previous_question" in hits[0].explanation["signals"]
    assert "neighbor" not in hits[0].explanation["signals"]


def test_the_hand_fusion_is_still_there(make_memory):
    hand = make_memory("hand", config=replace(MemoryConfig(), retrieval=RetrievalConfig(turn_fusion="hand")))
    hand.add_many(CHAT, user_id="u", session_id="s")
    hits = hand.search("What instrument does she play?", user_id="u", k=3)
    reply = next(h for h in hits if h.text.startswith("Yes, the violin"))
    assert "neighbor" in reply.explanation["signals"] and "previous_question" not in reply.explanation["signals"]


def test_a_topic_window_counts_the_sessions_turns_not_other_writes_between_them(make_memory):
    # between two turns of u's session "s", another user and u's other session write: the rowids
    # of "s" are far apart, its turns are not
    m = make_memory()
    filler = ["We had pasta for dinner.", "The bus was late again.", "It rained all afternoon.",
              "My phone battery died.", "The neighbours got a new car.", "I watched a film.",
              "Work was quiet today.", "The shop closed early."]
    for n, text in enumerate(["I signed up for a pottery class!", *filler]):
        m.add_many([{"role": "user", "content": text}], user_id="u", session_id="s")
        m.add_many([{"role": "user", "content": f"note {n} about trains"}], user_id="u", session_id="s2")
        m.add_many([{"role": "user", "content": f"pottery class {n} is full"}] +
                   [{"role": "user", "content": f"other words {n} {j}"} for j in range(20)],
                   user_id="other", session_id="s")
    hits = {h.text: h for h in m.search("pottery class", user_id="u", k=20)}
    assert not any("is full" in t for t in hits)  # another user's turns never come back
    best = hits["I signed up for a pottery class!"].explanation["signals"]["window_best"]["value"]
    assert best == pytest.approx(1.0)
    near = hits[filler[4]].explanation["signals"]["window_best"]["value"]  # five turns after it
    far = hits[filler[5]].explanation["signals"]["window_best"]["value"]  # six turns after it
    assert near == pytest.approx(1.0) and far < 0.9


@pytest.mark.parametrize("query", ["pottery class monday?",
                                   "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu pottery class",
                                   " ".join(f"word{n}" for n in range(70)) + " pottery class monday zeta eta"])
def test_window_terms_are_the_coverage_of_the_windows_words_however_many_terms(query):
    # the terms are carried as bits, whatever their number
    pool = [cand("p", "I love pottery"), cand("n", "my class starts monday"), cand("far", "zeta and eta")]
    places = {"p": 0, "n": 3, "far": 20}
    plan = plan_query(query)
    got = signals(pool, {}, plan, {"p": 1.0, "n": 0.2, "far": 0.2}, date_hit={}, speaker_hit={}, places=places)
    weights = term_weights(plan.terms, [c.text for c in pool])
    both = stems("I love pottery") | stems("my class starts monday")
    assert got["n"]["window_terms"] == pytest.approx(coverage(both, weights))
    assert got["far"].get("window_terms", 0.0) == pytest.approx(coverage(stems("zeta and eta"), weights))


@pytest.mark.parametrize("scores, order", [
    ({}, []),
    ({"b": 1.0, "a": 1.0, "c": 2.0}, ["c", "a", "b"]),  # ties by id
    ({"x": 0.0, "w": -0.0, "v": -1.5, "u": 3.0}, ["u", "w", "x", "v"]),  # 0.0 and -0.0 tie
    ({"z": -2.0, "y": -1.0}, ["y", "z"]),
])
def test_best_first_orders_by_score_then_id(scores, order):
    # the order score_learned hands out: two sorts keyed in C, the same as the tuple key
    assert best_first(scores) == order == sorted(scores, key=lambda i: (-scores[i], i))
