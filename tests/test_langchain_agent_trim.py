"""TieredMemoryMiddleware beside a ``@before_model`` trim that drops the turn's own question.

A trim that keeps the last few messages (``trim_messages``, a ``RemoveMessage`` of all but the
tail) drops the user's message once a tool loop grows; the middleware read both the question to
recall for and where the turn starts from the trimmed messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder, get_time, keep_last_three, time_call
from tiered_memory import TieredMemory


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_a_trimmed_away_question_is_still_what_memory_is_recalled_for_and_the_turn_is_stored(
        memory: TieredMemory, run: str) -> None:
    memory.add_many([{"role": "user", "content": "My favourite colour is teal."},
                     {"role": "assistant", "content": "Teal is lovely."}], session_id="old", user_id="u1")
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[time_call("c1"), time_call("c2"), AIMessage("Noon, and teal.")], callbacks=[rec])
    agent = create_agent(model, [get_time], middleware=[keep_last_three, TieredMemoryMiddleware(memory)])
    given = {"messages": [HumanMessage("What is my favourite colour, and the time?")]}
    context = {"user_id": "u1", "session_id": "new"}
    out = agent.invoke(given, context=context) if run == "invoke" else asyncio.run(agent.ainvoke(given, context=context))
    assert set(out) == {"messages"}  # the question the middleware keeps is private state, not output
    assert len(rec.prompts) == 3
    assert not any(isinstance(m, HumanMessage) for m in rec.last)  # the trim did drop the question
    for prompt in rec.prompts:  # the last call got no memory: it had no user message to recall for
        assert "favourite colour is teal" in "\n".join(m.text for m in prompt if isinstance(m, SystemMessage))
    stored = memory.get_messages("new", user_id="u1")  # the second call, its result and the answer were lost
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert stored[-1].content == "Noon, and teal."


_SUMMARY = HumanMessage("Earlier: ...", additional_kwargs={"lc_source": "summarization"})


@pytest.mark.parametrize(("messages", "start"), [
    ([], None),
    ([HumanMessage("q"), AIMessage("a")], 0),
    ([HumanMessage("q1"), AIMessage("a1"), HumanMessage("q2"), time_call("c")], 2),
    ([_SUMMARY, time_call("c")], 1),  # the user's message was summarized away: the turn follows the summary
    ([time_call("c1"), AIMessage("")], 0),  # trimmed away: the turn is what is left (stored ones are skipped)
])
def test_turn_start(messages: list[Any], start: int | None) -> None:
    from langchain_tiered_memory.middleware import turn_start

    assert turn_start(messages) == start
