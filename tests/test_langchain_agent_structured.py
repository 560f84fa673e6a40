"""create_agent with ``response_format`` and TieredMemoryMiddleware: the structured answer comes back,
the model got the memory with the schema's tool, and the session holds the turn as the state does (the
call of the schema's tool and LangChain's message that returned it), once a turn."""

from __future__ import annotations

from typing import Callable

from langchain.agents import create_agent
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import BaseModel

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder
from tiered_memory import StaticEmbedder, TieredMemory


class Trip(BaseModel):
    city: str
    nights: int


def _answer(city: str, nights: int, call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "Trip", "args": {"city": city, "nights": nights}, "id": call_id,
                                      "type": "tool_call"}])


def test_a_structured_answer_is_returned_and_its_turn_stored_once(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    memory.add_many([{"role": "user", "content": "I always stay three nights in Lisbon."}],
                    session_id="old", user_id="u1")
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[_answer("Lisbon", 3, "t1"), _answer("Porto", 2, "t2")], callbacks=[rec])
    agent = create_agent(model, [], response_format=ToolStrategy(Trip),
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", session_id="t")])
    out = agent.invoke({"messages": [HumanMessage("Plan my usual trip.")]})
    assert out["structured_response"] == Trip(city="Lisbon", nights=3)
    assert "three nights in Lisbon" in "\n".join(m.text for m in rec.last if isinstance(m, SystemMessage))
    agent.invoke({"messages": [HumanMessage("And a short one to Porto.")]})
    stored = [(m.role, m.content) for m in memory.get_messages("t", user_id="u1")]
    assert stored == [
        ("user", "Plan my usual trip."), ("assistant", '[tool calls] Trip({"city": "Lisbon", "nights": 3})'),
        ("tool", "Returning structured response: city='Lisbon' nights=3"),
        ("user", "And a short one to Porto."), ("assistant", '[tool calls] Trip({"city": "Porto", "nights": 2})'),
        ("tool", "Returning structured response: city='Porto' nights=2")]
