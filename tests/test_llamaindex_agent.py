"""A real LlamaIndex FunctionAgent with TieredMemoryBlock, over two sessions.

The LLM is LlamaIndex's own ``MockFunctionCallingLLMWithChatMemoryOfLastCall``: it
calls the agent's tools, then answers, and records the messages of its last call,
which is exactly the prompt the agent built from ``Memory``.
"""

from __future__ import annotations

from typing import Callable

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.llms.mock import MockFunctionCallingLLMWithChatMemoryOfLastCall  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402

from llamaindex_tiered_memory import TieredMemoryBlock, aend_session, offline_tokenizer  # noqa: E402
from tiered_memory import TieredMemory  # noqa: E402


def weather(city: str = "Porto") -> str:
    """Today's weather in a city."""
    return f"Sunny in {city}"


def session_memory(tm: TieredMemory, user_id: str, session_id: str) -> Memory:
    block = TieredMemoryBlock(memory=tm, user_id=user_id)
    return Memory.from_defaults(session_id=session_id, memory_blocks=[block],
                                tokenizer_fn=offline_tokenizer())


def prompt_memory(messages: list[ChatMessage]) -> str:
    """The memory part of the system message the LLM received."""
    system = "\n".join(m.content or "" for m in messages if m.role == "system")
    start = system.find('<memory section="')
    return system[start:] if start >= 0 else ""


async def test_second_session_prompt_carries_memory_from_the_first(
    make_memory: Callable[..., TieredMemory],
) -> None:
    llm = MockFunctionCallingLLMWithChatMemoryOfLastCall()
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(weather)], llm=llm,
                          system_prompt="You are a helpful assistant.")
    tm = make_memory("agent")

    first = session_memory(tm, "u1", "chat-1")
    answer = await agent.run(user_msg="My cat is called Miso and I moved to Porto last spring.",
                             memory=first)
    assert str(answer)  # the mock called the tool, then answered
    assert llm.last_called_chat_function  # the agent really went through the LLM
    assert prompt_memory(list(llm.last_chat_messages or [])) == ""  # nothing known yet
    other = session_memory(tm, "u2", "chat-x")
    await agent.run(user_msg="My bank PIN is 9981.", memory=other)
    await aend_session(first)
    await aend_session(other)
    tm.close()

    tm2 = make_memory("agent")  # a new process would see the same
    llm.reset_memory()
    second = session_memory(tm2, "u1", "chat-2")
    await agent.run(user_msg="What is my cat called?", memory=second)
    sent = list(llm.last_chat_messages or [])
    remembered = prompt_memory(sent)
    assert "Miso" in remembered
    # the core's layers reach the prompt: a fact and the episode of the first session
    assert 'section="facts"' in remembered and "Porto" in remembered
    assert 'section="episodes" title="Relevant past sessions"' in remembered
    assert "9981" not in "\n".join(m.content or "" for m in sent)
    # the current question is in the chat, not repeated as memory
    assert "What is my cat called?" not in remembered
    assert any(m.role == "user" and m.content == "What is my cat called?" for m in sent)
