# LCEL chains: RunnableWithMessageHistory keyed by user and session.
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import history_factory, history_factory_config
from tiered_memory import TieredMemory

memory = TieredMemory("./memory")
model = FakeListChatModel(responses=["Hi Bo!", "Your name is Bo."])  # or ChatOpenAI(...)
prompt = ChatPromptTemplate.from_messages([
    ("system", "You are a helpful assistant."),
    MessagesPlaceholder("history"),
    ("human", "{input}"),
])
chain = RunnableWithMessageHistory(
    prompt | model,
    history_factory(memory, include_memory=True),  # recent turns + recalled long-term memory
    input_messages_key="input",
    history_messages_key="history",
    history_factory_config=history_factory_config(),
)
config = {"configurable": {"user_id": "bo", "session_id": "s1"}}
chain.invoke({"input": "Hello, I'm Bo."}, config)
answer = chain.invoke({"input": "What's my name?"}, config).content
print(answer)
memory.close()
