"""TieredMemoryMiddleware among other middleware: what the session holds is what the agent's hooks left.

LangChain runs ``after_model`` hooks in the reverse of the listed order, so a middleware listed
before the memory (``PIIMiddleware(apply_to_output=True)``, a guardrail) edits or refuses the
model's reply *after* the memory's own ``after_model`` has seen it. ``after_agent`` hooks run in
the reverse order too, and the memory's is its last chance to store: a middleware that rewrites the
final reply there must be listed *after* the memory (README, LangChain: agents).
``before_model`` hooks (``PIIMiddleware``'s input redaction, a trim) run before every model call,
after the memory read the run's question: it recalls for what they left of it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState, PIIMiddleware
from langchain.agents.middleware.pii import PIIDetectionError
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.runtime import Runtime

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import get_time, keep_last_three, time_call
from tiered_memory import TieredMemory
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
