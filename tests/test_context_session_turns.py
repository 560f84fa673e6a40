"""build_context and the session it is built for. The session's own turns are the conversation
(the ``recent`` turns), never past turns to recall: left out, they are reported once, under
``recent``; they are not the past turns a fact must be about as close to the query as
(``BudgetConfig.fact_relevance``). Its faded working-memory items are reported too."""

from __future__ import annotations

from collections import Counter
from typing import Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _report(memory: TieredMemory, query: str, budget: int) -> tuple[Counter[str], set[str]]:
    ctx = memory.build_context(query, user_id="u1", session_id="now", max_tokens=budget)
    shown = {i.id for s in ctx.sections for i in s.items} | {i.id for i in ctx.recent}
    return Counter(d.id for d in ctx.dropped), shown


@pytest.mark.parametrize("budget", [1, 5])
def test_a_newest_turn_over_the_budget_is_reported_once(make_memory: Callable[..., TieredMemory],
                                                        budget: int) -> None:
    """A newest turn too long for even the cut marker is left out of the recent turns, and was
    then searched again as a past turn and reported a second time, under ``turns``."""
    memory = make_memory(embedder=StaticEmbedder())
    memory.add("user", "hello there, where is the billing database hosted?", session_id="now", user_id="u1")
    dropped, shown = _report(memory, "billing database", budget)
    assert set(dropped) == {m.id for m in memory.get_messages("now", user_id="u1")} and not shown
    assert max(dropped.values()) == 1, dropped


def test_the_turns_before_a_cut_newest_turn_are_reported_once(make_memory: Callable[..., TieredMemory]) -> None:
    """The newest turn cut to the budget: the session's earlier turns, left out of the recent
    turns ("buffer over its share"), were searched again as past turns and reported twice."""
    memory = make_memory(embedder=StaticEmbedder())
    memory.add_many([{"role": "user", "content": "Where is the billing database hosted?"},
                     {"role": "assistant", "content": "The billing database is hosted in Frankfurt."}],
                    session_id="now", user_id="u1")
    memory.add("user", "billing database " + "a long paste about the billing database " * 100,
               session_id="now", user_id="u1")
    dropped, shown = _report(memory, "billing database", 400)  # the paste is some 700 tokens, within the buffer's
    earlier = {m.id for m in memory.get_messages("now", user_id="u1")[:2]}
    assert earlier <= set(dropped) and not earlier & shown
    assert max(dropped.values()) == 1, dropped


FACTS = ["User's billing database is PostgreSQL 16", "User uses Stripe for billing",
         "User's invoices are kept in a SQL database", "User lives in Lisbon"]


def test_the_question_just_stored_does_not_raise_the_bar_for_facts(memory: TieredMemory) -> None:
    """A chat stores the user's question, then builds the context for it: the question is in the
    session's recent turns, its cosine to itself 1. It was taken for the best past turn, so a
    fact had to reach 0.7 cosine to be shown, and facts the past turns let in (0.65, 0.59 with
    MiniLM, the past turns 0.38) went, unreported. The bar is the past turns' again."""
    memory.add_many([{"role": "user", "content": "We moved the invoices service to a new server last week."},
                     {"role": "assistant", "content": "Noted, the invoices service runs on the new server."}],
                    session_id="old", user_id="u1")
    for text in FACTS:
        memory.add_fact(text, user_id="u1")
    question = "which database do we use for billing?"

    def facts() -> list[str]:
        ctx = memory.build_context(question, user_id="u1", session_id="now", max_tokens=2000)
        section = ctx.section("facts")
        return [i.text for i in section.items] if section else []

    before = facts()
    memory.add("user", question, session_id="now", user_id="u1")
    assert facts() == before, before
    assert len(before) > 1 and "User lives in Lisbon" not in before  # the bar still keeps the far fact out


def test_a_faded_working_item_is_reported(memory: TieredMemory) -> None:
    """A working-memory item whose decayed importance is under ``prune_below`` is not shown (being
    shown would count an access, which spares it from the prune); it was left out unreported,
    though ``dropped`` lists each item left out. It is listed under ``session``, as shown items
    are named (``wm:<id>``)."""
    wm = memory.working_memory("now", user_id="u1")
    kept = wm.remember("User is migrating invoices to the new database", importance=0.9)
    faint = wm.remember("User mentioned the weather once", importance=0.01)
    ctx = memory.build_context("invoices", user_id="u1", session_id="now", max_tokens=2000)
    assert [i.id for i in ctx.section("session").items] == [f"wm:{kept.id}"]
    faded = [d for d in ctx.dropped if d.id == f"wm:{faint.id}"]
    assert [(d.section, d.reason) for d in faded] == [
        ("session", "faded: its decayed importance is under ConsolidationConfig.prune_below")]
    assert faded[0].tokens > 0
