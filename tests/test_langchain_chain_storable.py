"""with_tiered_memory and the classic memory= record a turn after the model answered: a reply (or an
input) the core would refuse as it is is stored made storable (langchain_tiered_memory/storable.py),
marked and logged, so the call returns the model's answer instead of failing after it."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
from langchain_classic.chains import ConversationChain
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder

from langchain_tiered_memory import TieredChatMessageHistory, TieredConversationMemory, with_tiered_memory
from langchain_tiered_memory.storable import REPAIRED_KEY
from tiered_memory import ContentTooLargeError, MemoryConfig, TieredMemory
from tiered_memory.context.render import CUT_MARKER

LIMIT = 1_000
LONG = "word " * 600  # 3,000 characters: a reply over max_content_chars
PROMPT = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{input}")])


def _model(*replies: AIMessage) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter(replies))


def _cfg(session: str) -> dict[str, Any]:
    return {"configurable": {"user_id": "u1", "session_id": session}}


@pytest.fixture
def small(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    return make_memory(config=MemoryConfig(max_content_chars=LIMIT))


def _assert_cut(row: Any) -> None:
    assert len(row.content) == LIMIT and row.content.endswith(CUT_MARKER)
    assert LONG.startswith(row.content[:-len(CUT_MARKER)])
    assert row.metadata[REPAIRED_KEY] == [f"cut from 3,000 to {LIMIT:,} characters"]


def test_an_lcel_reply_over_max_content_chars_is_returned_and_stored_cut(
        small: TieredMemory, caplog: pytest.LogCaptureFixture) -> None:
    chain = with_tiered_memory(PROMPT | _model(AIMessage(LONG)), small)
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        out = chain.invoke({"input": "Write me an essay."}, _cfg("s1"))
    assert out.content == LONG  # the caller gets the whole answer
    user, ai = small.get_messages("s1", user_id="u1")
    assert (user.content, REPAIRED_KEY in user.metadata) == ("Write me an essay.", False)
    _assert_cut(ai)
    assert "assistant message of session 's1' was changed to be storable: cut from 3,000" in caplog.text


def test_an_lcel_stream_whose_sum_holds_nul_is_yielded_and_stored_without_it(small: TieredMemory) -> None:
    chain = with_tiered_memory(PROMPT | _model(AIMessage("bin\x00ary reply")), small)
    chunks = list(chain.stream({"input": "Read the file."}, _cfg("s2")))
    assert "".join(c.text for c in chunks) == "bin\x00ary reply"
    ai = small.get_messages("s2", user_id="u1")[-1]
    assert (ai.content, ai.metadata[REPAIRED_KEY]) == ("binary reply", ["removed NUL characters"])


async def test_an_async_lcel_reply_whose_tool_call_passes_max_metadata_bytes_is_stored_as_its_text(
        small: TieredMemory) -> None:
    call = {"name": "write_file", "args": {"path": "a.txt", "text": "x" * 70_000}, "id": "c1", "type": "tool_call"}
    chain = with_tiered_memory(PROMPT | _model(AIMessage("Writing it.", tool_calls=[call])), small)
    out = await chain.ainvoke({"input": "Write the file."}, _cfg("s3"))
    assert out.tool_calls[0]["args"]["text"] == "x" * 70_000
    ai = small.get_messages("s3", user_id="u1")[-1]
    assert ai.content == "Writing it."
    assert ai.metadata[REPAIRED_KEY] == ["left out its fields tool_calls: over max_metadata_bytes or too deep"]


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
def test_a_classic_chain_reply_over_max_content_chars_is_returned_and_stored_cut(
        small: TieredMemory, caplog: pytest.LogCaptureFixture) -> None:
    chain = ConversationChain(llm=_model(AIMessage(LONG)),
                              memory=TieredConversationMemory(memory=small, user_id="u1", session_id="c1"))
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        out = chain.invoke({"input": "Write me an essay."})
    assert out["response"] == LONG
    user, ai = small.get_messages("c1", user_id="u1")
    assert (user.content, REPAIRED_KEY in user.metadata) == ("Write me an essay.", False)
    _assert_cut(ai)
    assert "assistant message of session 'c1' was changed to be storable" in caplog.text


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
async def test_a_classic_chain_reply_with_nul_is_returned_and_stored_without_it(small: TieredMemory) -> None:
    chain = ConversationChain(llm=_model(AIMessage("bin\x00ary")),
                              memory=TieredConversationMemory(memory=small, user_id="u1", session_id="c2"))
    out = await chain.ainvoke({"input": "Read the file."})
    assert out["response"] == "bin\x00ary"
    ai = small.get_messages("c2", user_id="u1")[-1]
    assert (ai.content, ai.metadata[REPAIRED_KEY]) == ("binary", ["removed NUL characters"])


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
@pytest.mark.parametrize("path", ["lcel", "classic"])
def test_an_input_with_nul_is_answered_and_stored_without_it(small: TieredMemory, path: str) -> None:
    # recall takes the input as it is; its record comes after the model answered
    model = _model(AIMessage("It is a zip file."))
    if path == "lcel":
        out = with_tiered_memory(PROMPT | model, small).invoke({"input": "What is PK\x03\x04\x00?"}, _cfg("i1")).content
    else:
        out = ConversationChain(llm=model, memory=TieredConversationMemory(
            memory=small, user_id="u1", session_id="i1")).invoke({"input": "What is PK\x03\x04\x00?"})["response"]
    assert out == "It is a zip file."
    user, ai = small.get_messages("i1", user_id="u1")
    assert (user.content, user.metadata[REPAIRED_KEY]) == ("What is PK\x03\x04?", ["removed NUL characters"])
    assert (ai.content, REPAIRED_KEY in ai.metadata) == ("It is a zip file.", False)


def test_an_explicit_write_still_refuses_what_the_core_would(small: TieredMemory) -> None:
    history = TieredChatMessageHistory(small, "h1", user_id="u1")
    with pytest.raises(ContentTooLargeError):
        history.add_messages([AIMessage(LONG)])
    assert small.get_messages("h1", user_id="u1") == []
