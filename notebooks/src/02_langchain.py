# %% [markdown]
# # LangChain: memory for an existing app by changing one argument
#
# Three ways in, from oldest to newest API:
# 1. a classic `ConversationChain` gains long-term memory through `memory=`;
# 2. the same app on `RunnableWithMessageHistory`;
# 3. `create_agent` with the memory middleware and the LangGraph store.
#
# **Model note:** to run offline with no key, this notebook uses LangChain's own fake
# chat models, which return scripted answers and let us see exactly which prompt
# reached the model. Swap in `ChatOpenAI(...)` (OpenAI, or any OpenAI-compatible server
# such as the local llama.cpp server used by the tests) for real answers.

# %%
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from tiered_memory import TieredMemory

memory = TieredMemory(tempfile.mkdtemp(prefix="tm-langchain-"))

# %% [markdown]
# ## 1. Classic chains: `memory=`

# %%
from langchain_classic.chains import ConversationChain
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_tiered_memory import TieredConversationMemory

llm = FakeListChatModel(responses=["Nice to meet you, Ana!", "You live in Lisbon.", "ok"])


def chat(session_id: str, text: str) -> str:
    chain = ConversationChain(
        llm=llm, memory=TieredConversationMemory(memory=memory, user_id="ana", session_id=session_id)
    )
    return chain.invoke({"input": text})["response"]


print(chat("monday", "Hi! I'm Ana, I live in Lisbon and I'm vegetarian."))
print(chat("friday", "Where do I live?"))

# %% [markdown]
# What the chain's prompt received on Friday, a new session: Monday's turns come back
# as quoted long-term memory.

# %%
variables = TieredConversationMemory(memory=memory, user_id="ana", session_id="friday").load_memory_variables(
    {"input": "Where do I live?"}
)
print(variables["history"][:1200])
assert "Lisbon" in variables["history"]

# %% [markdown]
# ## 2. `RunnableWithMessageHistory`

# %%
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import history_factory, history_factory_config

model = FakeListChatModel(responses=["Hi Bo!", "Your name is Bo."])
prompt = ChatPromptTemplate.from_messages(
    [("system", "You are a helpful assistant."), MessagesPlaceholder("history"), ("human", "{input}")]
)
chain = RunnableWithMessageHistory(
    prompt | model,
    history_factory(memory, include_memory=True),
    input_messages_key="input",
    history_messages_key="history",
    history_factory_config=history_factory_config(),
)
config = {"configurable": {"user_id": "bo", "session_id": "s1"}}
chain.invoke({"input": "Hello, I'm Bo."}, config)
print(chain.invoke({"input": "What's my name?"}, config).content)
print([(m.role, m.content) for m in memory.get_messages("s1", user_id="bo")])

# %% [markdown]
# ## 3. `create_agent`: middleware + store

# %%
from langchain.agents import create_agent
from langchain_core.messages import AIMessage

from langchain_tiered_memory import TieredMemoryMiddleware, TieredMemoryStore
from langchain_tiered_memory.testing import ScriptedToolModel

agent_model = ScriptedToolModel(responses=[AIMessage("Noted!"), AIMessage("You're vegetarian.")])
agent = create_agent(
    agent_model, tools=[], middleware=[TieredMemoryMiddleware(memory)], store=TieredMemoryStore(memory)
)
agent.invoke({"messages": [{"role": "user", "content": "I'm vegetarian."}]},
             context={"user_id": "cy", "session_id": "monday"})
result = agent.invoke({"messages": [{"role": "user", "content": "What should I order?"}]},
                      context={"user_id": "cy", "session_id": "friday"})
print(result["messages"][-1].content)

# %%
memory.close()
