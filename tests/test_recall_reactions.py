"""Reactions ("lol", "omg yes") in a chat: which messages only react, the turn a reply
follows up past them, and where they rank (``recall/query.py``: ``is_reaction``;
``recall/scoring.py``: ``previous_turns``; ``recall/search.py``: ``ranked_hits``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from tiered_memory import MemoryConfig, RetrievalConfig
from tiered_memory.recall.query import is_reaction
from tiered_memory.recall.scoring import previous_turns


@dataclass
class Rec:
    id: str
    session_id: str
    seq: int
    content: str = "I planted tomatoes in the garden"


def test_previous_turns_from_seq_and_neighbors():
    records = {r.id: r for r in [Rec("a", "s1", 1), Rec("b", "s1", 2), Rec("c", "s2", 3), Rec("e", "s1", 9)]}
    neighbors = {"e": [Rec("d", "s1", 5), Rec("e", "s1", 9), Rec("f", "s1", 10)]}
    assert previous_turns(records, neighbors) == {"b": "a", "e": "d", "f": "e"}


def test_a_reply_follows_up_the_message_before_a_reaction():
    said = [Rec("q", "s1", 1, "Ann: Where did you go last summer?"), Rec("r", "s1", 2, "Bo: omg lol"),
            Rec("a", "s1", 3, "Bo: We drove up to the lakes in Maine"), Rec("x", "s1", 4, "Ann: wow!!"),
            Rec("y", "s1", 5, "Ann: hahaha"), Rec("z", "s1", 6, "Bo: and we camped")]
    prev = previous_turns({r.id: r for r in said}, {})
    # a reaction keeps its own; a reply skips up to two reactions
    assert prev == {"r": "q", "a": "q", "x": "a", "y": "x", "z": "a"}
    assert {p: i for i, p in prev.items()}["q"] == "a"  # inverted, the question's reply is the answer
    # the same from a neighbour fetch, whatever order the records come in
    assert previous_turns({r.id: r for r in reversed(said[:3])}, {"q": said[:3]}) == {"r": "q", "a": "q"}
    assert list(previous_turns({r.id: r for r in reversed(said[:3])}, {})) == ["r", "a"]
    # three reactions in a row, or only reactions before it: the turn just before
    more = [*said[:5], Rec("w", "s1", 6, "Bo: lmaooo"), Rec("z", "s1", 7, "Bo: and we camped")]
    assert previous_turns({r.id: r for r in more}, {})["z"] == "w"
    assert previous_turns({r.id: r for r in said[1:3]}, {}) == {"a": "r"}


@pytest.mark.parametrize("text, reacts", [
    ("lol", True), ("Bo: omg yes", True), ("hahaha", True), ("yesss!!", True), ("sooo cool", True),
    ("for real?", True), ("Wow, that sounds great!", True), ("\U0001F602\U0001F602", True),
    ("Paris!", False), ("new job!", False), ("I went to Rome", False), ("Three times", False),
    ("[shares a photo: a dog on a beach]", False), ("Yes, Rome", False),
])
def test_is_reaction(text, reacts):
    assert is_reaction(text) is reacts


def test_reactions_come_last_unless_asked_otherwise(make_memory):
    """A reaction beside the best match shares its neighbourhood's signals and would rank
    high; it answers nothing, so it comes after every turn that says something. With
    ``reactions_last=False`` it ranks by its score, above turns that say something."""
    said = ["Ann: We adopted a puppy named Biscuit last weekend!", "Bo: omg", "Bo: hahaha yesss",
            "Ann: I bought new running shoes.", "Bo: The train was late again today."]
    for last in (True, False):
        m = make_memory(f"mem-{last}", config=replace(MemoryConfig(), retrieval=RetrievalConfig(reactions_last=last)))
        ids = m.add_many([{"role": "user", "content": t} for t in said], user_id="u", session_id="s")
        ranked = [h.id for h in m.search("What is the name of Ann's puppy?", user_id="u", k=5)]
        assert ranked[0] == ids[0]
        if last:
            assert ranked[-2:] in ([ids[1], ids[2]], [ids[2], ids[1]])
        else:
            assert min(ranked.index(ids[1]), ranked.index(ids[2])) < 3
        groups = m.search_sessions("What is the name of Ann's puppy?", user_id="u", k=1, turns=5)
        assert [h.id for h in groups[0].hits] == ranked
