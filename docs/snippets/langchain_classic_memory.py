# Classic chains: change the memory= argument, keep the chain.
from langchain_classic.chains import ConversationChain
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from langchain_tiered_memory import TieredConversationMemory
from tiered_memory import TieredMemory

memory = TieredMemory("./memory")
llm = FakeListChatModel(responses=["Nice to meet you, Ana!", "In Lisbon."])  # or ChatOpenAI(...)


def chat(session_id: str, text: str) -> str:
    chain = ConversationChain(llm=llm, memory=TieredConversationMemory(
        memory=memory, user_id="ana", session_id=session_id))
    return chain.invoke({"input": text})["response"]


chat("monday", "Hi! I'm Ana and I live in Lisbon.")
answer = chat("friday", "Where do I live?")  # a new session still recalls Monday
print(answer)
memory.close()
