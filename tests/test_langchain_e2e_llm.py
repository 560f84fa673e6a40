"""The LangChain integrations once through ChatOpenAI against the local llama.cpp server.

One model call per flow (each takes seconds on CPU); memory is seeded through the
core, so every call is one where recall has to work.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_classic.chains import ConversationChain
from langchain_core.messages import HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import (
    TieredConversationMemory,
    TieredMemoryMiddleware,
    history_factory,
    history_factory_config,
)
from lc_support import PromptRecorder
from tiered_memory import TieredMemory

pytestmark = [
    pytest.mark.llm,
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning"),
]


def _seed(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "My dog is a greyhound called Pixel."},
                     {"role": "assistant", "content": "Pixel is a lovely name for a greyhound!"}],
                    session_id="last-week", user_id="ana")
    memory.add_many([{"role": "user", "content": "My dog is a poodle called Rex."}],
                    session_id="last-week", user_id="bo")


def test_classic_conversation_chain(memory: TieredMemory, chat_model: Any) -> None:
    _seed(memory)
    rec = PromptRecorder()
    chain = ConversationChain(llm=chat_model, memory=TieredConversationMemory(
        memory=memory, user_id="ana", session_id="today"))
    answer = chain.invoke({"input": "What is my dog's name? Answer with the name only."},
                          {"callbacks": [rec]})["response"]
    assert "pixel" in answer.lower()
    assert "Rex" not in rec.last_text()
    assert [m.role for m in memory.get_messages("today", user_id="ana")] == ["user", "assistant"]


def test_runnable_with_message_history(memory: TieredMemory, chat_model: Any) -> None:
    rec = PromptRecorder()
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant. Answer in one short sentence."),
        MessagesPlaceholder("history"), ("human", "{input}")])
    chain = RunnableWithMessageHistory(
        prompt | chat_model, history_factory(memory), input_messages_key="input",
        history_messages_key="history", history_factory_config=history_factory_config())
    history = history_factory(memory)(user_id="ana", session_id="s1")
    history.add_messages([HumanMessage("Hi, my name is Anastasia and I am a glassblower."),
                          HumanMessage("I also keep bees.")])
    out = chain.invoke({"input": "What is my job?"},
                       {"configurable": {"user_id": "ana", "session_id": "s1"}, "callbacks": [rec]})
    assert "glass" in out.content.lower()
    assert len(history.messages) == 4


def test_create_agent_with_middleware(memory: TieredMemory, chat_model: Any) -> None:
    _seed(memory)
    agent = create_agent(chat_model, [], system_prompt="Answer in one short sentence.",
                         middleware=[TieredMemoryMiddleware(memory)])
    out = agent.invoke({"messages": [HumanMessage("What breed is my dog?")]},
                       context={"user_id": "ana", "session_id": "today"})
    assert "greyhound" in out["messages"][-1].text.lower()
    stored = memory.get_messages("today", user_id="ana")
    assert [m.role for m in stored] == ["user", "assistant"]
