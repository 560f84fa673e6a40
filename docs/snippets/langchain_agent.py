# Agents: create_agent with the memory middleware (conversation memory) and store (LangGraph items).
from langchain.agents import create_agent
from langchain_core.messages import AIMessage

from langchain_tiered_memory import TieredMemoryMiddleware, TieredMemoryStore
from langchain_tiered_memory.testing import ScriptedToolModel
from tiered_memory import TieredMemory

memory = TieredMemory("./memory")
model = ScriptedToolModel(responses=[AIMessage("Noted!"), AIMessage("You're vegetarian.")])  # or ChatOpenAI(...)
agent = create_agent(
    model,
    tools=[],
    middleware=[TieredMemoryMiddleware(memory)],  # recalls before each model call, records after
    store=TieredMemoryStore(memory),  # runtime.store for tools and graph nodes
)
agent.invoke({"messages": [{"role": "user", "content": "I'm vegetarian."}]},
             context={"user_id": "cy", "session_id": "monday"})
result = agent.invoke({"messages": [{"role": "user", "content": "What should I order?"}]},
                      context={"user_id": "cy", "session_id": "friday"})
answer = result["messages"][-1].content
print(answer)
memory.close()
