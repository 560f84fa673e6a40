"""Fact resolution by the rules where similarity alone misleads: a similar fact of no slot that
is another fact, and the fact of a slot that is not among the candidate's nearest facts
(the pure rules' table: ``test_resolution_table.py::test_decide_resolution``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import Embedder, StaticEmbedder, TieredMemory
from tiered_memory.config import FactConfig
from tiered_memory.backends import open_layer_store
from tiered_memory.embedding import embed, embed_query
from tiered_memory.slots import stated_slot
from tiered_memory.layers.resolution import decide_resolution, one_in_slot, rewritten_slot
from tiered_memory.records import Fact, FactCandidate
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_layers import LAYER_MIGRATIONS as LAYER_SQLITE
from tiered_memory.testing import CountingEmbedder, ScriptedLLM

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

# pairs of facts of no slot, the second said after the first, 0.82-0.92 alike with MiniLM or the
# static embedder (over merge_similarity for some): two facts that can both be true...
OTHER_FACTS = [
    ("User has a dog named Rex", "User has a cat named Rex"),  # 0.89 MiniLM, 0.82 static
    ("User drinks tea every morning", "User drinks coffee every morning"),  # 0.82, 0.88
    ("User has a meeting on Monday", "User has a meeting on Friday"),  # 0.91, 0.92
    ("User visited Japan last year", "User visited China last year"),  # 0.77, 0.86
    ("User plays the piano", "User plays the guitar"),
    ("User is learning Spanish", "User is learning French"),
    ("User has two children", "User has two cats"),
    ("User runs on weekends", "User swims on weekends"),
    ("User is training for a marathon", "User is training for a triathlon"),
    # ...or a word the new one does not repeat ("every"): an update would lose it
    ("User drinks green tea every morning", "User drinks green tea each morning"),
    ("User has a dog named Rex", "User has a beagle named Rex"),
]
# ...and the first said more fully: every content word of it is in the second (0.86-0.93)
REFINEMENTS = [
    ("User drinks green tea every morning", "User drinks green tea with honey every morning"),
    ("User is training for a marathon", "User is training for the Berlin marathon"),
    ("User plays the piano", "User plays the piano every evening"),
    ("User is learning Spanish", "User is learning Spanish on Duolingo"),
    ("User collects old stamps", "The user collects very old stamps from Japan"),  # "the", "very": no content
    ("User's car is a red Fiat", "The user's car is an old red Fiat Panda"),  # "'s", "a" / "an" neither
    ("User drinks alcohol", "User no longer drinks alcohol"),  # the newer statement, which says it all
]


def _fact(text: str) -> Fact:
    return Fact(id="old", user_id="u", type="fact", text=text, confidence=0.8)


@pytest.mark.parametrize("old, new, expected", [*((o, n, "add") for o, n in OTHER_FACTS),
                                                *((o, n, "update") for o, n in REFINEMENTS)])
def test_a_similar_fact_of_no_slot_updates_only_one_it_says_more_fully(old: str, new: str, expected: str) -> None:
    """With no judge, a fact of no slot at merge_similarity or more rewrote the nearest fact of no
    slot into itself: "User has a cat named Rex" left no dog. It is added now (both valid),
    unless it says all the old fact says (its content words, stop words and "user" aside)."""
    assert stated_slot(old) is None and stated_slot(new) is None  # the rules' cosine branch
    res = decide_resolution(FactCandidate(type="fact", text=new, confidence=0.8), [(_fact(old), 0.9)],
                            same=0.95, merge=0.85)
    assert (res.action, res.target_id) == ((expected, None) if expected == "add" else (expected, "old"))
    assert res.reason


def test_add_fact_keeps_a_similar_fact_it_does_not_say(make_memory: Callable[..., TieredMemory]) -> None:
    """Through add_fact with the bundled static embedder (the default): "User has a meeting on
    Friday" (0.92) rewrote the Monday meeting into itself, and "User drinks coffee every morning"
    (0.88) the tea, losing them; a refinement (0.86) still updates the fact it refines."""
    memory = make_memory(embedder=StaticEmbedder())
    for user, (old, new) in enumerate([*OTHER_FACTS[:4], REFINEMENTS[2]]):
        first = memory.add_fact(old, user_id=f"u{user}")
        memory.add_fact(new, user_id=f"u{user}")
        texts = sorted(f.text for f in memory.facts(f"u{user}"))
        if (old, new) in REFINEMENTS:
            assert texts == [new] and memory.facts(f"u{user}")[0].id == first.id
        else:
            assert texts == sorted([old, new]), (old, new)
            assert {c.action for c in memory.fact_history(f"u{user}")} == {"add"}


# facts of no slot, each nearer to "User lives in Berlin" than "User lives in Paris" is (8th-11th of 11
# with MiniLM and the static embedder)
NEARER_THAN_PARIS = [
    "User's sister lives in Berlin", "User's brother lives in Berlin", "User's parents live in Berlin",
    "User's best friend lives in Berlin", "User studied in Berlin", "User's grandmother lives in Berlin",
    "User's cousin lives in Berlin", "User was born in Berlin"]


def _berlin_replaces_paris_past_the_nearest(memory: TieredMemory, embedder: Embedder, paris: Fact) -> None:
    """u's facts NEARER_THAN_PARIS are added (none resolved against another, and "User lives in
    Paris" then outside the related_k nearest to "User lives in Berlin"); then "User lives in
    Berlin" must replace ``paris``."""
    for text in NEARER_THAN_PARIS:
        memory.add_fact(text, user_id="u")
    assert len(memory.facts("u")) == 1 + len(NEARER_THAN_PARIS)  # all added: none resolved against another
    sims = embed(embedder, ["User lives in Paris", *NEARER_THAN_PARIS]) @ embed_query(embedder, "User lives in Berlin")
    assert sorted(sims, reverse=True).index(sims[0]) >= FactConfig().related_k  # Paris is not among the nearest
    berlin = memory.add_fact("User lives in Berlin", user_id="u")
    assert sorted(f.text for f in memory.facts("u")) == sorted(["User lives in Berlin", *NEARER_THAN_PARIS])
    old = {f.id: f for f in memory.facts("u", include_invalid=True)}[paris.id]
    assert (old.valid, old.superseded_by) == (False, berlin.id)


