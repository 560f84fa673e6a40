"""The LlamaIndex agent flow with a real LLM: ``OpenAILike`` against the local llama.cpp server.

Two sessions of a ``FunctionAgent`` whose ``Memory`` has a TieredMemoryBlock, as in
test_llamaindex_agent.py but with a real model. The agent gets no tools: llama.cpp's
server does not turn this model's tool-call text into OpenAI ``tool_calls``, and the
point here is the memory the agent's prompt carries (the tool-calling loop itself is
covered with LlamaIndex's mock LLM). Three calls in all, on purpose: each takes 5-15 s
on two CPU cores.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.memory import Memory
from llama_index.llms.openai_like import OpenAILike

from llamaindex_tiered_memory import LlamaIndexLLM, TieredMemoryBlock, aend_session, offline_tokenizer
from tiered_memory import TieredMemory

pytestmark = pytest.mark.llm


@pytest.fixture
def llm(local_llm_url: str) -> Any:
    return OpenAILike(api_base=local_llm_url + "/v1", model="qwen", api_key="x", is_chat_model=True,
                      is_function_calling_model=True, max_tokens=256, timeout=300, max_retries=0)


def session_memory(tm: TieredMemory, session_id: str) -> Memory:
    return Memory.from_defaults(session_id=session_id, tokenizer_fn=offline_tokenizer(),
                                memory_blocks=[TieredMemoryBlock(memory=tm, user_id="ada")])


async def test_json_mode_against_the_real_server(llm: Any) -> None:
    text = await LlamaIndexLLM(llm).complete(
        [{"role": "user", "content": 'Return a JSON object {"city": ...} for: "I live in Oslo".'}],
        json_mode=True, max_tokens=64)
    assert isinstance(json.loads(text), dict)  # the server's JSON grammar holds


async def test_agent_remembers_across_sessions_with_a_real_llm(
    llm: Any, make_memory: Callable[..., TieredMemory],
) -> None:
    tm = make_memory("e2e")
    agent = FunctionAgent(tools=[], llm=llm,
                          system_prompt="You are a helpful assistant. Answer in one short sentence.")

    first = session_memory(tm, "monday")
    await agent.run(user_msg="My cat is called Miso.", memory=first)
    await aend_session(first)  # what is still short-term goes to long-term memory
    stored = [m.content for m in tm.get_messages("monday", user_id="ada")]
    assert stored[0] == "My cat is called Miso." and len(stored) == 2  # with the real reply

    second = session_memory(tm, "tuesday")
    answer = await agent.run(user_msg="What is my cat's name?", memory=second)
    prompt = "\n".join(m.content or "" for m in await second.aget() if m.role == "system")
    assert "Miso" in prompt.split("<memory>\n", 1)[1]
    assert "miso" in str(answer).lower()
