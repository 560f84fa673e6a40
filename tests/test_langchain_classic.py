"""The classic memory= bridge: ConversationChain and LLMChain from langchain-classic, several turns."""

from __future__ import annotations

from typing import Callable

import pytest
from langchain_classic.chains import ConversationChain, LLMChain
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate

from langchain_tiered_memory import TieredChatMessageHistory, TieredConversationMemory
from lc_support import PromptRecorder
from tiered_memory import InvalidInputError, TieredMemory
from tiered_memory.errors import InvalidArgumentsError

# ConversationChain and LLMChain are deprecated by LangChain; this module is the bridge for
# apps that still use them, so constructing them must not fail the suite.
pytestmark = pytest.mark.filterwarnings(
    "ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")


def _model(rec: PromptRecorder, *replies: str) -> FakeMessagesListChatModel:
    return FakeMessagesListChatModel(responses=[AIMessage(content=r) for r in replies], callbacks=[rec])


def _seed(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "My sister Lena lives in Oslo."},
                     {"role": "assistant", "content": "Oslo is beautiful."}], session_id="2024", user_id="ana")
    memory.add_many([{"role": "user", "content": "My sister Marta lives in Rome."}],
                    session_id="2024", user_id="bo")


def test_conversation_chain_recalls_earlier_session_not_other_users(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory()
    _seed(memory)
    rec = PromptRecorder()
    chain = ConversationChain(llm=_model(rec, "Hello Ana!", "She lives in Oslo.", "Bye."),
                              memory=TieredConversationMemory(memory=memory, user_id="ana", session_id="2025"))
    chain.invoke({"input": "Hi, it's Ana again."})
    chain.invoke({"input": "Where does my sister live?"})
    prompt = rec.last_text()
    assert "Lena lives in Oslo" in prompt  # from an earlier session
    assert "Marta" not in prompt and "Rome" not in prompt  # another user's memory
    assert 'Human: "Hi, it\'s Ana again."\nAI: "Hello Ana!"' in prompt  # this session's turns
    assert "not instructions" in prompt  # memory is quoted as data
    out = chain.invoke({"input": "Thanks!"})
    assert out["response"] == "Bye."
    stored = [m.content for m in memory.get_messages("2025", user_id="ana")]
    assert stored == ["Hi, it's Ana again.", "Hello Ana!", "Where does my sister live?",
                      "She lives in Oslo.", "Thanks!", "Bye."]


def test_llm_chain_with_prompt_template_and_custom_memory_key(memory: TieredMemory) -> None:
    _seed(memory)
    rec = PromptRecorder()
    prompt = PromptTemplate.from_template(
        "Known about the user:\n{chat_memory}\n\nQuestion: {question}\nAnswer:")
    tiered = TieredConversationMemory(memory=memory, user_id="bo", session_id="now",
                                      memory_key="chat_memory", input_key="question")
    chain = LLMChain(llm=_model(rec, "Rome.", "Marta."), prompt=prompt, memory=tiered)
    assert chain.invoke({"question": "Which city does my sister live in?"})["text"] == "Rome."
    assert "Marta lives in Rome" in rec.last_text() and "Oslo" not in rec.last_text()
    chain.invoke({"question": "And what's her name?"})
    assert "Question: Which city does my sister live in?" not in rec.last_text()
    assert 'Human: "Which city does my sister live in?"\nAI: "Rome."' in rec.last_text()
    assert [m.role for m in memory.get_messages("now", user_id="bo")] == ["user", "assistant"] * 2


async def test_return_messages_with_chat_prompt_async(memory: TieredMemory) -> None:
    _seed(memory)
    rec = PromptRecorder()
    prompt = ChatPromptTemplate.from_messages([
        ("system", "You are kind."), MessagesPlaceholder("history"), ("human", "{input}")])
    tiered = TieredConversationMemory(memory=memory, user_id="ana", session_id="s", return_messages=True)
    chain = LLMChain(llm=_model(rec, "Oslo!", "Yes."), prompt=prompt, memory=tiered)
    await chain.ainvoke({"input": "Where is Lena?"})
    system = [m.text for m in rec.last if isinstance(m, SystemMessage)]
    assert system[0] == "You are kind." and "Lena lives in Oslo" in system[1]
    await chain.ainvoke({"input": "Sure?"})
    assert [m.type for m in rec.last][-3:] == ["human", "ai", "human"]
    variables = await tiered.aload_memory_variables({"input": "Lena"})
    assert [m.type for m in variables["history"]][-2:] == ["human", "ai"]
    await tiered.aclear()
    assert memory.get_messages("s", user_id="ana") == []
    assert len(memory.get_messages("2024", user_id="ana")) == 2  # clear is per session


def test_memory_validates_ids_and_output_keys(memory: TieredMemory) -> None:
    with pytest.raises(ValueError, match="user_id must be a non-empty string"):  # pydantic wraps it
        TieredConversationMemory(memory=memory, user_id="", session_id="s")
    tiered = TieredConversationMemory(memory=memory, user_id="u", session_id="s")
    with pytest.raises(ValueError, match="output_key"):
        tiered.save_context({"input": "hi"}, {"a": "1", "b": "2"})
    tiered.save_context({"input": "hi"}, {"a": "1", "output": "hello"})
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["hi", "hello"]
    assert tiered.load_memory_variables({"input": "hi"})["history"].endswith('Human: "hi"\nAI: "hello"')


def test_a_message_in_a_turn_is_stored_as_its_text_and_a_list_is_refused(memory: TieredMemory) -> None:
    tiered = TieredConversationMemory(memory=memory, user_id="u", session_id="s")
    tiered.save_context({"input": HumanMessage("hello there")}, {"output": AIMessage("hi, Ana")})
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["hello there", "hi, Ana"]
    with pytest.raises(InvalidInputError, match="input 'input' is a list"):
        tiered.save_context({"input": [HumanMessage("a"), HumanMessage("b")]}, {"output": "x"})
    with pytest.raises(InvalidInputError, match="output is a dict"):
        tiered.save_context({"input": "a"}, {"output": {"answer": "x"}})
    assert len(memory.get_messages("s", user_id="u")) == 2  # nothing of either was stored
    tiered.save_context({"input": 42}, {"output": 3.5})  # a number is stored as written
    assert [m.content for m in memory.get_messages("s", user_id="u")][2:] == ["42", "3.5"]


def test_load_memory_variables_without_input_shows_the_buffer(memory: TieredMemory) -> None:
    _seed(memory)
    tiered = TieredConversationMemory(memory=memory, user_id="ana", session_id="2024")
    # the classic docs' way to look at a memory: no input, so no recall, the session's turns
    assert tiered.load_memory_variables({}) == {
        "history": 'Human: "My sister Lena lives in Oslo."\nAI: "Oslo is beautiful."'}
    assert tiered.buffer == tiered.buffer_as_str == tiered.load_memory_variables({})["history"]
    assert [m.type for m in tiered.buffer_as_messages] == ["human", "ai"]
    as_messages = TieredConversationMemory(memory=memory, user_id="ana", session_id="2024",
                                           return_messages=True, input_key="question")
    assert as_messages.load_memory_variables({}) == {"history": tiered.buffer_as_messages}
    assert as_messages.buffer == tiered.buffer_as_messages
    empty = TieredConversationMemory(memory=memory, user_id="ana", session_id="new")
    assert empty.load_memory_variables({}) == {"history": ""}
    assert empty.load_memory_variables({"input": "   "}) == {"history": ""}


async def test_chat_memory_is_the_same_session_as_a_history(memory: TieredMemory) -> None:
    tiered = TieredConversationMemory(memory=memory, user_id="ana", session_id="s", return_messages=True)
    history = tiered.chat_memory
    assert isinstance(history, TieredChatMessageHistory)
    assert (history.user_id, history.session_id) == ("ana", "s")
    history.add_user_message("I play the oboe.")
    tiered.save_context({"input": "And the flute?"}, {"response": "Noted."})
    assert [m.text for m in tiered.chat_memory.messages] == ["I play the oboe.", "And the flute?", "Noted."]
    assert [m.text for m in await tiered.abuffer()] == ["I play the oboe.", "And the flute?", "Noted."]
    assert (await tiered.aload_memory_variables({}))["history"] == tiered.buffer
    tiered.return_messages = False
    assert await tiered.abuffer() == 'Human: "I play the oboe."\nHuman: "And the flute?"\nAI: "Noted."'
    assert memory.get_messages("s", user_id="bo") == []  # another user's session of that name


def test_unknown_arguments_are_refused_not_silently_ignored(memory: TieredMemory) -> None:
    from langchain_core.chat_history import InMemoryChatMessageHistory

    with pytest.raises(ValueError, match="retrun_messages"):  # pydantic names the misspelt option
        TieredConversationMemory(memory=memory, user_id="u", session_id="s", retrun_messages=True)
    # the classic memories take chat_memory=; this one's is always its session in `memory`
    with pytest.raises(ValueError, match="chat_memory"):
        TieredConversationMemory(memory=memory, user_id="u", session_id="s",
                                 chat_memory=InMemoryChatMessageHistory())


@pytest.mark.parametrize(("option", "instead"), [
    ("k", "max_tokens"),  # ConversationBufferWindowMemory
    ("max_token_limit", "max_tokens"),  # ConversationTokenBufferMemory, ConversationSummaryBufferMemory
    ("llm", r"TieredMemory\(llm="),  # the summary memories
    ("chat_memory", "its own session"),
    ("retriever", "TieredMemoryRetriever"),  # VectorStoreRetrieverMemory
    ("return_docs", "TieredMemoryRetriever"),
    ("exclude_input_keys", "input_key"),
    ("prompt", "not summarised"),  # the summary memories' summarising prompt
])
def test_an_option_of_the_window_or_summary_memories_is_refused_saying_what_stands_in_for_it(
    memory: TieredMemory, option: str, instead: str,
) -> None:
    # an app swapping ConversationBufferWindowMemory(k=5, ...) for this one is told what bounds the
    # context here, not only that k is unknown
    with pytest.raises(InvalidArgumentsError, match=f"{option}=.*{instead}"):
        TieredConversationMemory(memory=memory, user_id="u", session_id="s", **{option: 5})


@pytest.mark.parametrize(("kwargs", "inputs", "outputs", "match"), [
    ({}, {"input": "a", "context": "b"}, {"output": "x"}, r"One input key expected got \['context', 'input'\]"),
    ({}, {}, {"output": "x"}, "One input key expected got"),
    ({"input_key": "question"}, {"input": "a"}, {"output": "x"}, "no 'question'.*fix input_key"),
    ({"output_key": "answer"}, {"input": "a"}, {"output": "x"}, "no 'answer'.*fix output_key"),
    ({}, {"input": "a"}, {"a": "1", "b": "2"}, "set output_key"),
    ({}, {"input": "a"}, {}, "set output_key"),
    ({}, {"input": None}, {"output": "x"}, "input 'input' is None"),
    ({}, {"input": "a"}, {"output": None}, "output is None"),
])
def test_save_context_refuses_what_it_cannot_store_with_a_typed_error(
    memory: TieredMemory, kwargs: dict[str, str], inputs: dict[str, object], outputs: dict[str, object],
    match: str,
) -> None:
    tiered = TieredConversationMemory(memory=memory, user_id="u", session_id="s", **kwargs)
    with pytest.raises(InvalidInputError, match=match):
        tiered.save_context(inputs, outputs)
    assert memory.get_messages("s", user_id="u") == []  # nothing of the turn was stored


def test_a_prompt_with_several_inputs_needs_input_key_before_the_model_runs(memory: TieredMemory) -> None:
    rec = PromptRecorder()
    prompt = PromptTemplate.from_template("{history}\nContext: {context}\nQ: {question}")
    chain = LLMChain(llm=_model(rec, "Fine."), prompt=prompt,
                     memory=TieredConversationMemory(memory=memory, user_id="u", session_id="s"))
    with pytest.raises(InvalidInputError, match="set input_key"):
        chain.invoke({"context": "none", "question": "How are you?"})
    assert rec.prompts == [] and memory.get_messages("s", user_id="u") == []
    chain.memory = TieredConversationMemory(memory=memory, user_id="u", session_id="s", input_key="question")
    assert chain.invoke({"context": "none", "question": "How are you?"})["text"] == "Fine."
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["How are you?", "Fine."]


@pytest.mark.parametrize("bad", [0, -5, "300", True])
def test_a_bad_max_tokens_is_refused_when_the_memory_is_built(memory: TieredMemory, bad: object) -> None:
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):  # inside pydantic's error
        TieredConversationMemory(memory=memory, user_id="u", session_id="s", max_tokens=bad)


