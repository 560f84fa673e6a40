"""Semantic memory: fact candidates, CRUD, history (resolution's pure table:
``test_resolution_table.py``; the model's extraction and judgement: ``test_semantic_llm_extraction.py``)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from tiered_memory import InvalidInputError, NotFoundError, TieredMemory
from tiered_memory.layers.extractive import extract_fact_candidates
from tiered_memory.slots import stated_slot
from tiered_memory.types import StoredMessage

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _m(text: str, role: str = "user", n: int = 0) -> StoredMessage:
    return StoredMessage(id=f"m{n}", user_id="u", session_id="s", role=role, content=text, timestamp=100.0 + n)


@pytest.mark.parametrize("text, expected", [
    ("Hi, my name is Ana and I live in Lisbon.", [("fact", "User's name is Ana", "name"),
                                                   ("fact", "User lives in Lisbon", "residence")]),
    ("I'm allergic to peanuts.", [("constraint", "User is allergic to peanuts", "allergy:peanuts")]),
    ("I really like Thai food", [("preference", "User likes Thai food", "pref:thai food")]),
    ("I hate sushi now.", [("preference", "User dislikes sushi", "pref:sushi")]),
    ("I don't like loud music, but jazz is fine", [("preference", "User dislikes loud music", "pref:loud music")]),
    ("I prefer window seats.", [("preference", "User prefers window seats", "prefer:window seats")]),
    ("My wife Maria is a doctor.", [("relationship", "User's wife is Maria", "rel:wife")]),
    ("my dog is called Rex", [("relationship", "User's dog is Rex", "rel:dog")]),
    ("We decided to ship on Friday.", [("decision", "Decided: ship on Friday", None)]),
    ("I'm vegetarian.", [("constraint", "User is vegetarian", "diet:vegetarian")]),
    # said of "User" in the third person; the key keeps the words as said, as before
    ("I love running my own studio.", [("preference", "User likes running their own studio",
                                        "pref:running own studio")]),
    ("The weather is nice.", []),
    ("Do you like sushi?", []),
])
def test_rule_based_fact_candidates(text: str, expected: list[tuple[str, str, str | None]]) -> None:
    got = extract_fact_candidates([_m(text)])
    assert [(c.type, c.text, c.key) for c in got] == expected
    assert all(c.source_ids == ("m0",) for c in got)


def test_rules_read_only_user_messages() -> None:
    assert extract_fact_candidates([_m("I live in Paris.", role="assistant")]) == []


# ---- through TieredMemory ----------------------------------------------------------
def test_rule_facts_resolve_and_keep_history(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "I live in Lisbon. I love sushi. I'm allergic to peanuts."}],
                    session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    facts = {f.text: f for f in memory.facts("u1")}
    assert set(facts) == {"User lives in Lisbon", "User likes sushi", "User is allergic to peanuts"}
    assert all(f.metadata["method"] == "extractive" for f in facts.values())
    assert facts["User is allergic to peanuts"].type == "constraint"
    moved = memory.add("user", "I moved to Porto. I hate sushi.", session_id="s2", user_id="u1")
    memory.end_session("s2", user_id="u1")
    now_valid = {f.text for f in memory.facts("u1")}
    assert now_valid == {"User lives in Porto", "User dislikes sushi", "User is allergic to peanuts"}
    old = facts["User lives in Lisbon"]
    kept = {f.id: f for f in memory.facts("u1", include_invalid=True)}[old.id]  # never destroyed
    assert kept.invalid_at is not None and kept.superseded_by is not None
    porto = next(f for f in memory.facts("u1") if f.text == "User lives in Porto")
    assert porto.source_ids == [moved] and kept.superseded_by == porto.id
    history = memory.fact_history("u1", old.id)
    assert [h.action for h in history] == ["add", "invalidate"]
    assert history[1].details["superseded_by"] == porto.id
    assert memory.facts("u1", type="constraint")[0].text == "User is allergic to peanuts"


@pytest.mark.parametrize("text, slot", [
    ("User lives in Porto", ("residence", 1)),
    ("The user has moved to Porto.", ("residence", 1)),
    ("user's name is Ana", ("name", 1)),
    ("User works for ACME", ("employer", 1)),
    ("User likes sushi", ("pref:sushi", 1)),
    ("User dislikes their commute", ("pref: commute", -1)),  # the rules' key for "I hate my commute"
    ("User\u2019s favourite band is Muse", ("favourite:band", 1)),
    ("User's dog is Rex", ("rel:dog", 1)),
    ("User is vegan", ("diet:vegan", 1)),
    ("User lives in", None),
    ("User thinks Lisbon is nice", None),
    ("Ana lives in Porto", None),  # someone else
])
def test_a_stated_fact_names_the_slot_the_rules_would(text: str, slot: tuple[str, int] | None) -> None:
    assert stated_slot(text) == slot


@pytest.mark.parametrize("said", ["I live in Lisbon.", "My name is Ana.", "I work at ACME.", "I hate my commute.",
                                  "I'm allergic to peanuts.", "I don't eat pork.", "I'm vegan.", "I prefer tea.",
                                  "My favourite band is Muse.", "My wife is Maria.", "I love sushi."])
def test_a_rule_fact_states_its_own_slot(said: str) -> None:
    [cand] = extract_fact_candidates([_m(said)])
    assert stated_slot(cand.text) == (cand.key, cand.polarity)


def test_a_fact_of_another_slot_does_not_replace_a_similar_one(memory: TieredMemory) -> None:
    """"User's brother is called Ana" is as close as 0.88 to "User's sister is called Ana" (MiniLM),
    over merge_similarity: it used to overwrite the sister's fact; the rules name two slots."""
    for said in ("User's sister is called Ana", "User's brother is called Ana", "User likes tea",
                 "User likes green tea"):
        memory.add_fact(said, user_id="u", type="relationship" if "called" in said else "preference")
    assert sorted(f.text for f in memory.facts("u")) == [
        "User likes green tea", "User likes tea", "User's brother is called Ana", "User's sister is called Ana"]
    assert {c.action for c in memory.fact_history("u")} == {"add"}


