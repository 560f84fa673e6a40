"""TieredMemoryMiddleware among other middleware: what the session holds is what the agent's hooks left.

LangChain runs ``after_model`` hooks in the reverse of the listed order, so a middleware listed
before the memory (``PIIMiddleware(apply_to_output=True)``, a guardrail) edits or refuses the
model's reply *after* the memory's own ``after_model`` has seen it. ``after_agent`` hooks run in
the reverse order too, and the memory's is its last chance to store: a middleware that rewrites the
final reply there must be listed *after* the memory (README, LangChain: agents).
``before_model`` hooks (``PIIMiddleware``'s input redaction, a trim) run before every model call,
after the memory read the run's question: it recalls for what they left of it, and keeps no text of it
they have not had (its private state is streamed and checkpointed).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (AgentMiddleware, AgentState, ModelCallLimitMiddleware, PIIMiddleware,
                                        ToolCallLimitMiddleware, before_model)
from langchain.agents.middleware.pii import PIIDetectionError
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.runtime import Runtime

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.agent_turn import current_query, is_limit_notice, kept_query
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder, get_time, keep_last_three, time_call
from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.embedding import Embedder
from tiered_memory.testing import CountingEmbedder

_CTX = {"user_id": "u", "session_id": "s"}


def _stored(memory: TieredMemory) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in memory.get_messages("s", user_id="u")]


@pytest.mark.parametrize("run", ["invoke", "ainvoke", "stream", "astream"])
async def test_a_reply_a_middleware_listed_before_redacts_is_stored_redacted(memory: TieredMemory, run: str) -> None:
    model = ScriptedToolModel(responses=[AIMessage("Write to bob@example.com.")])
    agent = create_agent(model, [], middleware=[
        PIIMiddleware("email", strategy="redact", apply_to_output=True), TieredMemoryMiddleware(memory)])
    given = {"messages": [HumanMessage("Whom do I write to?")]}
    if run == "invoke":
        agent.invoke(given, context=_CTX)
    elif run == "ainvoke":
        await agent.ainvoke(given, context=_CTX)
    elif run == "stream":
        list(agent.stream(given, context=_CTX, stream_mode="messages"))
    else:
        [chunk async for chunk in agent.astream(given, context=_CTX, stream_mode="messages")]
    assert _stored(memory) == [("user", "Whom do I write to?"), ("assistant", "Write to [REDACTED_EMAIL].")]


def test_a_reply_a_middleware_listed_before_refuses_is_not_stored(memory: TieredMemory) -> None:
    model = ScriptedToolModel(responses=[AIMessage("Write to bob@example.com.")])
    agent = create_agent(model, [], middleware=[
        PIIMiddleware("email", strategy="block", apply_to_output=True), TieredMemoryMiddleware(memory)])
    with pytest.raises(PIIDetectionError):
        agent.invoke({"messages": [HumanMessage("Whom do I write to?")]}, context=_CTX)
    assert _stored(memory) == [("user", "Whom do I write to?")]  # the user's words, not the refused reply


class _FinalReplyRewriter(AgentMiddleware):
    """An ``after_agent`` guardrail: replaces the final reply under its id (``in_place``: edits the
    message object, as LangChain's guardrails guide's ``SafetyGuardrailMiddleware`` does)."""

    def __init__(self, in_place: bool) -> None:
        self.in_place = in_place

    def after_agent(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        last = state["messages"][-1]
        if self.in_place:
            last.content = "I cannot provide that response."
            return None
        return {"messages": [AIMessage("I cannot provide that response.", id=last.id)]}


@pytest.mark.parametrize("in_place", [False, True], ids=["by-id", "in-place"])
def test_a_final_reply_a_middleware_listed_after_rewrites_at_the_end_is_stored_rewritten(
        memory: TieredMemory, in_place: bool) -> None:
    """LangChain runs ``after_agent`` hooks last-listed first, so a middleware listed after the
    memory rewrites the final reply before the memory's ``after_agent`` stores it."""
    model = ScriptedToolModel(responses=[AIMessage("The launch code is 0000.")])
    agent = create_agent(model, [], middleware=[TieredMemoryMiddleware(memory), _FinalReplyRewriter(in_place)])
    out = agent.invoke({"messages": [HumanMessage("What is the launch code?")]}, context=_CTX)
    assert out["messages"][-1].content == "I cannot provide that response."
    assert _stored(memory) == [("user", "What is the launch code?"), ("assistant", "I cannot provide that response.")]


