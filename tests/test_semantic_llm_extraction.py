"""Semantic memory with a model: the facts a (scripted) LLM extracts and the judge that resolves
them against the stored ones, and the extractive rules each failure falls back to."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

import pytest

from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.config import LLMConfig
from tiered_memory.testing import ScriptedLLM, fenced, malformed, timeout

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

EPISODE = {"summary": "Talked about the user.", "entities": [], "decisions": [], "open_questions": [],
           "key_facts": []}


def _llm_facts(*facts: dict[str, Any]) -> dict[str, Any]:
    return {"facts": list(facts)}


def test_llm_extraction_and_judgement(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={
        "facts": [
            fenced(_llm_facts({"type": "preference", "text": "User drinks green tea every morning",
                               "confidence": 0.9, "sources": [1]})),
            _llm_facts({"type": "preference", "text": "User drinks green tea with honey in the morning",
                        "confidence": 0.8, "sources": [1, 99]}),
        ],
        "resolve": [{"action": "update", "target": 1, "text": "User drinks green tea with honey every morning"}],
        "episode": [EPISODE, EPISODE],
    })
    memory = make_memory(llm=llm)
    first = memory.add("user", "Every morning I have green tea.", session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    [fact] = memory.facts("u1")
    assert fact.metadata["method"] == "llm" and fact.confidence == 0.9 and fact.source_ids == [first]
    second = memory.add("user", "I add honey to my tea.", session_id="s2", user_id="u1")
    memory.end_session("s2", user_id="u1")
    [merged] = memory.facts("u1")
    assert merged.id == fact.id and merged.text == "User drinks green tea with honey every morning"
    assert merged.source_ids == [first, second]  # source 99 does not exist and is ignored
    assert [h.action for h in memory.fact_history("u1", fact.id)] == ["add", "update"]
    resolve_prompt = [c for c in llm.calls if c.task == "resolve"][0].messages[1]["content"]
    assert "[1]" in resolve_prompt and "green tea every morning" in resolve_prompt


@pytest.mark.parametrize("facts_script", [
    [malformed(), malformed()],
    [{"facts": [{"type": "opinion", "text": "x"}]}, {"facts": "none"}],  # wrong types
    [timeout()],
    [ValueError("boom")],
    [_llm_facts({"type": "fact", "text": "\x1c"})] * 2,  # blank to str.strip: no blank fact is stored
])
def test_llm_extraction_failure_falls_back_to_rules(make_memory: Callable[..., TieredMemory],
                                                    facts_script: list[Any]) -> None:
    llm = ScriptedLLM(by_task={"facts": facts_script, "episode": [EPISODE]})
    memory = make_memory(llm=llm, config=MemoryConfig(llm=LLMConfig(timeout_s=0.2)))
    memory.add("user", "I live in Berlin.", session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    [fact] = memory.facts("u1")
    assert fact.text == "User lives in Berlin"
    assert fact.metadata["method"] == "extractive" and "llm_error" in fact.metadata


def test_failed_judgement_falls_back_to_rules(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={
        "facts": [_llm_facts({"type": "fact", "text": "User owns a red bicycle"}),
                  _llm_facts({"type": "fact", "text": "User owns a red bicycle"})],
        "resolve": [malformed(), malformed()],
        "episode": [EPISODE, EPISODE],
    })
    memory = make_memory(llm=llm)
    for sid in ("a", "b"):
        memory.add("user", "My bike is red.", session_id=sid, user_id="u1")
        memory.end_session(sid, user_id="u1")
    assert [f.text for f in memory.facts("u1")] == ["User owns a red bicycle"]  # rules: same text, no-op


def test_a_blank_merged_text_from_the_judge_falls_back_to_rules(make_memory: Callable[..., TieredMemory]) -> None:
    # cited: a fact citing no turn cites those that say it ("My bike is red." does not), so a
    # restatement would name no turn (confirmed by its span's date: the last test here)
    llm = ScriptedLLM(by_task={
        "facts": [_llm_facts({"type": "fact", "text": "User owns a red bicycle", "sources": [1]}),
                  _llm_facts({"type": "fact", "text": "User owns a red bicycle", "sources": [1]})],
        "resolve": [{"action": "update", "target": 1, "text": "\x1e"}] * 2,
        "episode": [EPISODE, EPISODE],
    })
    memory = make_memory(llm=llm)
    for sid in ("a", "b"):
        memory.add("user", "My bike is red.", session_id=sid, user_id="u1")
        memory.end_session(sid, user_id="u1")
    assert [f.text for f in memory.facts("u1")] == ["User owns a red bicycle"]  # not "\x1e"
    assert [h.action for h in memory.fact_history("u1")] == ["add", "confirm"]  # the rules: said again


def test_a_message_the_model_cites_twice_is_one_source(make_memory: Callable[..., TieredMemory]) -> None:
    llm = ScriptedLLM(by_task={
        "facts": [_llm_facts({"type": "fact", "text": "User lives in Berlin", "sources": [2, 1, 2, 0, 1, 2]})],
        "episode": [EPISODE],
    })
    memory = make_memory(llm=llm)
    first, second = memory.add_many([{"role": "user", "content": "I live in Berlin."},
                                     {"role": "user", "content": "Yes, Berlin, for years."}], session_id="s", user_id="u1")
    memory.end_session("s", user_id="u1")
    [fact] = memory.facts("u1")
    assert fact.source_ids == [second, first]
    assert memory.fact_history("u1", fact.id)[0].details["source_ids"] == [second, first]


@pytest.mark.parametrize("old, new", [
    ("User lives in Paris", "User lives in Berlin"),
    ("User likes coriander", "User dislikes coriander"),  # the same slot, the other polarity
])
@pytest.mark.parametrize("judge", [[ValueError("judge down")] * 2, [malformed(), malformed()]])
def test_a_fact_the_llm_says_in_a_slots_words_replaces_that_slots_fact_when_rules_decide(
        make_memory: Callable[..., TieredMemory], old: str, new: str, judge: list[Any]) -> None:
    """The model's "User lives in Berlin" is in the slot the rules read from those words
    (:func:`~tiered_memory.slots.stated_slot`): with the judge failing, the rules
    replace the slot's fact, as they do the user's own "I moved to Berlin" and ``add_fact``'s."""
    llm = ScriptedLLM(by_task={"facts": [_llm_facts({"type": "fact", "text": old, "sources": [1]}),
                                         _llm_facts({"type": "fact", "text": new, "sources": [1]})],
                               "resolve": judge, "episode": [EPISODE, EPISODE]})
    memory = make_memory(llm=llm)
    memory.add("user", "Some news about me.", session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    [first] = memory.facts("u1")
    memory.add("user", "More news about me.", session_id="s2", user_id="u1")
    memory.end_session("s2", user_id="u1")
    assert "resolve" in llm.tasks()  # the judge was asked, and failed
    [now] = memory.facts("u1")
    assert now.text == new and now.metadata["resolution"] == "rules"
    [gone] = [f for f in memory.facts("u1", include_invalid=True) if not f.valid]
    assert gone.id == first.id and gone.text == old
    assert [h.action for h in memory.fact_history("u1", first.id)] == ["add", "invalidate"]


def test_the_judge_still_resolves_a_fact_the_llm_says_in_a_slots_words(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A slot read from the model's words changes what the rules do, not who decides: a
    working judge is asked (and shown the slot's fact), and its answer stands."""
    llm = ScriptedLLM(by_task={
        "facts": [_llm_facts({"type": "fact", "text": "User lives in Berlin"}),
                  _llm_facts({"type": "fact", "text": "User lives in Berlin, near the Spree"})],
        "resolve": [{"action": "noop", "target": 1}], "episode": [EPISODE, EPISODE]})
    memory = make_memory(llm=llm)
    for sid in ("s1", "s2"):
        memory.add("user", "Some news about me.", session_id=sid, user_id="u1")
        memory.end_session(sid, user_id="u1")
    assert [f.text for f in memory.facts("u1", include_invalid=True)] == ["User lives in Berlin"]
    assert "User lives in Berlin" in [c for c in llm.calls if c.task == "resolve"][0].messages[1]["content"]


@pytest.mark.parametrize("second, valid", [
    ("User lives in Porto", ["User lives in Porto"]),  # another value: the slot's fact is replaced
    ("User moved to Lisbon", ["User lives in Lisbon"]),  # the same value: known, nothing added
])
def test_a_judges_add_into_an_occupied_slot_leaves_one_fact_in_the_slot(
        make_memory: Callable[..., TieredMemory], second: str, valid: list[str]) -> None:
    """The judge's "add" of the model's "User lives in Porto", the slot's fact "User lives in
    Lisbon" shown to it, stored a second valid residence (a valid judgement won over the slot
    rule). The slot's rule decides such a judgement, and the history says the judge was overruled."""
    llm = ScriptedLLM(by_task={"facts": [_llm_facts({"type": "fact", "text": "User lives in Lisbon"}),
                                         _llm_facts({"type": "fact", "text": second})],
                               "resolve": [{"action": "add"}], "episode": [EPISODE, EPISODE]})
    memory = make_memory(llm=llm)
    for sid in ("s1", "s2"):
        memory.add("user", "Some news about me.", session_id=sid, user_id="u1")
        memory.end_session(sid, user_id="u1")
    assert "resolve" in llm.tasks()  # the judge was asked, and said add
    assert [f.text for f in memory.facts("u1")] == valid
    [lisbon] = [f for f in memory.facts("u1", include_invalid=True) if f.text == "User lives in Lisbon"]
    if valid == ["User lives in Porto"]:
        [porto] = memory.facts("u1")
        assert (lisbon.valid, lisbon.superseded_by) == (False, porto.id)
        [change] = [c for c in memory.fact_history("u1", lisbon.id) if c.action == "invalidate"]
        assert "contradicts the fact in slot 'residence'" in change.details["reason"]
        assert "the judge said add" in change.details["reason"] and change.details["method"] == "rules"
        assert porto.metadata["resolution"] == "rules"
    else:
        assert len(memory.facts("u1", include_invalid=True)) == 1


def _rewritten_into_a_slot_then(make_memory: Callable[..., TieredMemory], third: str) -> TieredMemory:
    """Three sessions of u1: "User is based in Paris" (of no slot), which a judge rewrites into
    "User lives in Paris" (an update, which kept the old fact's key, none); then ``third``
    while the judge is down, so the rules decide. Asserts the rewrite is u1's one fact after s2."""
    llm = ScriptedLLM(by_task={
        "facts": [_llm_facts({"type": "fact", "text": "User is based in Paris"}),
                  _llm_facts({"type": "fact", "text": "User lives in Paris"}),
                  _llm_facts({"type": "fact", "text": third})],
        "resolve": [{"action": "update", "target": 1, "text": "User lives in Paris"},
                    ValueError("judge down"), ValueError("judge down")],
        "episode": [EPISODE] * 3})
    memory = make_memory(llm=llm)
    for sid in ("s1", "s2", "s3"):
        memory.add("user", "Some news about me.", session_id=sid, user_id="u1")
        memory.end_session(sid, user_id="u1")
        if sid == "s2":
            assert [f.text for f in memory.facts("u1")] == ["User lives in Paris"]
    return memory


def test_a_stored_fact_without_a_slot_is_in_the_slot_its_words_name(make_memory: Callable[..., TieredMemory]) -> None:
    """A fact in a slot's words stored without a key (here the judge's rewrite of a fact of no
    slot, which kept its key, none, until the rewrite stored the slot its words name; the
    model's facts stored before they had slots) is in that slot for the rules: the next
    residence replaces it rather than standing beside it."""
    memory = _rewritten_into_a_slot_then(make_memory, "User lives in Berlin")
    assert [f.text for f in memory.facts("u1")] == ["User lives in Berlin"]
    assert [f.text for f in memory.facts("u1", include_invalid=True) if not f.valid] == ["User lives in Paris"]


def test_a_stored_fact_without_a_slot_is_compared_however_unlike_the_new_fact_of_its_slot(
        make_memory: Callable[..., TieredMemory]) -> None:
    """end_session's related facts keep those of the candidate's slot below related_similarity
    (0.6): it read the slot from the stored key only, so the judge's keyless "User lives in
    Paris" was dropped for "User moved to Berlin" (0.52 with MiniLM, 0.42 static) and both stayed valid.
    (The rewrite is stored in the slot its words name now; the filter reads it through slot_of.)"""
    memory = _rewritten_into_a_slot_then(make_memory, "User moved to Berlin")
    [paris] = memory.facts("u1", include_invalid=True)[:1]
    assert (paris.text, paris.key) == ("User lives in Paris", "residence")  # the judge's rewrite, in its words' slot
    assert [f.text for f in memory.facts("u1")] == ["User moved to Berlin"]


def test_a_long_llm_error_kept_in_the_metadata_leaves_the_session_exportable(
        make_memory: Callable[..., TieredMemory], tmp_path: Any) -> None:
    """A failed LLM call's error was kept whole in the metadata of every fact and episode the
    rules then made ("llm_error"): a provider's error with a long body (an HTML page, 70,000
    characters here) stored them over max_metadata_bytes, and export_jsonl left them all out.
    The error is kept cut to a few hundred characters."""
    llm = ScriptedLLM(default=RuntimeError("<html>" + "x" * 70_000))
    memory = make_memory(llm=llm)
    memory.add("user", "I live in Lisbon.", session_id="s", user_id="u")
    episode = memory.end_session("s", user_id="u")
    [fact] = memory.facts("u")
    assert fact.metadata["llm_error"].startswith("LLMError: the LLM failed: RuntimeError: <html>xxx")
    assert len(fact.metadata["llm_error"]) <= 1_000 and len(episode.metadata["llm_error"]) <= 1_000
    lines = memory.export_jsonl(tmp_path / "e.jsonl", user_id="u")
    assert lines == 4  # the turn, the fact, the episode, the session's cursor


def test_a_facts_answer_of_endless_facts_keeps_the_first_and_judges_no_more(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A model that lists 200 facts for one short session (a loop, or each line of a pasted log)
    made end_session ask the judge 200 times, a minute each with a real model's timeout: the
    answer is kept to its first MAX_FACTS facts, in the model's order, as an episode's lists are."""
    from tiered_memory.layers.llm_facts import MAX_FACTS
    endless = _llm_facts(*({"type": "fact", "text": f"User owns billing shard number {n}", "sources": [1]}
                           for n in range(200)))
    llm = ScriptedLLM(by_task={"facts": [endless], "episode": [EPISODE]},
                      default=lambda msgs: {"action": "add"})
    memory = make_memory(llm=llm)
    memory.add("user", "I own all the billing shards.", session_id="s1", user_id="u1")
    memory.end_session("s1", user_id="u1")
    stored = sorted(int(f.text.rsplit(" ", 1)[1]) for f in memory.facts("u1"))
    assert stored == list(range(MAX_FACTS))
    assert sum(c.task == "resolve" for c in llm.calls) < MAX_FACTS


@pytest.mark.record_stores("sqlite")
def test_an_invalid_fact_is_dropped_and_the_valid_ones_kept(make_memory: Callable[..., TieredMemory],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """One invalid fact (a type no fact has, a blank text, a confidence of true, a bare string)
    made the whole answer invalid: the model was asked again, then the rules stood in, and the
    valid facts were lost. Each fact is validated alone: an invalid one is dropped and logged
    with their count, the others are stored, and the model is not asked again."""
    llm = ScriptedLLM(by_task={"facts": [_llm_facts(
        {"type": "fact", "text": "User lives in Berlin", "sources": [1]},
        {"type": "opinion", "text": "User likes Berlin"},
        {"type": "fact", "text": "   "},
        {"type": "fact", "text": "User has a budget", "confidence": True},
        "User speaks German",
        {"type": "preference", "text": "User drinks green tea", "confidence": 0.7, "sources": [2]})],
        "episode": [EPISODE]})
    memory = make_memory(llm=llm, embedder=StaticEmbedder())  # the embedder is not the point
    first, second = memory.add_many([{"role": "user", "content": "I live in Berlin."},
                                     {"role": "user", "content": "I drink green tea."}], session_id="s", user_id="u1")
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        memory.end_session("s", user_id="u1")
    assert llm.tasks() == ["facts", "episode"]  # taken, not asked again
    assert sorted((f.text, f.metadata["method"], f.source_ids) for f in memory.facts("u1")) == [
        ("User drinks green tea", "llm", [second]), ("User lives in Berlin", "llm", [first])]
    [warning] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "4 invalid entries" in warning and "facts.1.type" in warning


@pytest.mark.record_stores("sqlite")
@pytest.mark.parametrize("sources", [None, [], [0, 4, 99]])
def test_a_fact_citing_no_turn_of_the_span_cites_the_user_turns_that_say_it(
        make_memory: Callable[..., TieredMemory], sources: list[int] | None) -> None:
    """A fact the model cited no turn of the span for (no sources, or only numbers outside it)
    cited every user turn of the span, most of which do not say it. It cites the user's turns that
    say all it says (promotion's matcher, :func:`~tiered_memory.layers.resolution.turns_saying`),
    or none; one citing none is dated by the span's newest turn (it was said by then), not now."""
    facts = [{"type": "preference", "text": "User drinks green tea every morning"},
             {"type": "fact", "text": "User is cosmopolitan"}]
    if sources is not None:
        facts = [{**f, "sources": sources} for f in facts]
    llm = ScriptedLLM(by_task={"facts": [_llm_facts(*facts)], "episode": [EPISODE]})
    memory = make_memory(llm=llm, embedder=StaticEmbedder())
    t0 = 1_600_000_000.0
    first, _, _ = memory.add_many([
        {"role": "user", "content": "Every morning I drink green tea.", "timestamp": t0},
        {"role": "assistant", "content": "Green tea every morning: you drink well.", "timestamp": t0 + 60},  # not the user
        {"role": "user", "content": "I also work in Berlin.", "timestamp": t0 + 120}], session_id="s", user_id="u1")
    memory.end_session("s", user_id="u1")
    by_text = {f.text: f for f in memory.facts("u1")}
    tea, cosmopolitan = by_text["User drinks green tea every morning"], by_text["User is cosmopolitan"]
    assert tea.source_ids == [first] and cosmopolitan.source_ids == []  # no turn says it
    assert tea.valid_from == t0 and cosmopolitan.valid_from == t0 + 120


@pytest.mark.record_stores("sqlite")
def test_a_fact_the_model_restates_citing_no_turn_is_confirmed_as_of_the_spans_newest_turn(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A stored fact the model states again in a later span, citing no turn that says it, was a
    no-op that wrote nothing (no new turn to join its sources): the fact was not seen as said
    again. It is confirmed, the entry dated by the span's newest turn (``said_at``); a span no
    newer than the fact's last statement (old turns imported late, a span read again) confirms nothing."""
    berlin = {"type": "fact", "text": "User lives in Berlin"}
    llm = ScriptedLLM(by_task={"facts": [_llm_facts({**berlin, "sources": [1]}), *[_llm_facts(berlin)] * 2],
                               "resolve": [{"action": "noop", "target": 1}] * 2, "episode": [EPISODE] * 3})
    memory = make_memory(llm=llm, embedder=StaticEmbedder())
    t0, day = 1_600_000_000.0, 86_400.0
    for sid, said, at in (("s1", "I live in Berlin.", t0), ("s2", "Work was long today.", t0 + day)):
        memory.add("user", said, session_id=sid, user_id="u1", timestamp=at)
        memory.end_session(sid, user_id="u1")
    [fact] = memory.facts("u1")
    add, confirm = memory.fact_history("u1", fact.id)
    assert (add.action, confirm.action) == ("add", "confirm")
    assert confirm.details["source_ids"] == [] and confirm.details["said_at"] == t0 + day
    assert fact.updated_at == confirm.at and fact.source_ids == add.details["source_ids"]
    memory.add("user", "Long day.", session_id="old", user_id="u1", timestamp=t0 + day / 2)  # imported late
    memory.end_session("old", user_id="u1")
    assert [h.action for h in memory.fact_history("u1", fact.id)] == ["add", "confirm"]
    assert llm.tasks().count("facts") == 3


@pytest.mark.record_stores("sqlite")
def test_a_restatement_older_than_the_facts_update_confirms_nothing(make_memory: Callable[..., TieredMemory]) -> None:
    """A fact updated by a later statement (said more fully) was last said then, but its last
    statement was still its first (``valid_from``; an update recorded no ``said_at``): the model's
    restatement of it, citing no turn, in a span older than the update (old turns imported late)
    confirmed it, as news. The ``update`` entry is dated by its statement (``said_at``), as a
    ``confirm`` is, and counts as the fact's last statement."""
    berlin = {"type": "fact", "text": "User lives in Berlin, Germany"}
    llm = ScriptedLLM(by_task={
        "facts": [_llm_facts({"type": "fact", "text": "User lives in Berlin", "sources": [1]}),
                  _llm_facts({**berlin, "sources": [1]}), _llm_facts(berlin)],
        "resolve": [{"action": "update", "target": 1, "text": berlin["text"]}, {"action": "noop", "target": 1}],
        "episode": [EPISODE] * 3})
    memory = make_memory(llm=llm, embedder=StaticEmbedder())
    t0, day = 1_600_000_000.0, 86_400.0
    for sid, said, at in (("s1", "I live in Berlin.", t0), ("s2", "Berlin, Germany, that is.", t0 + 2 * day),
                          ("old", "Long day.", t0 + day)):  # the last imported late
        memory.add("user", said, session_id=sid, user_id="u1", timestamp=at)
        memory.end_session(sid, user_id="u1")
    [fact] = memory.facts("u1")
    assert fact.text == berlin["text"] and llm.tasks().count("resolve") == 2
    history = memory.fact_history("u1", fact.id)
    assert [h.action for h in history] == ["add", "update"]  # no confirm
    assert history[1].details["said_at"] == t0 + 2 * day


@pytest.mark.record_stores("sqlite")
def test_an_imported_confirm_said_at_no_turn_could_have_holds_back_no_later_confirm(
        make_memory: Callable[..., TieredMemory], tmp_path: Any) -> None:
    """A fact's last statement was the latest ``said_at`` of its confirm entries, whatever the
    number: an import's entry of ``said_at`` 1e300 (a hand-edited export; history details are any
    JSON) made every later restatement citing no turn look older, so none confirmed it again, ever.
    A ``said_at`` no turn's timestamp could be (not epoch seconds in a message's range) is not counted."""
    t0, day = 1_600_000_000.0, 86_400.0
    text = "User lives in Berlin"
    fact = {"id": "f1", "user_id": "u1", "type": "fact", "text": text, "confidence": 0.9,
            "created_at": t0, "updated_at": t0, "valid_from": t0}
    history = [{"fact_id": "f1", "action": "add", "new_text": text, "at": t0, "details": {}},
               {"fact_id": "f1", "action": "confirm", "old_text": text, "new_text": text, "at": t0,
                "details": {"source_ids": [], "said_at": 1e300}}]
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps({"type": "fact", "fact": fact, "history": history}) + "\n", encoding="utf-8")
    llm = ScriptedLLM(by_task={"facts": [_llm_facts({"type": "fact", "text": text})],
                               "resolve": [{"action": "noop", "target": 1}], "episode": [EPISODE]})
    memory = make_memory(llm=llm, embedder=StaticEmbedder())
    assert memory.import_jsonl(path).facts_imported == 1
    memory.add("user", "Work was long today.", session_id="s2", user_id="u1", timestamp=t0 + day)
    memory.end_session("s2", user_id="u1")
    *_, confirm = memory.fact_history("u1", "f1")
    assert (confirm.action, confirm.details.get("said_at")) == ("confirm", t0 + day)
