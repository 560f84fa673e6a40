"""``RunnableWithMessageHistory`` over ``history_factory``'s histories: real chains, a real store."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import TieredChatMessageHistory, history_factory, history_factory_config
from lc_support import PromptRecorder
from langchain_tiered_memory.storable import REPAIRED_KEY
from tiered_memory import ConfigurationError, ContentTooLargeError, MemoryConfig, TieredMemory

# RunnableWithMessageHistory is deprecated by LangChain (in favour of LangGraph persistence)
# but still the documented way for plain chains; its construction warns.
pytestmark = pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:langchain_core._api.deprecation.LangChainDeprecationWarning")


def _chain(memory: TieredMemory, recorder: PromptRecorder, replies: list[str],
           **factory: Any) -> RunnableWithMessageHistory:
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant."),
        MessagesPlaceholder("history"),
        ("human", "{input}"),
    ])
    model = FakeMessagesListChatModel(responses=[AIMessage(content=r) for r in replies],
                                      callbacks=[recorder])
    return RunnableWithMessageHistory(
        prompt | model, history_factory(memory, **factory), input_messages_key="input",
        history_messages_key="history", history_factory_config=history_factory_config())


def _cfg(user: str, session: str) -> dict[str, Any]:
    return {"configurable": {"user_id": user, "session_id": session}}


def test_runnable_with_message_history_two_users_two_sessions_and_restart(
    make_memory: Callable[..., TieredMemory],
) -> None:
    memory = make_memory("shared")
    rec = PromptRecorder()
    chain = _chain(memory, rec, ["Nice to meet you, Ana.", "Hello Bo.", "You are Ana.", "Fresh start."])
    chain.invoke({"input": "I am Ana."}, _cfg("ana", "s1"))
    chain.invoke({"input": "I am Bo."}, _cfg("bo", "s1"))
    chain.invoke({"input": "Who am I?"}, _cfg("ana", "s1"))
    prompt = rec.last_text()
    assert "I am Ana." in prompt and "Nice to meet you, Ana." in prompt
    assert "Bo" not in prompt  # another user's turns never reach this prompt
    chain.invoke({"input": "New topic."}, _cfg("ana", "s2"))
    assert [m.type for m in rec.last] == ["system", "human"]  # a new session starts empty
    memory.close()

    # restart: new objects on the same folder see the same sessions
    reopened = make_memory("shared")
    rec2 = PromptRecorder()
    chain2 = _chain(reopened, rec2, ["Still Ana."])
    chain2.invoke({"input": "Remember me?"}, _cfg("ana", "s1"))
    texts = [m.text for m in rec2.last]
    assert texts[1:5] == ["I am Ana.", "Nice to meet you, Ana.", "Who am I?", "You are Ana."]
    assert texts[-1] == "Remember me?"
    stored = reopened.get_messages("s1", user_id="ana")
    assert [m.content for m in stored][-2:] == ["Remember me?", "Still Ana."]
    assert len(reopened.get_messages("s1", user_id="bo")) == 2


async def test_runnable_with_message_history_async(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("async")
    rec = PromptRecorder()
    chain = _chain(memory, rec, ["Got it.", "Paris.", "Hi."])
    await chain.ainvoke({"input": "I live in Paris."}, _cfg("u1", "s1"))
    await chain.ainvoke({"input": "Where do I live?"}, _cfg("u1", "s1"))
    assert "I live in Paris." in rec.last_text()
    await chain.ainvoke({"input": "Where do I live?"}, _cfg("u2", "s1"))
    assert "Paris" not in rec.last_text()
    history = TieredChatMessageHistory(memory, session_id="s1", user_id="u1")
    got = await history.aget_messages()
    assert [m.type for m in got] == ["human", "ai", "human", "ai"]
    assert got[-1].text == "Paris."
    await history.aclear()
    assert await history.aget_messages() == []
    assert len(await TieredChatMessageHistory(memory, session_id="s1", user_id="u2").aget_messages()) == 2


async def test_messages_read_back_equal_to_what_was_added_as_in_langchains_histories(memory: TieredMemory) -> None:
    # LangChain's own history tests compare what a history returns with what was added, by ==, which
    # includes the id: a message added without one comes back without one, as from its in-memory
    # and SQL histories (the core still keys it by its own id)
    history = TieredChatMessageHistory(memory, "s1", user_id="u1")
    history.add_user_message("Hello")
    history.add_ai_message("World")
    await history.aadd_messages([HumanMessage(content="!")])
    want = [HumanMessage(content="Hello"), AIMessage(content="World"), HumanMessage(content="!")]
    assert history.messages == want and await history.aget_messages() == want
    assert all(m.id for m in memory.get_messages("s1", user_id="u1"))

    said = RunnableLambda(lambda d: [AIMessage(content="you said: " + " / ".join(
        m.text for m in d["messages"] if isinstance(m, HumanMessage)))])
    chain = RunnableWithMessageHistory(said, history_factory(memory), input_messages_key="messages",
                                       history_messages_key="history", history_factory_config=history_factory_config())
    assert chain.invoke({"messages": [HumanMessage(content="hi")]}, _cfg("u2", "s1")) == [
        AIMessage(content="you said: hi")]
    assert TieredChatMessageHistory(memory, "s1", user_id="u2").messages == [
        HumanMessage(content="hi"), AIMessage(content="you said: hi")]


def test_runnable_with_include_memory_recalls_an_earlier_session(memory: TieredMemory) -> None:
    rec = PromptRecorder()
    chain = _chain(memory, rec, ["Enjoy the climbing!", "Sure.", "You like climbing."],
                   include_memory=True)
    chain.invoke({"input": "I go bouldering every Sunday."}, _cfg("u1", "monday"))
    chain.invoke({"input": "Let's plan my weekend hobbies."}, _cfg("u1", "friday"))
    chain.invoke({"input": "Which sport do I do on weekends?"}, _cfg("u1", "friday"))
    system_texts = [m.text for m in rec.last if m.type == "system"]
    assert any("bouldering every Sunday" in t for t in system_texts)


@pytest.mark.parametrize("call", ["invoke", "ainvoke"])
async def test_a_write_elsewhere_during_the_call_loses_no_input_message(memory: TieredMemory, call: str) -> None:
    """Without ``history_messages_key``, ``RunnableWithMessageHistory`` reads the history again
    after the call and drops that many leading input messages as the history it prepended. The
    recalled memory changes when the user's other sessions do (a tool, another tab), so a
    history made for one call answers both reads with its first, until it writes."""
    history = TieredChatMessageHistory(memory, "s", user_id="u", include_memory=True)
    history.add_messages([HumanMessage(content="hello there"), AIMessage(content="hi")])

    def step(messages: list[BaseMessage]) -> AIMessage:  # meanwhile, another session of the user
        memory.add("user", "hello there from the other tab", session_id="other", user_id="u")
        return AIMessage(content="ok")

    chain = RunnableWithMessageHistory(RunnableLambda(step), history_factory(memory, include_memory=True),
                                       history_factory_config=history_factory_config())
    new = HumanMessage(content="hello there again")
    if call == "invoke":
        chain.invoke([new], _cfg("u", "s"))
    else:
        await chain.ainvoke([new], _cfg("u", "s"))
    assert [m.content for m in memory.get_messages("s", user_id="u")] == [
        "hello there", "hi", "hello there again", "ok"]


def test_include_memory_reaches_a_model_that_chains_responses(memory: TieredMemory) -> None:
    """ChatOpenAI(use_previous_response_id=True) sends only what follows the last AI message with a
    ``resp_`` id. The history's read kept the stored answer's id, so the memory message before it
    (and the chain's own system prompt) were never sent from a session's second call on; a read
    with the memory is a prompt rebuilt from the store, complete in itself, as with_tiered_memory's."""
    import json

    from langchain_openai import ChatOpenAI

    from lc_support import responses_api_server

    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are a helpful assistant."), MessagesPlaceholder("history"), ("human", "{input}")])
    with responses_api_server() as (url, bodies):
        model = ChatOpenAI(model="gpt-4.1", base_url=url, api_key="not-needed",
                           use_previous_response_id=True, max_retries=0)
        chain = RunnableWithMessageHistory(
            prompt | model, history_factory(memory, include_memory=True), input_messages_key="input",
            history_messages_key="history", history_factory_config=history_factory_config())
        chain.invoke({"input": "I go bouldering every Sunday."}, _cfg("u1", "monday"))
        chain.invoke({"input": "Let's plan my weekend hobbies."}, _cfg("u1", "friday"))
        chain.invoke({"input": "Which sport do I do on weekends?"}, _cfg("u1", "friday"))
    last = bodies[-1]
    assert "previous_response_id" not in last
    sent = json.dumps(last["input"])
    assert "bouldering every Sunday" in sent and "You are a helpful assistant." in sent
    assert "Let's plan my weekend hobbies." in sent
    # the store keeps the id as it came: only the prompt's copy leaves it out
    assert memory.get_messages("friday", user_id="u1")[1].metadata["langchain"]["data"]["response_metadata"]["id"] \
        == "resp_2"


def test_without_history_factory_config_the_chain_says_to_pass_it(memory: TieredMemory) -> None:
    # RunnableWithMessageHistory's default config names one key, session_id, and calls the factory
    # with it alone, positionally: that was a TypeError about a missing argument; it says what to pass
    chain = RunnableWithMessageHistory(FakeMessagesListChatModel(responses=[AIMessage("hi")]),
                                       history_factory(memory))
    for configurable in ({"session_id": "s1"}, {"session_id": "s1", "user_id": "u1"}):
        with pytest.raises(ConfigurationError, match=r"history_factory_config=history_factory_config\(\)"):
            chain.invoke([HumanMessage("hello")], {"configurable": configurable})
    assert memory.get_messages("s1", user_id="s1") == [] and memory.get_messages("s1", user_id="u1") == []


def test_a_reply_over_max_content_chars_is_answered_and_recorded_cut(
        make_memory: Callable[..., TieredMemory], caplog: pytest.LogCaptureFixture) -> None:
    """RunnableWithMessageHistory writes the turn through the history after the model answered:
    a reply the core refuses as it is (over max_content_chars) raised ContentTooLargeError then,
    the answer lost. history_factory's histories record it as the middleware does: cut, marked."""
    memory = make_memory("long-reply", config=MemoryConfig(max_content_chars=1_000))
    chain = _chain(memory, PromptRecorder(), ["word " * 600])
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        out = chain.invoke({"input": "Write me an essay."}, _cfg("u1", "s1"))
    assert out.content == "word " * 600  # the caller gets the whole answer
    user, ai = memory.get_messages("s1", user_id="u1")
    assert user.content == "Write me an essay." and REPAIRED_KEY not in user.metadata
    assert len(ai.content) == 1_000 and ai.metadata[REPAIRED_KEY] == ["cut from 3,000 to 1,000 characters"]
    assert "was changed to be storable" in caplog.text
    with pytest.raises(ContentTooLargeError):  # a history made by hand stays strict
        TieredChatMessageHistory(memory, "s2", user_id="u1").add_messages([AIMessage("word " * 600)])
    assert memory.get_messages("s2", user_id="u1") == []