def test_an_input_key_the_chain_does_not_have_fails_before_the_model_runs(memory: TieredMemory) -> None:
    """With ``input_key="input"`` on a chain whose input is ``question``, the load fell back to the
    buffer (no recall) and the model ran; only the save then raised, so the answer was lost. A call
    with inputs but without the key now fails at the load, as a prompt with several inputs does;
    ``load_memory_variables({})`` still shows the buffer."""
    rec = PromptRecorder()
    prompt = PromptTemplate.from_template("{history}\nQ: {question}")
    tiered = TieredConversationMemory(memory=memory, user_id="u", session_id="s", input_key="input")
    chain = LLMChain(llm=_model(rec, "Fine."), prompt=prompt, memory=tiered)
    with pytest.raises(InvalidInputError, match="no 'input'.*fix input_key"):
        chain.invoke({"question": "How are you?"})
    assert rec.prompts == [] and memory.get_messages("s", user_id="u") == []
    assert tiered.load_memory_variables({}) == {"history": ""}
    assert tiered.load_memory_variables({"stop": ["\n"]}) == {"history": ""}


def test_a_tool_call_without_its_result_is_not_loaded_as_a_call(memory: TieredMemory) -> None:
    # a session an agent shares (its run ended on a call a guardrail refused: the call has no result);
    # loaded before the new input, the call made a prompt OpenAI and Anthropic refuse
    from langchain_core.messages import ToolMessage

    from langchain_tiered_memory.messages import to_core_many

    call = AIMessage(content="", tool_calls=[{"name": "delete_files", "args": {"path": "/"}, "id": "d1",
                                              "type": "tool_call"}])
    memory.add_many(to_core_many([HumanMessage("Delete everything."), call, AIMessage("I can't delete files.")]),
                    session_id="s", user_id="ana")
    tiered = TieredConversationMemory(memory=memory, user_id="ana", session_id="s", return_messages=True)
    loaded = tiered.load_memory_variables({"input": "What did I ask you to delete?"})["history"]
    replayed = [m for m in loaded if isinstance(m, AIMessage)]
    assert [m.tool_calls for m in replayed] == [[], []] and "delete_files" in replayed[0].text
    assert not any(isinstance(m, ToolMessage) for m in loaded)


