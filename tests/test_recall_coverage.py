"""Table tests of recall v2's pure parts: keyword coverage of a turn's exchange and its
session, the session's best turn, the real-chat development set's transform and the
context-recall counting of bench/context_recall.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered_memory.recall.coverage import (
    FORMS_UP_TO, TermsHeld, coverage, exchange_coverage, fact_stem, fact_stems, session_coverage, stem, stems,
    term_weights,
)
from tiered_memory.recall.query import STOPWORDS, QueryPlan, plan_query
from tiered_memory.recall.scoring import Candidate, TurnWeights, score_turns, session_best

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/ lives at the root
from bench.context_recall import Measured, Source, carries, reached, summarize_context  # noqa: E402
from bench.locomo_data import Conversation, Question, Turn  # noqa: E402
from bench.realchat import (  # noqa: E402
    REACTIONS, drop_dates, informal, realchat, realchat_noisy, realchat_turns, split_message, strip_speaker)


@pytest.mark.parametrize("word, expected", [
    ("painting", "paint"), ("painted", "paint"), ("paints", "paint"), ("hobbies", "hobby"),
    ("dogs", "dogs"),  # four letters or fewer stay whole
    ("sing", "sing"), ("thing", "thing"),  # the stem would be too short
    ("pottery", "pottery"),
])
def test_stem(word, expected):
    assert stem(word) == expected


def test_term_weights_favour_rare_terms():
    texts = ["Caroline: I paint", "Caroline: hi", "Caroline: a pottery class"]
    w = term_weights(["caroline", "pottery"], texts)
    assert w["pottery"] > w["caroline"] > 0
    assert w["pottery"] == pytest.approx(math.log(1 + 3 / 2))
    assert term_weights([], texts) == {}


@pytest.mark.parametrize("terms, text, expected", [
    (["paint"], "Painting, PAINTED and paints!", {"paint"}),
    (["hobby"], "my hobbies", {"hobby"}),  # the -ies form of a term that ends in y
    (["hobby"], "hobb hobbyist", set()),  # starts like it, stems to something else
    (["dogs"], "dog", set()),  # four letters or fewer stay whole
    (["bus"], "buss", set()),  # four letters: stays whole
    (["bus"], "buses", {"bus"}),
    (["does"], "does it", set()),  # a stopword is no term of a text
    (["x"], "x y z", set()),  # nor is a single letter
    (["5"], "5 apples", {"5"}),  # a single digit is
    (["mail"], "e-mail e_mail", {"mail"}),  # "-" and "_" split words
    (["café"], "un café crème", {"café"}),  # not ASCII: every word stemmed
    ([], "anything", set()),
])
def test_terms_held(terms, text, expected):
    assert TermsHeld(terms)(text) == expected == stems(text) & set(terms)


def test_terms_held_of_a_long_query_is_the_same():
    """Over FORMS_UP_TO terms (a long message as a query) the text's stems are intersected."""
    terms = {stem(w) for w in [f"word{n}" for n in range(FORMS_UP_TO)] + ["paint", "hobby"]}
    assert len(terms) > FORMS_UP_TO
    text = "Painting my hobbies, word7 and word70"
    assert TermsHeld(terms)(text) == {"paint", "hobby", "word7"} == stems(text) & terms


_WORDS = ["paint", "painting", "paints", "hobby", "hobbies", "study", "studies", "studying", "the", "does",
          "a", "x", "5", "dog", "dogs", "bus", "buses", "happily", "happy", "sing", "e-mail", "naïve", "Über"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), max_size=8),
       st.lists(st.sampled_from([*_WORDS, "2022", " ", ", ", "!", "_", "-", "'s", "?"]), max_size=20))
def test_terms_held_is_the_query_terms_among_the_text_stems(query, parts):
    terms = {stem(w) for w in query}
    text = " ".join(parts)
    assert TermsHeld(terms)(text) == stems(text) & terms


@pytest.mark.parametrize("own, extra, expected", [
    ({"a", "b"}, set(), 1.0),
    ({"a"}, set(), 0.75),
    (set(), {"a"}, 0.375),  # only in the previous turn: half
    ({"a"}, {"a", "b"}, 1.0 * 0.75 + 0.5 * 0.25),
    (set(), set(), 0.0),
])
def test_coverage(own, extra, expected):
    assert coverage(frozenset(own), {"a": 3.0, "b": 1.0}, frozenset(extra)) == pytest.approx(expected)