@pytest.mark.parametrize(("run", "trim"), [("invoke", False), ("ainvoke", True)], ids=["kept", "trimmed-later"])
def test_a_question_a_middleware_redacts_is_recalled_for_redacted(
        make_memory: Callable[..., TieredMemory], embedder: Embedder, trim: bool, run: str) -> None:
    """``PIIMiddleware`` (``apply_to_input`` by default) redacts the user's message before any model
    sees it; the memory recalled for the question as it was before the hooks ran, so the raw address
    went to the embedder (a hosted embeddings API) all the same: each call, or once a trim dropped it."""
    counting = CountingEmbedder(embedder)
    memory = make_memory(embedder=counting)
    model = ScriptedToolModel(responses=[time_call("c1"), time_call("c2"), AIMessage("Noted.")])
    hooks: list[Any] = [PIIMiddleware("email", strategy="redact"), *([keep_last_three] if trim else [])]
    agent = create_agent(model, [get_time], middleware=[*hooks, TieredMemoryMiddleware(memory)])
    given = {"messages": [HumanMessage("Mail bob@example.com the time.")]}
    agent.invoke(given, context=_CTX) if run == "invoke" else asyncio.run(agent.ainvoke(given, context=_CTX))
    assert counting.queries  # it did recall, at each of the three calls
    assert not [q for q in counting.queries if "bob@example.com" in q]
    assert _stored(memory)[0] == ("user", "Mail [REDACTED_EMAIL] the time.")


