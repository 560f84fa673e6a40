# LCEL chains, the recommended path: recall for the current input, then record the turn.
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

from langchain_tiered_memory import with_tiered_memory
from tiered_memory import TieredMemory

memory = TieredMemory("./memory")
model = FakeListChatModel(responses=["Noted!", "Try apple slices; no peanuts."])  # or ChatOpenAI(...)
prompt = ChatPromptTemplate.from_messages([
    ("system", "You are a helpful assistant."),
    MessagesPlaceholder("history"),  # quoted long-term memory, then the session's recent turns
    ("human", "{input}"),
])
chain = with_tiered_memory(prompt | model, memory)
chain.invoke({"input": "I'm allergic to peanuts."},
             {"configurable": {"user_id": "dee", "session_id": "monday"}})
answer = chain.invoke({"input": "Any snack ideas?"},  # first turn of a new session: still recalled
                      {"configurable": {"user_id": "dee", "session_id": "friday"}}).content
print(answer)
memory.close()