def test_coverage_is_the_same_float_whatever_the_hash_seed():
    # the weights are summed in the terms' order: in a set's order the last bits of a score
    # moved with PYTHONHASHSEED, so two processes scored the same pool differently
    import subprocess

    code = ("import itertools\n"
            "from tiered_memory.recall.coverage import coverage, term_weights\n"
            "q = 'pottery painting camping hiking museum violin workshop sunrise adoption garden'.split()\n"
            "texts = [' '.join(q[:n]) for n in range(1, 11)] + ['pottery', 'violin'] * 7\n"
            "w = term_weights(q, texts)\n"
            "print([repr(coverage(frozenset(c), w)) for c in itertools.combinations(sorted(w), 4)])")
    root = Path(__file__).resolve().parents[1]
    outs = {subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": str(seed), "PYTHONPATH": str(root)},
                           capture_output=True, text=True, check=True).stdout for seed in range(6)}
    assert len(outs) == 1


def test_coverage_of_a_query_without_terms_is_zero():
    assert coverage(frozenset({"a"}), {}) == 0.0


def test_exchange_and_session_coverage():
    texts = {"q": "what did you paint?", "a": "a sunset over the lake", "o": "the lake was cold"}
    weights = {"paint": 1.0, "sunset": 1.0}
    ex = exchange_coverage(texts, {"a": "q"}, weights)
    assert ex["a"] == pytest.approx(0.75) and ex["q"] == pytest.approx(0.5) and ex["o"] == 0.0
    sessions = {"q": "s1", "a": "s1", "o": "s2"}
    assert session_coverage(texts, sessions, weights) == {"s1": 1.0, "s2": 0.0}


def test_session_best():
    got = session_best({"a": 0.8, "b": 0.2, "c": 0.4}, {"a": "s1", "b": "s1", "c": "s2"})
    assert got == pytest.approx({"a": 1.0, "b": 1.0, "c": 0.5})
    assert session_best({"a": -1.0}, {"a": "s1"}) == {}


def cand(i: str, text: str, session: str, sim: float) -> Candidate:
    return Candidate(id=i, session_id=session, timestamp=0.0, text=text, similarity=sim)


OFF = TurnWeights(neighbor_weight=0, speaker_boost=0, time_boost=0, date_boost=0, session_weight=0,
                  session_coverage_weight=0, exchange_weight=0, session_best_weight=0, reply_weight=0,
                  question_penalty=0)


def test_session_coverage_lifts_a_turn_whose_session_covers_the_query():
    # "what pottery and painting does she do?": s1 talks of both across turns, s2 of painting only
    cands = [cand("s1a", "I took a pottery class", "s1", 0.40), cand("s1b", "and I love painting", "s1", 0.40),
             cand("s2a", "painting sunsets", "s2", 0.41), cand("s2b", "the weather was nice", "s2", 0.1)]
    plan = plan_query("what pottery and painting does she do?")
    without = [s.id for s in score_turns(cands, {}, plan, OFF, now=0)]
    assert without[0] == "s2a"
    with_cov = [s.id for s in score_turns(cands, {}, plan, TurnWeights(**{**OFF.__dict__, "session_coverage_weight": 0.3}),
                                          now=0)]
    assert with_cov[:2] == ["s1a", "s1b"] or with_cov[:2] == ["s1b", "s1a"]
    explained = score_turns(cands, {}, plan, TurnWeights(**{**OFF.__dict__, "session_coverage_weight": 0.3}), now=0)
    assert "session_terms" in explained[0].parts


def test_exchange_coverage_lifts_a_reply_by_its_question():
    cands = [cand("q", "what breed is your new puppy?", "s1", 0.30), cand("a", "a golden retriever!", "s1", 0.30),
             cand("x", "we walked a lot", "s1", 0.31)]
    plan = plan_query("which breed is the puppy?")
    w = TurnWeights(**{**OFF.__dict__, "exchange_weight": 0.4})
    order = [s.id for s in score_turns(cands, {"a": "q", "x": "a"}, plan, w, now=0)]
    assert order.index("a") < order.index("x")
    assert [s.id for s in score_turns(cands, {"a": "q", "x": "a"}, plan, OFF, now=0)][0] == "x"


