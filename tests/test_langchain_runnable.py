"""with_tiered_memory: LCEL chains recall for the current input, first turn of a session included."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel, FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda, RunnableParallel
from langchain_core.runnables.history import RunnableWithMessageHistory

from langchain_tiered_memory import (
    TieredMemoryRunnable,
    history_factory,
    history_factory_config,
    with_tiered_memory,
)
from lc_support import PromptRecorder
from tiered_memory import InvalidInputError, TieredMemory

PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You are a helpful assistant."), MessagesPlaceholder("history"), ("human", "{input}")])


def _cfg(user: str, session: str) -> dict[str, Any]:
    return {"configurable": {"user_id": user, "session_id": session}}


def _model(rec: PromptRecorder, *replies: str) -> FakeMessagesListChatModel:
    return FakeMessagesListChatModel(responses=[AIMessage(content=r) for r in replies], callbacks=[rec])


def _seed(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "I moved to Porto last spring."},
                     {"role": "assistant", "content": "Porto is lovely."}], session_id="old", user_id="ana")
    memory.add_many([{"role": "user", "content": "I live in Madrid."}], session_id="old", user_id="bo")


@pytest.mark.filterwarnings(
    "ignore:RunnableWithMessageHistory is deprecated:langchain_core._api.deprecation.LangChainDeprecationWarning")
def test_first_turn_of_a_new_session_recalls_where_history_cannot(memory: TieredMemory) -> None:
    _seed(memory)
    rec = PromptRecorder()
    chain = with_tiered_memory(PROMPT | _model(rec, "In Porto."), memory)
    assert chain.invoke({"input": "Which city do I live in?"}, _cfg("ana", "new")).content == "In Porto."
    system = [m.text for m in rec.last if isinstance(m, SystemMessage)]
    assert system[0] == "You are a helpful assistant."
    assert "I moved to Porto last spring." in system[1] and "not instructions" in system[1]
    assert "Madrid" not in rec.last_text()  # another user's memory
    assert rec.last[-1] == HumanMessage("Which city do I live in?")
    # the turn is recorded in the session it came from
    assert [(m.role, m.content) for m in memory.get_messages("new", user_id="ana")] == [
        ("user", "Which city do I live in?"), ("assistant", "In Porto.")]
    # what RunnableWithMessageHistory sees on the first turn of a session: nothing to recall for
    rec2 = PromptRecorder()
    legacy = RunnableWithMessageHistory(
        PROMPT | _model(rec2, "No idea."), history_factory(memory, include_memory=True),
        input_messages_key="input", history_messages_key="history",
        history_factory_config=history_factory_config())
    legacy.invoke({"input": "Which city do I live in?"}, _cfg("ana", "newer"))
    assert "Porto" not in rec2.last_text()


def test_later_turns_get_the_session_and_the_input_is_not_mutated(memory: TieredMemory) -> None:
    rec = PromptRecorder()
    chain = with_tiered_memory(PROMPT | _model(rec, "Hi Cy!", "Your name is Cy."), memory)
    first = {"input": "Hello, I'm Cy."}
    before = copy.deepcopy(first)
    chain.invoke(first, _cfg("cy", "s1"))
    assert first == before
    chain.invoke({"input": "What's my name?"}, _cfg("cy", "s1"))
    assert [m.type for m in rec.last][-3:] == ["human", "ai", "human"]
    assert [m.text for m in rec.last][-3:] == ["Hello, I'm Cy.", "Hi Cy!", "What's my name?"]
    assert len(memory.get_messages("s1", user_id="cy")) == 4


async def test_async_and_streaming_record_one_turn_each(memory: TieredMemory) -> None:
    _seed(memory)
    rec = PromptRecorder()
    model = FakeListChatModel(responses=["Porto, I think.", "Still Porto."], callbacks=[rec])
    chain = with_tiered_memory(PROMPT | model | StrOutputParser(), memory)
    assert await chain.ainvoke({"input": "Where do I live?"}, _cfg("ana", "a")) == "Porto, I think."
    assert "I moved to Porto" in rec.last_text()
    chunks = [c async for c in chain.astream({"input": "Sure?"}, _cfg("ana", "a"))]
    assert len(chunks) > 1 and "".join(chunks) == "Still Porto."
    assert [m.content for m in memory.get_messages("a", user_id="ana")] == [
        "Where do I live?", "Porto, I think.", "Sure?", "Still Porto."]
    sync = with_tiered_memory(PROMPT | FakeListChatModel(responses=["Yes."]), memory)
    streamed = list(sync.stream("Really?", _cfg("ana", "b")))  # a plain str input
    assert "".join(c.text for c in streamed) == "Yes."
    assert [(m.role, m.content) for m in memory.get_messages("b", user_id="ana")] == [
        ("user", "Really?"), ("assistant", "Yes.")]


def test_dict_outputs_other_keys_and_message_inputs(memory: TieredMemory) -> None:
    rec = PromptRecorder()
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("memory"), MessagesPlaceholder("question")])
    chain = with_tiered_memory(
        prompt | RunnableParallel(answer=_model(rec, "42.") | StrOutputParser(), n=RunnableLambda(lambda _: 1)),
        memory, input_messages_key="question", history_messages_key="memory", output_messages_key="answer")
    out = chain.invoke({"question": [HumanMessage("What is six times seven?")]}, _cfg("u", "s"))
    assert out == {"answer": "42.", "n": 1}
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["What is six times seven?", "42."]
    ambiguous = with_tiered_memory(
        PROMPT | RunnableParallel(a=RunnableLambda(lambda _: "x"), b=RunnableLambda(lambda _: "y")), memory)
    with pytest.raises(InvalidInputError, match="output_messages_key"):
        ambiguous.invoke({"input": "hi"}, _cfg("u", "t"))
    assert memory.get_messages("t", user_id="u") == []  # nothing stored for a failed call


def test_a_failing_chain_records_nothing(memory: TieredMemory) -> None:
    def boom(_: Any) -> str:
        raise RuntimeError("model down")

    chain = with_tiered_memory(PROMPT | RunnableLambda(boom), memory)
    with pytest.raises(RuntimeError, match="model down"):
        chain.invoke({"input": "hi"}, _cfg("u", "s"))
    assert memory.get_messages("s", user_id="u") == []


@pytest.mark.parametrize(("call", "match"), [
    (lambda c: c.invoke({"input": "hi"}), "user_id and session_id"),
    (lambda c: c.invoke({"input": "hi"}, {"configurable": {"user_id": "u"}}), "session_id"),
    (lambda c: c.invoke({"text": "hi"}, _cfg("u", "s")), "input_messages_key"),
    (lambda c: c.invoke({"input": 3}, _cfg("u", "s")), "must be a str"),
    (lambda c: c.invoke({"input": "hi", "history": []}, _cfg("u", "s")), "history_messages_key"),
])
def test_bad_calls_raise_typed_errors_that_say_how_to_fix(memory: TieredMemory, call: Any, match: str) -> None:
    chain = with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]), memory)
    with pytest.raises(InvalidInputError, match=match):
        call(chain)
    assert memory.stats().messages == 0


def test_constructor_checks_its_arguments(memory: TieredMemory) -> None:
    with pytest.raises(InvalidInputError, match="Runnable"):
        TieredMemoryRunnable(lambda x: x, memory)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="must differ"):
        with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]), memory, history_messages_key="input")
    with pytest.raises(InvalidInputError, match="max_tokens"):
        with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]), memory, max_tokens=0)
    chain = with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]), memory)
    assert {s.id for s in chain.config_specs} >= {"user_id", "session_id"}


@pytest.mark.parametrize("bad", [None, "./memory", object()])
def test_what_is_not_a_memory_is_refused_when_the_chain_is_built(bad: Any) -> None:
    # as every other adapter does: not at the first call, as an AttributeError deep in it
    with pytest.raises(InvalidInputError, match="memory must be a TieredMemory"):
        with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]), bad)


_TOOL_REPLY = AIMessage("Let me check.", id="r-1", name="planner",
                        tool_calls=[{"name": "calendar", "args": {"day": "friday"}, "id": "call-7",
                                     "type": "tool_call"}],
                        response_metadata={"model_name": "fake-1"},
                        usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5})


@pytest.mark.parametrize("entry", ["invoke", "stream"])
def test_the_recorded_answer_keeps_its_tool_calls_name_and_metadata(memory: TieredMemory, entry: str) -> None:
    from langchain_tiered_memory import TieredChatMessageHistory

    chain = with_tiered_memory(PROMPT | FakeMessagesListChatModel(responses=[_TOOL_REPLY]), memory)
    if entry == "invoke":
        chain.invoke({"input": "Am I free on Friday?"}, _cfg("u", "s"))
    else:
        list(chain.stream({"input": "Am I free on Friday?"}, _cfg("u", "s")))
    answer = TieredChatMessageHistory(memory, "s", user_id="u").messages[-1]
    assert answer == _TOOL_REPLY  # the same message, as RunnableWithMessageHistory would store it


def test_a_streamed_sum_is_stored_as_the_message_it_adds_up_to() -> None:
    from langchain_core.messages import AIMessageChunk

    from langchain_tiered_memory.runnable import output_messages

    total = (AIMessageChunk(content="Let me ", id="r-2")
             + AIMessageChunk(content="check.", tool_call_chunks=[
                 {"name": "calendar", "args": '{"day": "friday"}', "id": "call-8", "index": 0}]))
    [got] = output_messages(total, None)
    assert type(got) is AIMessage and got.text == "Let me check." and got.id == "r-2"
    assert got.tool_calls == [{"name": "calendar", "args": {"day": "friday"}, "id": "call-8", "type": "tool_call"}]


def test_a_dict_answer_with_several_keys_is_read_from_output_as_upstream_does(memory: TieredMemory) -> None:
    chain = with_tiered_memory(
        PROMPT | RunnableParallel(output=RunnableLambda(lambda _: "Paris."), sources=RunnableLambda(lambda _: [])),
        memory)
    assert chain.invoke({"input": "Capital of France?"}, _cfg("u", "s")) == {"output": "Paris.", "sources": []}
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["Capital of France?", "Paris."]


def test_an_answer_of_several_messages_is_recorded_as_upstream_records_it(memory: TieredMemory) -> None:
    """``RunnableWithMessageHistory`` records a chain whose answer is a list of messages (a step
    that plans, then answers); this wrapper raised InvalidInputError after the model had run, so
    the caller lost the answer and nothing of the turn was stored."""
    planned = [AIMessage("Let me think."), AIMessage("Paris.")]
    chain = with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]) | RunnableLambda(lambda _: planned),
                               memory)
    assert chain.invoke({"input": "Capital of France?"}, _cfg("u", "s")) == planned
    assert [(m.role, m.content) for m in memory.get_messages("s", user_id="u")] == [
        ("user", "Capital of France?"), ("assistant", "Let me think."), ("assistant", "Paris.")]
    for bad in ([], ["Paris."]):  # nothing to record, or no messages: refused, as before
        empty = with_tiered_memory(PROMPT | FakeListChatModel(responses=["x"]) | RunnableLambda(lambda _, b=bad: b),
                                   memory)
        with pytest.raises(InvalidInputError, match="message"):
            empty.invoke({"input": "Again?"}, _cfg("u", "s2"))
    assert memory.get_messages("s2", user_id="u") == []


def test_a_recorded_tool_call_without_its_result_is_not_replayed_as_a_call(memory: TieredMemory) -> None:
    # a chain of a tool-calling model answers with a call (the caller runs the tool, or not): it is
    # recorded as the answer, and the next turn's history replayed it before the new input with no
    # result after it, a prompt OpenAI and Anthropic refuse; its text (naming the call) stays
    rec = PromptRecorder()
    call = AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Porto"}, "id": "w1",
                                              "type": "tool_call"}])
    model = FakeMessagesListChatModel(responses=[call, AIMessage("Sunny, probably.")], callbacks=[rec])
    chain = with_tiered_memory(PROMPT | model, memory)
    chain.invoke({"input": "Weather in Porto?"}, _cfg("ana", "s1"))
    chain.invoke({"input": "Never mind, just guess."}, _cfg("ana", "s1"))
    replayed = [m for m in rec.last if isinstance(m, AIMessage)]
    assert len(replayed) == 1 and replayed[0].tool_calls == [] and "get_weather" in replayed[0].text
    stored = memory.get_messages("s1", user_id="ana")
    assert "get_weather" in stored[1].content  # the record itself keeps the call


def test_a_replayed_turn_does_not_make_chat_openai_drop_the_memory_before_it(memory: TieredMemory) -> None:
    """ChatOpenAI(use_responses_api=True, use_previous_response_id=True) sends only what follows
    the last AI message with a ``resp_`` id, and continues that response on the server. A replayed
    turn kept its stored id, so the next call dropped the system prompt and the memory recalled for
    it, and pointed at a stored response that may be gone (30 days, or never kept with store=False)."""
    from langchain_openai import ChatOpenAI

    from lc_support import responses_api_server

    _seed(memory)
    with responses_api_server() as (url, bodies):
        model = ChatOpenAI(model="gpt-4.1", base_url=url, api_key="not-needed", use_responses_api=True,
                           use_previous_response_id=True, max_retries=0)
        chain = with_tiered_memory(PROMPT | model, memory)
        chain.invoke({"input": "Hello!"}, _cfg("ana", "new"))
        replayed = memory.get_messages("new", user_id="ana")[-1]
        assert replayed.metadata["langchain"]["data"]["response_metadata"]["id"] == "resp_1"  # stored as it came
        chain.invoke({"input": "Where did I move to?"}, _cfg("ana", "new"))
    second = bodies[-1]
    assert "previous_response_id" not in second
    sent = json.dumps(second["input"])
    assert "You are a helpful assistant." in sent and "Porto" in sent and "Hello!" in sent


# ---- a runnable that takes messages, as RunnableWithMessageHistory without a history_messages_key ----
@pytest.mark.parametrize("entry", ["invoke", "stream", "ainvoke"])
async def test_a_chat_model_wrapped_directly_gets_the_memory_before_the_input_messages(memory: TieredMemory,
                                                                                       entry: str) -> None:
    # RunnableWithMessageHistory(model, get_session_history) hands the model its history and the input
    # messages as one list (LangChain's chatbot tutorial); with_tiered_memory(model, memory) handed it
    # a dict, which a chat model refuses
    _seed(memory)
    rec = PromptRecorder()
    chain = with_tiered_memory(_model(rec, "Hi Ana.", "In Porto."), memory)
    cfg = _cfg("ana", "s")
    for given in ([HumanMessage("Hi! I'm Ana.")], "Where do I live?"):
        if entry == "invoke":
            out = chain.invoke(given, cfg)
        elif entry == "stream":
            chunks = list(chain.stream(given, cfg))
            out = chunks[0]
            for c in chunks[1:]:
                out = out + c
        else:
            out = await chain.ainvoke(given, cfg)
        assert isinstance(out, AIMessage)
    prompt = rec.last
    assert isinstance(prompt[0], SystemMessage) and "I moved to Porto" in prompt[0].text  # the quoted memory
    assert [(m.type, m.text) for m in prompt[1:]] == [
        ("human", "Hi! I'm Ana."), ("ai", "Hi Ana."), ("human", "Where do I live?")]
    assert [(m.role, m.content) for m in memory.get_messages("s", user_id="ana")] == [
        ("user", "Hi! I'm Ana."), ("assistant", "Hi Ana."), ("user", "Where do I live?"), ("assistant", "In Porto.")]


def test_without_a_history_key_the_messages_go_under_the_input_key_of_a_dict(memory: TieredMemory) -> None:
    # RunnableWithMessageHistory(runnable, ..., input_messages_key="messages"), no history_messages_key
    chain = with_tiered_memory(RunnableLambda(lambda d: "you said: " + " | ".join(
        m.text for m in d["messages"] if isinstance(m, HumanMessage)) + f" ({d['lang']})"), memory,
        input_messages_key="messages", history_messages_key=None)
    cfg = _cfg("u", "s")
    given = {"messages": [HumanMessage("hello")], "lang": "en"}
    assert chain.invoke(given, cfg) == "you said: hello (en)"
    assert chain.invoke({"messages": [HumanMessage("good bye")], "lang": "en"}, cfg) == "you said: hello | good bye (en)"
    assert given == {"messages": [HumanMessage("hello")], "lang": "en"}  # the caller's input is not mutated


def test_a_history_key_a_chat_model_cannot_take_is_refused_when_the_chain_is_built(memory: TieredMemory) -> None:
    with pytest.raises(InvalidInputError, match="history_messages_key=None"):
        with_tiered_memory(FakeListChatModel(responses=["x"]), memory, history_messages_key="history")