def test_a_similar_fact_of_no_slot_does_not_rewrite_the_fact_of_a_slot(memory: TieredMemory) -> None:
    """"User works in Paris" is 0.90 from "User lives in Paris" with MiniLM: it rewrote the
    residence fact into itself, which kept the residence slot, so the user's home was gone and
    the next residence ("User lives in Berlin") then invalidated where they work."""
    memory.add_fact("User lives in Paris", user_id="u")
    memory.add_fact("User works in Paris", user_id="u")
    assert sorted(f.text for f in memory.facts("u")) == ["User lives in Paris", "User works in Paris"]
    memory.add_fact("User lives in Berlin", user_id="u")
    assert sorted(f.text for f in memory.facts("u")) == ["User lives in Berlin", "User works in Paris"]
    assert {c.action for c in memory.fact_history("u")} == {"add", "invalidate"}


def test_the_same_value_of_a_slot_in_other_words_confirms_the_fact(memory: TieredMemory) -> None:
    """"User's sister is called Ana" after "My sister is Ana." (or "User moved to Lisbon" after "I
    live in Lisbon.") invalidated the first fact, as if the user had a new sister: the slot's
    value is the same. It is a no-op now; another value still replaces the fact."""
    memory.add("user", "My sister is Ana. I live in Lisbon.", session_id="s", user_id="u")
    memory.end_session("s", user_id="u")
    sister = next(f for f in memory.facts("u") if f.key == "rel:sister")
    assert memory.add_fact("User's sister is called Ana", user_id="u", type="relationship").id == sister.id
    memory.add_fact("User moved to Lisbon", user_id="u")
    memory.add_fact("The user's sister is Ana.", user_id="u", type="relationship")
    assert sorted(f.text for f in memory.facts("u")) == ["User lives in Lisbon", "User's sister is Ana"]
    # confirmed (add_fact's confidence, 1.0, above the rules'), never invalidated
    assert {c.action for c in memory.fact_history("u")} == {"add", "confirm"}
    memory.add_fact("User's sister is called Maria", user_id="u", type="relationship")
    assert sorted(f.text for f in memory.facts("u")) == ["User lives in Lisbon", "User's sister is called Maria"]


@pytest.mark.parametrize("before, after, now", [
    ("I work at ACME.", "I work for Globex now.", "User works at Globex"),  # 0.57 (MiniLM), 0.59 (static)
    ("My boss is Carla.", "My boss is Dmitri.", "User's boss is Dmitri"),
    ("My name is Ana.", "Call me Bartholomew.", "User's name is Bartholomew"),
])
def test_a_session_naming_another_value_of_a_slot_replaces_a_fact_however_unlike(
        memory: TieredMemory, before: str, after: str, now: str) -> None:
    """end_session passed the rules only the related facts at related_similarity (0.6) or more:
    "User works at Globex" is 0.57 from "User works at ACME", so the employer's fact was never
    seen, and both stayed valid (add_fact, which does not filter, replaced it)."""
    for sid, said in (("s1", before), ("s2", after)):
        memory.add("user", said, session_id=sid, user_id="u")
        memory.end_session(sid, user_id="u")
    assert [f.text for f in memory.facts("u")] == [now]
    assert [f.superseded_by for f in memory.facts("u", include_invalid=True) if not f.valid] == \
        [memory.facts("u")[0].id]


