"""create_agent with TieredMemoryMiddleware in a checkpointed thread: the agent's state holds the
whole conversation, so the memory recalls none of it again (``build_context(shown=...)``), and the
room those turns would take goes to other memories."""

from __future__ import annotations

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder
from test_injection import decoded_items, parse_memory
from tiered_memory import TieredMemory
from tiered_memory.context.render import OPENING

TOPICS = ["tides", "volcanoes", "rainbows", "glaciers", "comets", "owls", "bees", "jazz", "chess", "bread"] * 3


def test_a_checkpointed_thread_is_not_recalled_into_its_own_prompt(memory: TieredMemory) -> None:
    memory.add_many([m for n, topic in enumerate(TOPICS) for m in (
        {"role": "user", "content": f"Old{n}: what about tides and {topic}?"},
        {"role": "assistant", "content": f"Old answer {n}: tides and {topic} go back a long way."})],
        session_id="last-week", user_id="u1")
    rec = PromptRecorder()
    replies = [AIMessage(f"A{n}: tides and {topic} have a long history.") for n, topic in enumerate(TOPICS)]
    model = ScriptedToolModel(responses=[*replies, AIMessage("Done.")], callbacks=[rec])
    agent = create_agent(model, [], system_prompt="Be brief.", checkpointer=InMemorySaver(),
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", max_tokens=800)])
    cfg = {"configurable": {"thread_id": "t1"}}
    for n, topic in enumerate(TOPICS):
        agent.invoke({"messages": [HumanMessage(f"Q{n}: tell me about tides and {topic}.")]}, cfg)
    agent.invoke({"messages": [HumanMessage("Tell me about tides again.")]}, cfg)
    prompt = rec.last
    conversation = {m.text for m in prompt if not isinstance(m, SystemMessage)}
    assert len(conversation) == 2 * len(TOPICS) + 1  # the state holds the whole thread
    system = "\n".join(m.text for m in prompt if isinstance(m, SystemMessage))
    recalled = decoded_items(parse_memory(system[system.index(OPENING):]))
    assert not set(recalled) & conversation  # nothing the model sees in the thread is repeated
    assert sum(r.startswith("Old") for r in recalled) >= 10  # the room went to last week's turns
