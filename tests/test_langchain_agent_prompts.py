"""What TieredMemoryMiddleware puts in the prompt beside other middleware, and what a replay of
the session (include_recent) may hold: only tool calls that have their result."""

from __future__ import annotations

from typing import Any

from langchain.agents import AgentState, create_agent
from langchain.agents.middleware import ModelRequest, after_model, dynamic_prompt
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.runtime import Runtime

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.messages import from_stored_many, to_core_many
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder
from tiered_memory import TieredMemory


def _call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def _system_text(prompt: list[Any]) -> str:
    return "\n".join(m.text for m in prompt if isinstance(m, SystemMessage))


@tool
def get_time() -> str:
    """The current time."""
    return "12:00"


def test_listed_after_a_dynamic_prompt_the_memory_joins_the_prompt_it_sets(memory: TieredMemory) -> None:
    # wrap_model_call hooks nest, the first listed outermost: a @dynamic_prompt listed after the
    # memory replaces the system message the memory added to (LangChain's order, the README says so);
    # listed before it, the memory joins the prompt it sets
    @dynamic_prompt
    def persona(request: ModelRequest) -> str:
        return "You are a terse assistant."

    memory.add_many([{"role": "user", "content": "My favourite colour is teal."}], session_id="old", user_id="u1")
    prompts = {}
    for order in ("memory-first", "prompt-first"):
        rec = PromptRecorder()
        mws: list[Any] = [TieredMemoryMiddleware(memory, user_id="u1", session_id=order, record=False), persona]
        agent = create_agent(ScriptedToolModel(responses=[AIMessage("Teal.")], callbacks=[rec]), [],
                             middleware=mws if order == "memory-first" else mws[::-1])
        agent.invoke({"messages": [HumanMessage("Which colour do I like?")]})
        prompts[order] = _system_text(rec.last)
    assert prompts["memory-first"] == "You are a terse assistant."
    assert prompts["prompt-first"].startswith("You are a terse assistant.\n\n")
    assert "favourite colour is teal" in prompts["prompt-first"]


def _unanswered_calls(prompt: list[Any]) -> list[str | None]:
    """The tool calls of a prompt that no later tool message answers: OpenAI and Anthropic refuse
    such a prompt ('tool_calls must be followed by tool messages responding to each id')."""
    return [c["id"] for n, m in enumerate(prompt) if isinstance(m, AIMessage) for c in m.tool_calls
            if not any(isinstance(t, ToolMessage) and t.tool_call_id == c["id"] for t in prompt[n + 1:])]


@tool
def delete_files(path: str) -> str:
    """Delete files."""
    return "deleted"


def test_include_recent_replays_no_tool_call_without_its_result(memory: TieredMemory) -> None:
    # a guardrail ends the run after a tool call it refuses (LangChain's after_model + jump_to "end"
    # pattern): the state keeps the call with no result and the run's end records it; replayed
    # before every later turn of the session, that call made each prompt one a provider refuses
    @after_model(can_jump_to=["end"])
    def guard(state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        if any(c["name"] == "delete_files" for c in getattr(state["messages"][-1], "tool_calls", [])):
            return {"messages": [AIMessage("I can't delete files.")], "jump_to": "end"}
        return None

    both = AIMessage(content="", tool_calls=[{"name": "get_time", "args": {}, "id": "t1", "type": "tool_call"},
                                             {"name": "delete_files", "args": {"path": "/"}, "id": "d1",
                                              "type": "tool_call"}])
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[_call("delete_files", {"path": "/"}, "d0"), both, AIMessage("Hi.")],
                              callbacks=[rec])
    agent = create_agent(model, [delete_files, get_time], middleware=[
        guard, TieredMemoryMiddleware(memory, user_id="u", session_id="s", include_recent=True)])
    agent.invoke({"messages": [HumanMessage("Delete everything.")]})
    agent.invoke({"messages": [HumanMessage("What time is it, and delete everything.")]})
    stored = [m.content for m in memory.get_messages("s", user_id="u")]
    assert stored[:3] == ["Delete everything.", '[tool calls] delete_files({"path": "/"})', "I can't delete files."]
    agent.invoke({"messages": [HumanMessage("Hello.")]})
    replayed = rec.last
    assert [m.text for m in replayed if isinstance(m, HumanMessage)] == [
        "Delete everything.", "What time is it, and delete everything.", "Hello."]
    assert _unanswered_calls(replayed) == []
    # what the calls were is still there, as the assistant's text
    assert any(isinstance(m, AIMessage) and "delete_files" in m.text for m in replayed)


def test_a_replay_keeps_the_answered_calls_of_a_message_and_drops_the_others(memory: TieredMemory) -> None:
    both = AIMessage(content="Checking.", id="a1", tool_calls=[
        {"name": "get_time", "args": {}, "id": "t1", "type": "tool_call"},
        {"name": "delete_files", "args": {"path": "/"}, "id": "d1", "type": "tool_call"}])
    turn = [HumanMessage("Time, then delete.", id="h1"), both, ToolMessage("12:00", tool_call_id="t1", id="r1")]
    memory.add_many(to_core_many(turn), session_id="s", user_id="u")
    stored = memory.get_messages("s", user_id="u")
    assert from_stored_many(stored) == turn  # a history's read is the state as it was
    replay = from_stored_many(stored, before_new_turn=True)
    assert isinstance(replay[1], AIMessage) and [c["id"] for c in replay[1].tool_calls] == ["t1"]
    assert replay[1].text == "Checking." and replay[2] == turn[2] and _unanswered_calls(replay) == []
