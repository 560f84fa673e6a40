# %% [markdown]
# # LlamaIndex: an agent with `Memory` + `TieredMemoryBlock`
#
# One memory block gives a LlamaIndex agent long-term memory across sessions. We run a
# `FunctionAgent` for two sessions and look at the prompt it builds in the second, then
# a `ReActAgent`, which needs the `Memory` built with `insert_method="user"`.
#
# **Model note:** offline and without a key we use LlamaIndex's own mock function-calling
# LLM, which records the messages of its last call, so we can see exactly what the agent
# sent. Any LlamaIndex LLM (for example `OpenAILike` pointed at a local llama.cpp server)
# works the same way. LlamaIndex's default tokenizer works offline (llama-index-core ships
# its tiktoken files); `offline_tokenizer()` makes `Memory` count tokens the way the core does.

# %%
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.llms.mock import MockFunctionCallingLLMWithChatMemoryOfLastCall
from llama_index.core.memory import Memory
from llama_index.core.tools import FunctionTool

from llamaindex_tiered_memory import TieredMemoryBlock, aend_session, offline_tokenizer
from tiered_memory import TieredMemory

store = TieredMemory(tempfile.mkdtemp(prefix="tm-llamaindex-"))


def weather(city: str = "Porto") -> str:
    """Today's weather in a city."""
    return f"Sunny in {city}"


def session(session_id: str) -> Memory:
    block = TieredMemoryBlock(memory=store, user_id="miso-owner")
    return Memory.from_defaults(session_id=session_id, memory_blocks=[block], tokenizer_fn=offline_tokenizer())


llm = MockFunctionCallingLLMWithChatMemoryOfLastCall()
agent = FunctionAgent(tools=[FunctionTool.from_defaults(weather)], llm=llm, system_prompt="You are a helpful assistant.")

# %% [markdown]
# ## Session 1

# %%
first = session("chat-1")
await agent.run(user_msg="My cat is called Miso and I moved to Porto last spring.", memory=first)
await aend_session(first)  # flush short-term memory and compress the session into an episode
print(store.stats())

# %% [markdown]
# ## Session 2: what the agent sees

# %%
llm.reset_memory()
second = session("chat-2")
await agent.run(user_msg="What is my cat called?", memory=second)
for message in llm.last_chat_messages:
    print(f"--- {message.role}\n{message.content}\n")

# %%
system = "\n".join(m.content or "" for m in llm.last_chat_messages if m.role == "system")
assert "Miso" in system

# %% [markdown]
# ## A `ReActAgent`: put the memory in the user message
#
# `Memory` inserts its blocks into the first system message by default, and `ReActAgent`
# drops that message when it builds its ReAct prompt. With `insert_method="user"` the
# memory is prepended to the latest user message instead, which every agent sends.
# `ScriptedChatLLM` is a fake LLM shipped for tests: it answers in the ReAct format and
# records each call.

# %%
from llama_index.core.agent.workflow import ReActAgent

from llamaindex_tiered_memory.testing import ScriptedChatLLM

react_llm = ScriptedChatLLM(responses=["Thought: Memory says so.\nAnswer: Your cat is called Miso."])
react = ReActAgent(tools=[FunctionTool.from_defaults(weather)], llm=react_llm)
third = Memory.from_defaults(session_id="chat-3", insert_method="user", tokenizer_fn=offline_tokenizer(),
                             memory_blocks=[TieredMemoryBlock(memory=store, user_id="miso-owner")])
print(await react.run(user_msg="What is my cat called?", memory=third))
question = [m for m in react_llm.calls[-1] if m.role == "user"][-1].content
print(question[question.find("<memory"):])
assert "Miso" in question
store.close()