def test_coverage_signals_do_nothing_for_a_query_without_terms():
    cands = [cand("a", "hello", "s1", 0.5), cand("b", "bye", "s2", 0.4)]
    w = TurnWeights(**{**OFF.__dict__, "exchange_weight": 0.4, "session_coverage_weight": 0.3})
    plain = score_turns(cands, {}, QueryPlan(text="?", terms=()), OFF, now=0)
    assert [(s.id, s.score) for s in score_turns(cands, {}, QueryPlan(text="?", terms=()), w, now=0)] == \
        [(s.id, s.score) for s in plain]


# ---- the real-chat development set ------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("Caroline: hi there", "hi there"),
    ("Melanie: hi", "Melanie: hi"),  # another speaker's prefix is text
])
def test_strip_speaker(text, expected):
    assert strip_speaker(text, "Caroline") == expected


@pytest.mark.parametrize("text, expected", [
    ("We met on 8 May, 2023 at the park.", "We met at the park."),
    ("The show (May 20, 2023) was great", "The show was great"),
    ("I moved here in 2019.", "I moved here in 2019."),  # a year alone is how people talk
])
def test_drop_dates(text, expected):
    assert drop_dates(text) == expected


def test_split_message_keeps_the_text_and_short_messages_whole():
    assert split_message("short one. two.") == ["short one. two."]
    long = "First I went to the market to buy fruit. " * 3 + "Then I cooked dinner for everyone at home."
    parts = split_message(long)
    assert 2 <= len(parts) <= 3 and " ".join(parts) == long.strip()
    assert split_message("x" * 300) == ["x" * 300]  # one sentence: no split


def test_informal_is_deterministic_and_informal():
    text = "I really think you are right. Thanks for the advice."
    assert informal(text, "D1:1") == informal(text, "D1:1")
    out = informal(text, "D1:1")
    assert not out.endswith(".") and "I " not in out and out[0].islower()


def test_realchat_keeps_every_dialogue_id_answerable():
    turns = [Turn(dia_id="D1:1", session=1, speaker="Ann", timestamp=0.0,
                  text="Ann: " + "I adopted a puppy last week and she is a golden retriever. " * 3
                       + "[shares a photo: a dog on grass]"),
             Turn(dia_id="D1:2", session=1, speaker="Bo", timestamp=0.0, text="Bo: So cute!")]
    conv = Conversation(id="c", speakers=("Ann", "Bo"), turns=turns,
                        questions=[Question(conversation="c", question="What dog?", category=4, evidence=("D1:1",))])
    [out] = realchat([conv])
    assert {t.dia_id for t in out.turns} == {"D1:1", "D1:2"} and len(out.questions) == 1
    assert all(not t.text.startswith(("Ann:", "Bo:")) for t in out.turns)
    assert len(realchat_turns(turns[0])) >= 2 and realchat_turns(turns[0])[-1].text.endswith("[shares a photo: a dog on grass]")
    assert out == realchat([conv])[0]


def test_realchat_noisy_adds_reactions_that_are_never_evidence():
    turns = [Turn(dia_id=f"D1:{i}", session=1, speaker=("Ann", "Bo")[i % 2], timestamp=float(i),
                  text=f"{('Ann', 'Bo')[i % 2]}: I planted tomatoes number {i} in the garden") for i in range(60)]
    conv = Conversation(id="c", speakers=("Ann", "Bo"), turns=turns,
                        questions=[Question(conversation="c", question="What grew?", category=4, evidence=("D1:7",))])
    [plain] = realchat([conv])
    [noisy] = realchat_noisy([conv])
    added = [t for t in noisy.turns if t not in plain.turns]
    assert [t for t in noisy.turns if t in plain.turns] == plain.turns  # the chat itself, in order
    assert 5 < len(added) < 40 and all(t.text in REACTIONS and "~r" in t.dia_id for t in added)
    assert {t.dia_id for t in added}.isdisjoint({t.dia_id for t in plain.turns})
    before = {noisy.turns[i + 1].dia_id: noisy.turns[i] for i in range(len(noisy.turns) - 1)}
    assert all(before[t.dia_id].speaker != t.speaker for t in added)  # the other person reacts
    assert noisy.questions == plain.questions and noisy == realchat_noisy([conv])[0]


