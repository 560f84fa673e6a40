"""Hybrid recall on one real memory: cases where it finds what plain vector search misses (the
pure decisions' table tests: ``test_recall_query.py``, ``test_recall_scoring.py``; the
benchmark's own parsing: ``test_bench_locomo.py``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest


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