def test_a_new_fact_of_a_slot_replaces_the_slots_fact_however_many_facts_are_nearer(
        memory: TieredMemory, embedder: Embedder) -> None:
    """The rules looked for the slot's fact only among the related_k (5) facts nearest the
    candidate: with more facts nearer to "User lives in Berlin" than "User lives in Paris", both
    stayed valid, the user living in two cities."""
    paris = memory.add_fact("User lives in Paris", user_id="u")
    _berlin_replaces_paris_past_the_nearest(memory, embedder, paris)


def test_a_fact_in_a_slots_words_stored_without_its_key_is_replaced_however_many_facts_are_nearer(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    """A fact stored without a key in a slot's words (here the judge's rewrite of a fact of no slot
    into "User lives in Paris": an update kept the key, None) was compared with the next fact of
    its slot only among the related_k nearest: the slot's facts are read by key. Past them,
    "User lives in Berlin" left Paris valid, the user living in two cities."""
    memory = _judged_in_two_sessions(make_memory, "User is based in Paris", "User lives in Paris",
                                     rewrite="User lives in Paris")
    [paris] = memory.facts("u")
    assert paris.text == "User lives in Paris" and [h.action for h in memory.fact_history("u")] == ["add", "update"]
    _berlin_replaces_paris_past_the_nearest(memory, embedder, paris)


def test_the_facts_of_a_slot_past_the_nearest_are_compared_by_their_stored_vectors(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    """related() embedded the text of each fact of the slot the nearest facts missed, though its
    row holds its vector: only the new fact's own text goes through the embedder now."""
    counting = CountingEmbedder(embedder)
    memory = make_memory(embedder=counting)
    memory.add_fact("User lives in Paris", user_id="u")
    for text in NEARER_THAN_PARIS:
        memory.add_fact(text, user_id="u")
    counting.characters.clear()
    memory.add_fact("User lives in Berlin", user_id="u")
    assert counting.characters == [len("User lives in Berlin")]  # its own vector; Paris's read as stored
    assert "User lives in Paris" not in [f.text for f in memory.facts("u")]


def test_a_store_of_facts_in_a_slots_words_without_their_keys_puts_them_in_their_slots_when_it_opens(
        make_memory: Callable[..., TieredMemory]) -> None:
    """Facts stored without a key in a slot's words before every write stored their slot (a judge's
    rewrite, facts from before facts had slots): the layer migration puts each valid one in the
    slot its words name, so the next fact of the slot replaces it however many facts are nearer."""
    memory = make_memory()
    paris = memory.add_fact("User lives in Paris", user_id="u")
    for text in NEARER_THAN_PARIS:
        memory.add_fact(text, user_id="u")
    olives = memory.add_fact("User dislikes olives", user_id="u")
    cat = memory.add_fact("User has a cat", user_id="u")
    oslo = memory.add_fact("User lives in Oslo", user_id="v")
    memory.add_fact("User lives in Rome", user_id="v")  # Oslo is history
    rows = open_layer_store(memory.store)
    with rows.transaction() as c:  # the rows as earlier versions left them, the migration not applied
        c.execute("UPDATE facts SET key=NULL, polarity=1")
        c.execute("DELETE FROM schema_migrations WHERE name='layers' AND version=?",
                  (rows.db.schema_version("layers"),))
    memory.close()
    memory = make_memory()
    facts = {f.id: f for f in memory.facts("u", include_invalid=True) + memory.facts("v", include_invalid=True)}
    assert (facts[paris.id].key, facts[olives.id].key, facts[olives.id].polarity) == ("residence", "pref:olives", -1)
    assert facts[cat.id].key is None and facts[oslo.id].key is None  # no slot named; history left as it was
    berlin = memory.add_fact("User lives in Berlin", user_id="u")
    old = {f.id: f for f in memory.facts("u", include_invalid=True)}[paris.id]
    assert (old.valid, old.superseded_by) == (False, berlin.id)


def test_the_slot_migration_reads_a_text_another_writer_left_undecodable(tmp_path: Path) -> None:
    """SQLite: a keyless fact whose text is not valid UTF-8 (written by other means) neither stops
    the migration that fills the slots nor loses its bytes; the facts beside it get theirs."""
    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    store.migrate("layers", LAYER_SQLITE[:-1])  # all but the slots' migration
    with store.transaction() as c:
        for fact_id, text in (("f1", "User lives in Par".encode() + b"\xff" + b"s"),
                              ("f2", "User lives in Paris".encode())):
            c.execute("INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
                      " VALUES (?, 'u', 'fact', CAST(? AS TEXT), 1, 0, 0, 0)", (fact_id, text))
    store.close()
    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    try:
        open_layer_store(store)
        assert store.query("SELECT id, key, CAST(text AS BLOB) FROM facts ORDER BY id", ()) == [
            ("f1", "residence", "User lives in Par".encode() + b"\xff" + b"s"),
            ("f2", "residence", b"User lives in Paris")]
    finally:
        store.close()


@pytest.mark.parametrize("old, new, expected", [
    ("User's flight is on May 3", "User's flight is on May 4", "add"),  # 0.96-0.97: another date
    ("User drinks tea every morning", "User drinks tea every evening", "add"),  # 0.96
    ("User drinks green tea every morning", "User drinks tea every morning", "noop"),  # said already, and more
    ("User drinks green tea every morning", "user drinks green tea every morning!", "noop"),
    ("User plays the piano", "User plays the piano every evening", "update"),  # says more: refines it
])
def test_a_fact_as_alike_as_a_known_one_is_a_no_op_only_when_the_known_one_says_it(old: str, new: str,
                                                                                   expected: str) -> None:
    """At same_similarity (0.95) or more the rules called a new fact of no slot known and dropped
    it: "User's flight is on May 4" after May 3 was lost. It is a no-op now only where the known
    fact says all the new one does; else it refines the known one or is added beside it."""
    res = decide_resolution(FactCandidate(type="fact", text=new, confidence=0.8), [(_fact(old), 0.96)],
                            same=0.95, merge=0.85)
    assert res.action == expected


def test_a_fact_said_again_cites_the_turns_that_said_it_again(make_memory: Callable[..., TieredMemory]) -> None:
    """A fact a later session states again was a no-op that kept only the first session's turns
    as its sources: a context citing facts by their sources never reached the later turns, and
    the fact's age ignored them. The turns join its sources, its history says so."""
    memory = make_memory(embedder=StaticEmbedder())
    first = memory.add("user", "I live in Lisbon and I love it.", session_id="a", user_id="u")
    memory.end_session("a", user_id="u")
    fact = memory.facts("u")[0]
    assert (fact.key, fact.source_ids) == ("residence", [first])
    again = memory.add("user", "As I said, I live in Lisbon.", session_id="b", user_id="u")
    memory.end_session("b", user_id="u")
    [now] = memory.facts("u")
    assert (now.id, now.text, now.source_ids) == (fact.id, fact.text, [first, again])
    assert now.updated_at >= fact.updated_at
    confirm = [c for c in memory.fact_history("u", fact.id) if c.action == "confirm"]
    assert len(confirm) == 1 and confirm[0].details["source_ids"] == [again]


def test_a_judges_rewrite_of_a_slots_fact_into_another_slots_words_moves_it_to_that_slot(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A judge's update rewrote the fact of slot residence into "User works at Acme" and the
    fact kept its key, residence: the next residence ("User lives in Rome") invalidated the
    work fact, and the next employer left it valid beside its own. The rewrite is stored in
    the slot its words name, as an edit's is."""
    memory = _judged_in_two_sessions(make_memory, "User lives in Lisbon", "User lives in Lisbon's old town",
                                     rewrite="User works at Acme")
    [work] = memory.facts("u")
    assert (work.text, work.key) == ("User works at Acme", "employer")
    assert [h.action for h in memory.fact_history("u", work.id)] == ["add", "update"]
    rome = memory.add_fact("User lives in Rome", user_id="u")
    assert sorted(f.text for f in memory.facts("u")) == ["User lives in Rome", "User works at Acme"]
    globex = memory.add_fact("User works at Globex", user_id="u")
    assert sorted(f.id for f in memory.facts("u")) == sorted([rome.id, globex.id])
    old = {f.id: f for f in memory.facts("u", include_invalid=True)}[work.id]
    assert (old.valid, old.superseded_by) == (False, globex.id)


@pytest.mark.parametrize("edit, reason", [
    ("User lives in Paris", "contradicts"),  # another value: the slot's fact is replaced
    ("User moved to Lisbon", "same fact"),  # the same value in other words: one of them stays, the edited
    ("User lives in Lisbon, Portugal", "more fully"),
])
def test_an_edit_into_a_slots_words_leaves_one_valid_fact_in_the_slot(
        make_memory: Callable[..., TieredMemory], edit: str, reason: str) -> None:
    """An edit of "User likes tea" into "User lives in Paris" moved it into slot residence beside
    "User lives in Lisbon": two valid residences, and "User lives in Oslo" then replaced only one
    of them. The slot's other fact is resolved as add_fact of the edit's words would resolve it,
    and invalidated (superseded by the edited fact, its history naming the edit), whatever the value."""
    memory = make_memory()
    lisbon = memory.add_fact("User lives in Lisbon", user_id="u")
    tea = memory.add_fact("User likes tea", user_id="u")
    memory.update_fact(tea.id, text=edit, user_id="u")
    assert [(f.id, f.key) for f in memory.facts("u")] == [(tea.id, "residence")]
    old = {f.id: f for f in memory.facts("u", include_invalid=True)}[lisbon.id]
    assert (old.valid, old.superseded_by) == (False, tea.id)
    [change] = [c for c in memory.fact_history("u", lisbon.id) if c.action == "invalidate"]
    assert f"replaced by an edit of fact {tea.id}" in change.details["reason"]
    assert reason in change.details["reason"] and change.details["superseded_by"] == tea.id
    assert f"fact:{lisbon.id}" not in memory.index.ids()  # an invalid fact's vector is not searched
    oslo = memory.add_fact("User lives in Oslo", user_id="u")
    assert [f.id for f in memory.facts("u")] == [oslo.id]


@pytest.mark.parametrize("moved, at, expected", [
    ("User lives in Paris", 20.0, ("rival", "moved", 20.0, "contradicts")),  # another value: replaced
    ("User moved to Lisbon", 20.0, ("rival", "moved", 20.0, "same fact")),  # its duplicate
    ("User lives in Lisbon, Portugal", 20.0, ("rival", "moved", 20.0, "more fully")),
    ("User lives in Paris", 5.0, ("moved", "rival", 10.0, "said before fact rival")),  # older: history
    ("User moved to Lisbon", 5.0, ("rival", "moved", 5.0, "same fact")),  # the same value, whenever said
])
def test_one_in_slot(moved: str, at: float, expected: tuple[str, str, float, str]) -> None:
    rival = Fact(id="rival", user_id="u", type="fact", text="User lives in Lisbon", confidence=0.8,
                 key="residence", valid_from=10.0)
    fact = Fact(id="moved", user_id="u", type="fact", text=moved, confidence=0.8, key="residence")
    [(old, new, since, reason)] = one_in_slot(fact, [rival], at, same=0.95, merge=0.85, by="an edit")
    assert (old.id, new.id, since) == expected[:3] and expected[3] in reason and "an edit of fact moved" in reason


def test_an_edit_of_an_invalid_fact_into_a_slots_words_leaves_the_slots_fact(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A fact already history, edited into the slot's words, replaces nothing."""
    memory = make_memory()
    paris = memory.add_fact("User lives in Paris", user_id="u")
    lisbon = memory.add_fact("User lives in Lisbon", user_id="u")
    memory.update_fact(paris.id, text="User lives in Paris, France", user_id="u")
    assert [f.id for f in memory.facts("u")] == [lisbon.id]


def test_a_judges_rewrite_into_a_slots_words_leaves_one_valid_fact_in_the_slot(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A judge's rewrite of a fact of no slot ("User is based in Paris") into "User lives in Paris"
    moved it into slot residence beside "User lives in Lisbon", both valid. The slot's other
    fact is resolved as a new fact of the rewrite's words would resolve it: replaced."""
    lisbon: list[Fact] = []
    memory = _judged_in_two_sessions(
        make_memory, "User is based in Paris", "User is based in central Paris", rewrite="User lives in Paris",
        between=lambda memory: lisbon.append(memory.add_fact("User lives in Lisbon", user_id="u")))
    [paris] = memory.facts("u")
    assert (paris.text, paris.key) == ("User lives in Paris", "residence")
    old = {f.id: f for f in memory.facts("u", include_invalid=True)}[lisbon[0].id]
    assert (old.valid, old.superseded_by) == (False, paris.id)
    [change] = [c for c in memory.fact_history("u", old.id) if c.action == "invalidate"]
    assert f"replaced by a judge's rewrite of fact {paris.id}" in change.details["reason"]
    oslo = memory.add_fact("User lives in Oslo", user_id="u")
    assert [f.id for f in memory.facts("u")] == [oslo.id]


def test_a_judges_rewrite_said_before_the_slots_fact_is_history(make_memory: Callable[..., TieredMemory]) -> None:
    """The rewrite's words were said (a session ended late) before the slot's fact they
    contradict: as a new fact said then, the rewritten fact is history, superseded by the newer."""
    lisbon: list[Fact] = []
    memory = _judged_in_two_sessions(
        make_memory, "User is based in Paris", "User is based in central Paris", rewrite="User lives in Paris",
        between=lambda memory: lisbon.append(memory.add_fact("User lives in Lisbon", user_id="u")),
        said=1_000_000_000.0)
    assert [f.id for f in memory.facts("u")] == [lisbon[0].id]
    [paris] = [f for f in memory.facts("u", include_invalid=True) if f.id != lisbon[0].id]
    assert (paris.text, paris.valid, paris.superseded_by) == ("User lives in Paris", False, lisbon[0].id)
    assert f"fact:{paris.id}" not in memory.index.ids()


@pytest.mark.parametrize("text, candidate, expected", [
    ("User lives in Lisbon", None, ("residence", 1)),  # the text stays: its slot too
    ("User works at Acme", None, ("employer", 1)),  # another slot's words: that slot
    ("User dislikes olives", None, ("pref:olives", -1)),
    ("User is based in Lisbon", None, (None, 1)),  # words of no slot: none
    ("User likes talking to themselves",  # the candidate's words: the slot its rules read in them
     FactCandidate(type="preference", text="User likes talking to themselves", confidence=0.6,
                   key="pref:talking to myself"), ("pref:talking to myself", 1)),
    ("User works at Acme", FactCandidate(type="fact", text="User lives in Rome", confidence=0.6, key="residence"),
     ("employer", 1)),  # a judge's own words, not the candidate's
])
def test_rewritten_slot(text: str, candidate: FactCandidate | None, expected: tuple[str | None, int]) -> None:
    old = Fact(id="f", user_id="u", type="fact", text="User lives in Lisbon", confidence=0.8, key="residence")
    assert rewritten_slot(old, text, candidate) == expected


def _judged_in_two_sessions(make_memory: Callable[..., TieredMemory], first: str, second: str, *,
                            rewrite: str, between: Callable[[TieredMemory], object] = lambda memory: None,
                            said: float | None = None) -> TieredMemory:
    """A memory whose model extracted ``first`` in one session and ``second`` in the next (its
    turn's timestamp ``said``, default now), and whose judge then updated the first fact to
    ``rewrite``; ``between`` runs between the two sessions."""
    episode = {"summary": "Talked about the user.", "entities": [], "decisions": [], "open_questions": [],
               "key_facts": []}
    llm = ScriptedLLM(by_task={
        "facts": [{"facts": [{"type": "fact", "text": first}]}, {"facts": [{"type": "fact", "text": second}]}],
        "resolve": [{"action": "update", "target": 1, "text": rewrite}],
        "episode": [episode] * 2})
    memory = make_memory(llm=llm)
    memory.add("user", "Some news about me.", session_id="s1", user_id="u")
    memory.end_session("s1", user_id="u")
    between(memory)
    memory.add("user", "Some news about me.", session_id="s2", user_id="u", timestamp=said)
    memory.end_session("s2", user_id="u")
    return memory