# ---- context recall counting --------------------------------------------------------
def test_carries_needs_half_the_turn_words():
    assert carries("User likes pottery and painting", "I love pottery and painting!")
    assert not carries("User went camping", "I love pottery and painting!")
    assert not carries("anything", "")


def test_reached_direct_cited_and_carried():
    dia_of = {"m1": "D1:1", "m2": "D1:2"}
    sources = {"fact:f": Source(text="User likes pottery", cites=frozenset({"D1:3"})),
               "ep:e": Source(text="They talked about the weather", cites=frozenset({"D1:3", "D1:4"}))}
    text = {"D1:3": "I like pottery", "D1:4": "I adopted a puppy"}
    direct, cited, carried = reached(["m1", "m2", "fact:f", "ep:e", "wm:x"], dia_of, sources, text,
                                     ["D1:1", "D1:3", "D1:4", "D9:9"])
    assert direct == {"D1:1"}
    assert cited == {"D1:1", "D1:3", "D1:4"}
    assert carried == {"D1:1", "D1:3"}  # the episode cites D1:4 but does not say it


def test_summarize_context():
    rows = [Measured(category=1, evidence=("a", "b"), tokens=400, direct=frozenset({"a"}), cited=frozenset({"a", "b"}),
                     carried=frozenset({"a"})),
            Measured(category=4, evidence=("c",), tokens=600)]
    s = summarize_context(rows)
    assert s["count"] == 2 and s["tokens"] == 500
    assert s["direct"] == pytest.approx(0.25) and s["cited"] == pytest.approx(0.5)
    assert s["cited_per_1k_tokens"] == pytest.approx(2.0) and s["direct_per_1k_tokens"] == pytest.approx(1.0)
    assert summarize_context([]) == {"count": 0}



# fact matching's stem: a verb's third-person, past and -ing forms stem as the verb does. By
# recall's stem "lives" was "liv" and "live" (four letters) stayed whole, so "User lives in
# Berlin" was not said by "I live in Berlin"
_VERB_FORMS = {
    "live": ("lives", "lived", "living"), "like": ("likes", "liked", "liking"),
    "love": ("loves", "loved", "loving"), "move": ("moves", "moved", "moving"),
    "hike": ("hikes", "hiked", "hiking"), "bake": ("bakes", "baked", "baking"),
    "dance": ("dances", "danced", "dancing"), "use": ("uses", "used", "using"),
    "have": ("having",), "make": ("makes", "making"), "write": ("writes", "writing"),
    "tie": ("ties", "tied", "tying"), "paint": ("paints", "painted", "painting"),
    "study": ("studies", "studied", "studying"), "try": ("tries", "tried", "trying"),
    "run": ("runs", "running"), "stop": ("stops", "stopped", "stopping"),
    "watch": ("watches", "watched", "watching"), "agree": ("agrees", "agreeing"),
    "see": ("sees", "seeing"), "need": ("needs", "needed", "needing"), "call": ("calls", "called"),
    "class": ("classes",), "glass": ("glasses",), "bus": ("buses",), "house": ("houses", "housing"),
    "dog": ("dogs",), "hobby": ("hobbies",),
    # a one-syllable root keeps (or gets back) its e, so these meet and the pairs below stay apart
    "hope": ("hopes", "hoped", "hoping"), "hop": ("hops", "hopped", "hopping"), "care": ("cares", "cared", "caring"),
    "plan": ("plans", "planned", "planning"), "plane": ("planes",), "cut": ("cuts", "cutting"),
    "share": ("shares", "shared", "sharing"), "stare": ("stares", "stared", "staring"), "star": ("stars", "starred"),
    "time": ("times", "timed", "timing"), "finally": ("final",), "lately": ("late",),
}


@pytest.mark.parametrize("base, forms", sorted(_VERB_FORMS.items()))
def test_a_verbs_forms_have_its_fact_stem(base, forms):
    assert {fact_stem(f) for f in forms} == {fact_stem(base)}
    for f in {base, *forms} - STOPWORDS:  # "like", "have", "having": no content word
        assert fact_stems(f"she {f} here") == {fact_stem(base)}