def test_the_question_kept_in_state_is_never_the_text_a_middleware_redacts(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The question the middleware keeps for a call after a trim (private state, which LangGraph streams
    with ``stream_mode="values"`` and checkpoints) was read in before_agent, before ``PIIMiddleware``'s
    before_model redacted it: the state held the address beside the redacted messages until the first
    model call's after_model. Only text every before_model hook has had is kept now."""
    memory = make_memory(embedder=StaticEmbedder())
    saver, cfg = InMemorySaver(), {"configurable": {"thread_id": "t1"}}
    agent = create_agent(ScriptedToolModel(responses=[time_call("c1"), AIMessage("Sent.")]), [get_time],
                         checkpointer=saver,
                         middleware=[PIIMiddleware("email", strategy="redact"), TieredMemoryMiddleware(memory)])
    chunks = list(agent.stream({"messages": [HumanMessage("Mail bob@example.com the time.")]}, cfg,
                               context=_CTX, stream_mode="values"))
    kept = [c.get("tiered_memory_query") for c in chunks] + [
        c.checkpoint["channel_values"].get("tiered_memory_query") for c in saver.list(cfg)]
    assert "Mail [REDACTED_EMAIL] the time." in kept
    assert not [k for k in kept if "bob@example.com" in str(k)]
    assert _stored(memory)[0] == ("user", "Mail [REDACTED_EMAIL] the time.")


@before_model
def _drop_questions(state: Any, runtime: Any) -> dict[str, Any] | None:
    """A trim that drops every human message (as one keeping the last few does, once a turn grows)."""
    return {"messages": [RemoveMessage(id=m.id) for m in state["messages"] if isinstance(m, HumanMessage)]} or None


def test_a_run_continuing_the_turn_recalls_for_the_text_the_last_run_kept(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A run with no new message continues the turn: its question, trimmed away before its first call,
    is recalled for as the previous run's hooks left it (redacted), kept in the thread's state."""
    counting = CountingEmbedder(StaticEmbedder())
    memory = make_memory(embedder=counting)
    memory.add_many([{"role": "user", "content": "My favourite colour is teal."}], session_id="old", user_id="u")
    saver, cfg, rec = InMemorySaver(), {"configurable": {"thread_id": "t1"}}, PromptRecorder()
    for trim, answer in (([], "Noted."), ([_drop_questions], "Teal.")):
        agent = create_agent(ScriptedToolModel(responses=[AIMessage(answer)], callbacks=[rec]), [],
                             checkpointer=saver, middleware=[PIIMiddleware("email", strategy="redact"), *trim,
                                                             TieredMemoryMiddleware(memory)])
        agent.invoke({"messages": [HumanMessage("Mail bob@example.com my favourite colour.")] if not trim else []},
                     cfg, context=_CTX)
    assert not any(isinstance(m, HumanMessage) for m in rec.last)  # the trim did drop the question
    assert "favourite colour is teal" in "\n".join(m.text for m in rec.last if isinstance(m, SystemMessage))
    assert counting.queries and not [q for q in counting.queries if "bob@example.com" in q]


@pytest.mark.parametrize("state, asked, kept", [
    ({}, "q1", None),  # a new thread
    ({"tiered_memory_question_id": "q1", "tiered_memory_query": "Mail [X]."}, "q1", "Mail [X]."),  # the turn goes on
    ({"tiered_memory_question_id": "q0", "tiered_memory_query": "Earlier."}, "q1", None),  # a new question
    ({"tiered_memory_question_id": "q1", "tiered_memory_query": None}, "q1", None),  # no call had it yet
    ({"tiered_memory_question_id": None, "tiered_memory_query": ""}, None, None),  # no question
])
def test_kept_query_table(state: dict[str, Any], asked: str | None, kept: str | None) -> None:
    assert kept_query(state, asked) == kept


_Q = HumanMessage("Mail [REDACTED_EMAIL].", id="q1")


@pytest.mark.parametrize("messages, state, query", [
    ([_Q], {"tiered_memory_question_id": "q1", "tiered_memory_query": None}, "Mail [REDACTED_EMAIL]."),  # as it is now
    ([time_call("c1")], {"tiered_memory_question_id": "q1", "tiered_memory_query": "Mail X."}, "Mail X."),  # trimmed
    ([time_call("c1")], {"tiered_memory_question_id": "q1", "tiered_memory_query": None}, ""),  # trimmed before a call
    ([HumanMessage("Older.", id="q0"), time_call("c1")], {"tiered_memory_question_id": "q1"}, ""),  # not another one
    ([_Q], {}, "Mail [REDACTED_EMAIL]."),  # a state from before: the latest human message
])
def test_current_query_table(messages: list[Any], state: dict[str, Any], query: str) -> None:
    assert current_query(messages, state) == query


@pytest.mark.parametrize("limit", [ModelCallLimitMiddleware(run_limit=1, exit_behavior="end"),
                                   ToolCallLimitMiddleware(run_limit=1, exit_behavior="end")], ids=["model", "tool"])
def test_the_notice_a_limit_ends_the_run_with_is_not_stored_as_the_assistants_reply(
        make_memory: Callable[..., TieredMemory], limit: AgentMiddleware) -> None:
    """``ModelCallLimitMiddleware`` (``ToolCallLimitMiddleware`` alike) with ``exit_behavior="end"`` ends the
    run with an ``AIMessage`` it wrote itself ("Model call limits exceeded: run limit (1/1)"): it was stored
    as the assistant's turn, and recalled later as if the assistant had said it."""
    memory = make_memory(embedder=StaticEmbedder())
    model = ScriptedToolModel(responses=[time_call("c1"), time_call("c2"), AIMessage("Noon.")])
    agent = create_agent(model, [get_time], middleware=[limit, TieredMemoryMiddleware(memory)])
    out = agent.invoke({"messages": [HumanMessage("What time is it?")]}, context=_CTX)
    assert "limit" in out["messages"][-1].text and isinstance(out["messages"][-1], AIMessage)  # the notice
    stored = _stored(memory)
    assert stored[:3] == [("user", "What time is it?"), ("assistant", "[tool calls] get_time({})"), ("tool", "12:00")]
    assert not [content for role, content in stored if role == "assistant" and "limit" in content]


def test_is_limit_notice_reads_every_notice_langchain_builds() -> None:
    from langchain.agents.middleware.model_call_limit import _build_limit_exceeded_message
    from langchain.agents.middleware.tool_call_limit import _build_final_ai_message_content

    notices = [_build_limit_exceeded_message(3, 1, 3, None), _build_limit_exceeded_message(1, 2, None, 2),
               _build_limit_exceeded_message(5, 5, 5, 5)]
    notices += [_build_final_ai_message_content(t, r, 1, 1, name) for t, r in ((2, 1), (1, 2), (2, 2))
                for name in (None, "get_time", "it's")]
    assert all(is_limit_notice(AIMessage(n)) for n in notices)
    said = notices[0]
    assert not is_limit_notice(HumanMessage(said))  # the user quoting it
    assert not is_limit_notice(AIMessage(said, response_metadata={"finish_reason": "stop"}))  # a model's reply
    assert not is_limit_notice(AIMessage(f"I stopped. {said}"))  # not the whole text
    assert not is_limit_notice(time_call("c1"))