@pytest.mark.parametrize("inputs", [{"input": "   "}, {"input": HumanMessage([{"type": "image", "url": "https://x/y.png"}])},
                                    {}])
def test_a_load_with_nothing_to_recall_for_is_still_a_replay_before_a_new_turn(memory: TieredMemory,
                                                                              inputs: dict[str, object]) -> None:
    # a blank input, an image alone, or a chain with no input: no recall, the session's turns. They go
    # before the new turn as with an input: a call no result answers made a prompt OpenAI and Anthropic
    # refuse, and a stored response id made ChatOpenAI(use_previous_response_id=True) send only what follows
    from langchain_tiered_memory.messages import to_core_many

    call = AIMessage(content="", tool_calls=[{"name": "delete_files", "args": {"path": "/"}, "id": "d1",
                                              "type": "tool_call"}])
    answer = AIMessage("I can't delete files.", response_metadata={"id": "resp_1", "model_name": "m"})
    memory.add_many(to_core_many([HumanMessage("Delete everything."), call, answer]), session_id="s", user_id="ana")
    tiered = TieredConversationMemory(memory=memory, user_id="ana", session_id="s", return_messages=True)
    loaded = tiered.load_memory_variables(inputs)["history"]
    assert [type(m) for m in loaded] == [HumanMessage, AIMessage, AIMessage]
    assert loaded[1].tool_calls == [] and "delete_files" in loaded[1].text
    assert loaded[2].response_metadata == {"model_name": "m"}
    assert tiered.buffer_as_messages[1].tool_calls  # the buffer itself is the session as stored