def test_an_edited_fact_takes_the_slot_of_its_new_text(memory: TieredMemory) -> None:
    """update_fact kept the slot of the old text: "User likes tea", once "User lives in Lisbon",
    was then invalidated by "User lives in Porto", and a fact edited into the residence slot was
    left beside the next residence, both valid."""
    lisbon = memory.add_fact("User lives in Lisbon", user_id="u")
    memory.update_fact(lisbon.id, user_id="u", text="User likes tea")
    memory.add_fact("User lives in Porto", user_id="u")
    assert sorted(f.text for f in memory.facts("u")) == ["User likes tea", "User lives in Porto"]

    bike = memory.add_fact("User has a red bicycle", user_id="v")
    memory.update_fact(bike.id, user_id="v", text="User lives in Lisbon")
    memory.add_fact("User lives in Porto", user_id="v")
    assert [f.text for f in memory.facts("v")] == ["User lives in Porto"]
    assert memory.facts("v", include_invalid=True)[0].superseded_by is not None


def test_add_fact_in_the_rules_words_replaces_the_fact_of_its_slot(memory: TieredMemory) -> None:
    """Without an LLM, an application's add_fact("User lives in Porto") ends "User lives in
    Lisbon" (said by the user or added), as the user's own "I moved to Porto" does."""
    memory.add_many([{"role": "user", "content": "I live in Lisbon. I love sushi."}], session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    lisbon = next(f for f in memory.facts("u1") if f.text == "User lives in Lisbon")
    porto = memory.add_fact("User lives in Porto", user_id="u1")
    memory.add_fact("User dislikes sushi", user_id="u1", type="preference")
    assert {f.text for f in memory.facts("u1")} == {"User lives in Porto", "User dislikes sushi"}
    kept = {f.id: f for f in memory.facts("u1", include_invalid=True)}[lisbon.id]
    assert kept.superseded_by == porto.id
    assert [h.action for h in memory.fact_history("u1", lisbon.id)] == ["add", "invalidate"]
    memory.add_fact("User moved to Braga", user_id="u1")  # added facts end each other too
    assert {f.text for f in memory.facts("u1")} == {"User moved to Braga", "User dislikes sushi"}
    memory.add_fact("User likes Porto", user_id="u1")  # another slot: kept beside
    assert "User likes Porto" in {f.text for f in memory.facts("u1")}


def test_an_older_statement_ended_later_does_not_overrule_a_newer_fact(memory: TieredMemory) -> None:
    """Sessions ended out of order (an import of old chats, a late end_session): what the user
    said in March cannot invalidate what they said in May."""
    may, march = 1_715_000_000.0, 1_710_000_000.0
    memory.add("user", "I moved to Porto. I hate sushi.", session_id="may", user_id="u1", timestamp=may)
    memory.end_session("may", user_id="u1")
    memory.add("user", "I live in Lisbon. I love sushi.", session_id="march", user_id="u1", timestamp=march)
    memory.end_session("march", user_id="u1")
    assert {f.text for f in memory.facts("u1")} == {"User lives in Porto", "User dislikes sushi"}
    porto = next(f for f in memory.facts("u1") if f.text == "User lives in Porto")
    lisbon = next(f for f in memory.facts("u1", include_invalid=True) if f.text == "User lives in Lisbon")
    assert (lisbon.valid_from, lisbon.invalid_at, lisbon.superseded_by) == (march, porto.valid_from, porto.id)
    assert porto.valid_from == may and porto.valid
    assert [h.action for h in memory.fact_history("u1", porto.id)] == ["add"]  # untouched
    assert [h.action for h in memory.fact_history("u1", lisbon.id)] == ["add"]
    assert memory.fact_history("u1", lisbon.id)[0].details["superseded_by"] == porto.id
    assert [h.fact.text for h in memory.search_facts("where does the user live", user_id="u1")][0] == \
        "User lives in Porto"  # the older statement is not searched as a live fact


def test_same_fact_twice_is_a_noop(memory: TieredMemory) -> None:
    said = []
    for sid in ("a", "b"):
        said.append(memory.add("user", "I'm allergic to peanuts.", session_id=sid, user_id="u1"))
        memory.end_session(sid, user_id="u1")
    assert [f.source_ids for f in memory.facts("u1")] == [said]  # one fact, citing both turns
    assert [h.action for h in memory.fact_history("u1")] == ["add", "confirm"]


def test_crud_and_search(memory: TieredMemory) -> None:
    meta = {"origin": "settings page"}
    snapshot = copy.deepcopy(meta)
    tea = memory.add_fact("User drinks green tea", user_id="u1", type="preference", metadata=meta)
    assert meta == snapshot  # caller input not mutated
    job = memory.add_fact("User works as a nurse in Lyon", user_id="u1", confidence=0.9)
    assert tea.metadata["method"] == "manual" and tea.metadata["origin"] == "settings page"
    assert memory.add_fact("User drinks green tea", user_id="u1", type="preference").id == tea.id  # no-op
    hits = memory.search_facts("what is the user's job?", user_id="u1")
    assert hits[0].fact.id == job.id
    assert [h.fact.id for h in memory.search_facts("job", user_id="u1", type="preference")] == [tea.id]
    assert {f.id: f for f in memory.facts("u1")}[job.id].access_count >= 1
    edited = memory.update_fact(job.id, user_id="u1", text="User works as a surgeon in Lyon", confidence=1.0)
    assert edited.text == "User works as a surgeon in Lyon" and edited.confidence == 1.0
    assert memory.search_facts("surgeon", user_id="u1")[0].fact.id == job.id  # re-indexed
    memory.delete_fact(tea.id, user_id="u1")
    assert [f.id for f in memory.facts("u1")] == [job.id]
    assert [h.action for h in memory.fact_history("u1", tea.id)] == ["add", "delete"]
    assert [h.action for h in memory.fact_history("u1", job.id)] == ["add", "edit"]
    same = memory.update_fact(job.id, user_id="u1", text=" User works as a surgeon in Lyon ", confidence=1.0,
                              type=edited.type, metadata={})
    assert (same.text, same.confidence, same.updated_at) == (edited.text, 1.0, edited.updated_at)  # no write
    # and the history holds no empty edit
    assert [h.action for h in memory.fact_history("u1", job.id)] == ["add", "edit"]
    with pytest.raises(NotFoundError):
        memory.delete_fact(tea.id, user_id="u1")
    with pytest.raises(NotFoundError):
        memory.update_fact(job.id, user_id="someone-else", text="x")


# each case names the argument its error must be about: another error of the same type
# (the file below is missing, too) would pass a case whose own check was gone
@pytest.mark.parametrize("call, about", [
    (lambda m: m.add_fact("", user_id="u1"), "fact text"),
    (lambda m: m.add_fact("User likes \x00 nulls", user_id="u1"), "NUL"),  # PostgreSQL text cannot hold NUL
    (lambda m: m.add_fact("User likes \ud800", user_id="u1"), "surrogate"),  # a lone surrogate is not UTF-8
    (lambda m: m.add_fact("x", user_id="u1", type="opinion"), "fact type"),
    (lambda m: m.add_fact("x", user_id="u1", confidence=2), "confidence"),
    (lambda m: m.facts("u1", type="nonsense"), "fact type"),
    (lambda m: m.search_facts("  ", user_id="u1"), "query"),
    (lambda m: m.facts(""), "user_id"),
    (lambda m: m.facts("u1", include_invalid="no"), "include_invalid"),  # truthy: it would have meant yes
    (lambda m: m.facts("u1", include_invalid=1), "include_invalid"),
    (lambda m: m.import_jsonl("missing.jsonl", skip_invalid="false"), "skip_invalid"),
])
def test_invalid_input(memory: TieredMemory, call: Callable[[TieredMemory], Any], about: str) -> None:
    with pytest.raises(InvalidInputError, match=about):
        call(memory)
    assert memory.facts("u1", include_invalid=True) == []  # nothing half-written


async def test_async_twins(memory: TieredMemory) -> None:
    fact = await memory.aadd_fact("User speaks Portuguese", user_id="u1")
    assert [f.id for f in await memory.afacts("u1")] == [fact.id]
    assert (await memory.asearch_facts("languages", user_id="u1"))[0].fact.id == fact.id


def test_a_fact_needs_a_type(memory) -> None:  # type: ignore[no-untyped-def]
    from tiered_memory import InvalidInputError

    with pytest.raises(InvalidInputError, match="fact type must be one of"):
        memory.add_fact("User likes tea", user_id="u", type=None)
    assert memory.facts("u") == []