@pytest.mark.parametrize("word, other", [
    ("need", "nee"), ("shed", "she"), ("going", "goe"), ("thing", "th"), ("this", "thi"), ("tennis", "tenni"),
    ("bonus", "bonu"), ("speed", "spee"), ("pies", "py"), ("leave", "live"),
    # merged by the final e's going: a word of three letters and a four-letter one with an e (and the
    # e word's -ing / -ed: "hoping" was "hop", as "hopping" is); "plane" / "plan", "stared" / "star" alike
    ("cute", "cut"), ("care", "car"), ("caring", "car"), ("hate", "hat"), ("hope", "hop"), ("hoping", "hopping"),
    ("plane", "plan"), ("time", "tim"), ("wine", "win"), ("ride", "rid"), ("riding", "rid"), ("site", "sit"),
    ("rate", "rat"), ("huge", "hug"), ("stared", "star"), ("quite", "quit"), ("shine", "shin"), ("mate", "mat"),
    # -ly off a word that is no adverb, and -s off "news", -ing off "evening", off a root of no vowel
    ("apply", "app"), ("early", "ear"), ("reply", "rep"), ("tilly", "til"), ("news", "new"),
    ("evening", "even"), ("string", "str"), ("spring", "spr"),
])
def test_fact_stem_keeps_words_apart(word, other):
    assert fact_stem(word) != fact_stem(other)


def test_fact_stems_of_any_text_are_its_content_words_fact_stems():
    assert fact_stems("The USER lived, and is living, in Köln!") == {"user", "live", "köln"}
    assert fact_stems("") == frozenset()
    assert fact_stems("she gets it done, getting home; gotten, had, been") == {"home"}  # stop words' forms


# irregular verbs: their forms meet the base as a regular verb's do ("I wrote" says "User has
# written"); was / has and the like are stop words, which fact matching leaves out before stemming
_IRREGULAR = {
    "be": ("am", "is", "are", "was", "were", "been", "being"), "have": ("has", "had", "having"),
    "do": ("does", "did", "done", "doing"), "go": ("goes", "going", "went", "gone"),
    "write": ("wrote", "written", "writes", "writing"), "buy": ("bought", "buys", "buying"),
    "agree": ("agreed", "agrees", "agreeing"), "see": ("saw", "seen", "sees", "seeing"),
    "eat": ("ate", "eaten", "eats", "eating"), "take": ("took", "taken", "takes", "taking"),
    "make": ("made", "makes", "making"), "run": ("ran", "runs", "running"), "come": ("came", "comes", "coming"),
    "meet": ("met", "meets", "meeting"), "think": ("thinks", "thinking"), "find": ("found", "finds"),
    "teach": ("taught", "teaches", "teaching"), "give": ("gave", "given", "gives"), "get": ("got", "gotten", "gets"),
    "win": ("won", "wins", "winning"), "sit": ("sat", "sits", "sitting"), "feel": ("felt", "feels"),
    "know": ("knew", "known", "knows"), "tell": ("told", "tells"), "say": ("said", "says"),
    "hide": ("hid", "hidden", "hides", "hiding"), "free": ("freed", "frees"),
}


@pytest.mark.parametrize("base, forms", sorted(_IRREGULAR.items()))
def test_an_irregular_verbs_forms_have_its_fact_stem(base, forms):
    assert {fact_stem(f) for f in forms} == {fact_stem(base)}
    for f in {base, *forms} - STOPWORDS:  # a stop word's forms ("done", "gotten") are none too
        assert fact_stems(f"she {f} here") == (set() if base in STOPWORDS else {fact_stem(base)})


@pytest.mark.parametrize("word, other", [("thought", "think"), ("shot", "shoot"), ("left", "leave")])
def test_a_form_that_is_as_often_another_word_is_no_verbs(word, other):
    assert fact_stem(word) != fact_stem(other)


def test_irregular_forms_leave_recalls_stem_as_it_was():
    assert [stem(w) for w in ("wrote", "written", "bought", "went", "agreed", "caring")] == [
        "wrote", "written", "bought", "went", "agre", "car"]
