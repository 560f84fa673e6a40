"""TieredMemoryMiddleware with a model that continues its previous response on the server:
``ChatOpenAI(use_previous_response_id=True)`` (the Responses API) sends only the messages after
the last AI message carrying a ``resp_`` id. In a checkpointed thread that message is the
previous turn's answer, so the memory recalled for a new question goes just before that
question, where the request still holds it (real ChatOpenAI, a local stand-in of the API, a real
InMemorySaver)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_tiered_memory import TieredMemoryMiddleware
from lc_support import responses_api_server
from tiered_memory import TieredMemory
from tiered_memory.context.render import PREAMBLE


def _seed(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "My favourite colour is teal."},
                     {"role": "assistant", "content": "Teal is lovely."}], session_id="old", user_id="u1")
    memory.add_many([{"role": "user", "content": "My sister Marta lives in Oslo."},
                     {"role": "assistant", "content": "Oslo is a fine city."}], session_id="older", user_id="u1")
    memory.add_many([{"role": "user", "content": "My sister Marta lives in Lima."}], session_id="x", user_id="u2")


def _texts(items: list[dict[str, Any]], role: str) -> list[str]:
    """The text of each input item of ``role`` in a Responses request."""
    out = []
    for item in items:
        if item.get("role") == role:
            content = item["content"]
            out.append(content if isinstance(content, str) else "".join(b.get("text", "") for b in content))
    return out


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_the_memory_recalled_for_a_new_question_reaches_a_model_that_chains_responses(
        memory: TieredMemory, run: str) -> None:
    from langchain_openai import ChatOpenAI

    _seed(memory)
    with responses_api_server() as (url, bodies):
        model = ChatOpenAI(model="gpt-4.1", base_url=url, api_key="not-needed",
                           use_previous_response_id=True, max_retries=0)
        agent = create_agent(model, [], system_prompt="Be brief.", checkpointer=InMemorySaver(),
                             middleware=[TieredMemoryMiddleware(memory, user_id="u1")])
        cfg: Any = {"configurable": {"thread_id": "t1"}}
        questions = ["What is my favourite colour?", "Where does my sister Marta live?"]

        async def both() -> Any:  # on one loop: the model's async client is bound to it
            for question in questions:
                out = await agent.ainvoke({"messages": [HumanMessage(question)]}, cfg)
            return out

        if run == "invoke":
            for question in questions:
                out = agent.invoke({"messages": [HumanMessage(question)]}, cfg)
        else:
            out = asyncio.run(both())
    first, second = bodies
    assert "previous_response_id" not in first  # the first turn is sent whole, memory in the system message
    assert "Be brief." in _texts(first["input"], "system")[0] and "teal" in _texts(first["input"], "system")[0]
    # the second continues the first response and sends what follows it: the memory for the new
    # question, the quoted block as it is built everywhere, in a system item of its own, then the question
    assert second["previous_response_id"] == "resp_1"
    assert [i.get("role") for i in second["input"]] == ["system", "user"]
    memory_text = _texts(second["input"], "system")[0]
    assert memory_text.startswith(PREAMBLE + "\n<memory>\n") and memory_text.endswith("\n</memory>")
    assert "Oslo" in memory_text and "Lima" not in memory_text and "Be brief." not in memory_text
    assert _texts(second["input"], "user") == ["Where does my sister Marta live?"]
    # the memory is the request's, never the thread's: the checkpointed state holds the conversation
    assert [type(m) for m in out["messages"]] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert not any("<memory>" in m.text for m in out["messages"])
    assert [m.content for m in memory.get_messages("t1", user_id="u1")] == [
        "What is my favourite colour?", "reply 1", "Where does my sister Marta live?", "reply 2"]


def _answer(text: str, rid: str | None = None, *, call: str | None = None) -> AIMessage:
    calls = [{"name": "get_time", "args": {}, "id": call, "type": "tool_call"}] if call else []
    return AIMessage(content=text, tool_calls=calls, response_metadata={"id": rid} if rid else {})


_SUMMARY = HumanMessage("Earlier: ...", additional_kwargs={"lc_source": "summarization"})


@pytest.mark.parametrize(("messages", "chains", "position"), [
    ([HumanMessage("q")], True, "system"),  # the first call: nothing to continue, sent whole
    ([HumanMessage("q1"), _answer("a1", "resp_1"), HumanMessage("q2")], False, "system"),  # not chained
    ([HumanMessage("q1"), _answer("a1", "resp_1"), HumanMessage("q2")], True, 2),  # before the new question
    ([HumanMessage("q1"), _answer("a1", "chatcmpl-1"), HumanMessage("q2")], True, "system"),  # no stored response
    # a call after a tool call continues this turn's response, which holds this turn's memory
    ([HumanMessage("q1"), _answer("a1", "resp_1"), HumanMessage("q2"), _answer("", "resp_2", call="c"),
      ToolMessage("12:00", tool_call_id="c")], True, None),
    # an earlier turn ended on a tool's result (return_direct): the memory goes after it, not between
    ([HumanMessage("q1"), _answer("", "resp_1", call="c"), ToolMessage("12:00", tool_call_id="c"),
      HumanMessage("q2")], True, 3),
    ([_SUMMARY, _answer("a1", "resp_1"), HumanMessage("q2")], True, 2),  # a summary is not the turn
    ([_answer("a1", "resp_1"), _SUMMARY], True, 2),  # the question summarized away: the turn follows the summary
])
def test_memory_position(messages: list[Any], chains: bool, position: int | str | None) -> None:
    from langchain_tiered_memory.middleware import memory_position

    assert memory_position(messages, chains=chains) == position
