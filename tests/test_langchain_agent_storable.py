"""TieredMemoryMiddleware records what a run's tools produce even where the core would refuse it
as it is (langchain_tiered_memory/storable.py): the run never fails for its memory."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from langchain_tiered_memory import TieredChatMessageHistory, TieredMemoryMiddleware
from langchain_tiered_memory.messages import from_stored_many
from langchain_tiered_memory.storable import REPAIRED_KEY, storable_rows, storable_text
from langchain_tiered_memory.testing import ScriptedToolModel
from tiered_memory import ContentTooLargeError, Embedder, InvalidInputError, StaticEmbedder, TieredMemory
from tiered_memory.context.render import CUT_MARKER

PAGE = "page " * 60_000  # 300,000 characters: a fetched web page, over max_content_chars


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    """What is stored is the point here, not how it ranks: the static embedder. With MiniLM the
    200,000 characters kept of a page took 64 s to embed (a busy machine) of this file's 92."""
    return StaticEmbedder()


@tool
def fetch(url: str) -> str:
    """Fetch a web page."""
    return PAGE


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return "PK\x03\x04\x00\x00binary"


@tool
def write_file(path: str, text: str) -> str:
    """Write a file."""
    return f"wrote {len(text)} characters"


def _call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def _run(memory: TieredMemory, tools: list[Any], call: AIMessage, session: str) -> list[Any]:
    model = ScriptedToolModel(responses=[call, AIMessage("Done.")])
    agent = create_agent(model, tools, middleware=[TieredMemoryMiddleware(memory)])
    out = agent.invoke({"messages": [HumanMessage("Please do it.")]}, context={"user_id": "u1", "session_id": session})
    return list(out["messages"])


def test_a_tool_output_over_max_content_chars_is_stored_cut_and_the_run_answers(
        memory: TieredMemory, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        out = _run(memory, [fetch], _call("fetch", {"url": "https://example.org"}, "c1"), "s1")
    assert out[-1].text == "Done."
    stored = memory.get_messages("s1", user_id="u1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    tool_row = stored[2]
    assert len(tool_row.content) == memory.config.max_content_chars and tool_row.content.endswith(CUT_MARKER)
    assert PAGE.startswith(tool_row.content[:-len(CUT_MARKER)])
    assert tool_row.metadata[REPAIRED_KEY] == ["cut from 300,000 to 200,000 characters"]
    assert "changed to be storable: cut from 300,000" in caplog.text
    replay = from_stored_many(stored, before_new_turn=True)  # still a call and its (cut) result
    assert isinstance(replay[2], ToolMessage) and replay[2].tool_call_id == "c1"
    assert replay[1].tool_calls[0]["id"] == "c1"  # type: ignore[attr-defined]


def test_a_tool_output_with_nul_characters_is_stored_without_them(memory: TieredMemory) -> None:
    out = _run(memory, [read_file], _call("read_file", {"path": "a.zip"}, "c2"), "s2")
    assert out[-1].text == "Done."
    stored = memory.get_messages("s2", user_id="u1")
    assert stored[2].content == "PK\x03\x04binary"
    assert stored[2].metadata[REPAIRED_KEY] == ["removed NUL characters"]
    assert [m.content for m in stored][-1] == "Done."


def test_a_tool_call_whose_arguments_pass_max_metadata_bytes_is_stored_as_its_text(memory: TieredMemory) -> None:
    text = "x" * 70_000  # a file the model writes through a tool: its call alone is over 64,000 bytes
    out = _run(memory, [write_file], _call("write_file", {"path": "big.txt", "text": text}, "c3"), "s3")
    assert out[-1].text == "Done." and out[2].text == "wrote 70000 characters"
    stored = memory.get_messages("s3", user_id="u1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    call_row = stored[1]
    assert call_row.content.startswith('[tool calls] write_file({"path": "big.txt", "text": "xxx')
    assert call_row.metadata["langchain"]["data"] == {"id": out[1].id}  # its id: recorded once
    assert call_row.metadata[REPAIRED_KEY] == ["left out its fields tool_calls: over max_metadata_bytes or too deep"]
    # a replay shows it as its text, and its result, whose call is not replayed, as quoted data
    replay = from_stored_many(stored, before_new_turn=True)
    assert isinstance(replay[1], AIMessage) and not replay[1].tool_calls
    assert isinstance(replay[2], HumanMessage) and replay[2].text.startswith("[stored tool result]")


def test_an_explicit_write_still_refuses_what_the_core_cannot_store(memory: TieredMemory) -> None:
    history = TieredChatMessageHistory(memory, "s4", user_id="u1")
    with pytest.raises(ContentTooLargeError):
        history.add_messages([ToolMessage(PAGE, tool_call_id="c")])
    with pytest.raises(InvalidInputError, match="NUL"):
        history.add_messages([HumanMessage("a\x00b")])
    assert memory.get_messages("s4", user_id="u1") == []


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("artifact, changes", [
    (_deep(300), ["left out its fields artifact: over max_metadata_bytes or too deep"]),
    ({(1, 2): "a tuple key"},
     ["left out its fields additional_kwargs, artifact, response_metadata: JSON cannot write them"]),
    ({"raw": "a\x00b"}, ["removed NUL characters or replaced lone surrogates in its fields"]),
])
def test_a_tool_artifact_the_core_cannot_hold_is_left_out_or_cleaned(memory: TieredMemory, artifact: Any,
                                                                      changes: list[str]) -> None:
    # a tool's artifact (response_format="content_and_artifact") may be any object: a parsed document
    # nested deeper than the core keeps, a dict with tuple keys; the result itself is stored
    rows = storable_rows([ToolMessage("result", tool_call_id="c", id="t1", artifact=artifact)],
                         max_chars=memory.config.max_content_chars, max_bytes=memory.config.max_metadata_bytes)
    assert rows[0]["metadata"][REPAIRED_KEY] == changes
    memory.add_many(rows, session_id="s5", user_id="u1")
    assert [(m.content, m.metadata["langchain"]["data"]["id"]) for m in memory.get_messages("s5", user_id="u1")] == [
        ("result", "t1")]


def test_a_message_the_core_accepts_is_stored_as_to_core_writes_it() -> None:
    from langchain_tiered_memory import to_core

    message = AIMessage("Hi.", id="a1", response_metadata={"model_name": "m"})
    assert storable_rows([message], max_chars=100, max_bytes=64_000) == [to_core(message)]


def test_metadata_that_fits_max_metadata_bytes_exactly_is_stored_whole() -> None:
    # the fitting measured the metadata with an empty "dropped" list it never stores, so fields
    # that fit to the byte were left out (and the message marked changed) though the core took them
    from langchain_tiered_memory import to_core
    from langchain_tiered_memory.messages import LC_KEY, metadata_size

    message = AIMessage("Hi.", id="a1", additional_kwargs={"note": "x" * 300})
    exact = metadata_size(to_core(message)["metadata"][LC_KEY])
    for max_bytes in (exact, exact + 5):
        assert storable_rows([message], max_chars=100, max_bytes=max_bytes) == [
            to_core(message, max_metadata_bytes=max_bytes)]
    row, = storable_rows([message], max_chars=100, max_bytes=exact - 1)
    assert row["metadata"][LC_KEY]["dropped"] == ["additional_kwargs"]  # a byte less: to_core's fitting drops it


@pytest.mark.parametrize("messages, error", [
    ([HumanMessage("hi"), "not a message"], "message 1: expected a LangChain BaseMessage, got str"),
    ("hi", "expected a sequence of LangChain messages, got str"),
    (HumanMessage("hi"), "expected a sequence of LangChain messages, got HumanMessage"),
])
def test_a_recorded_turn_is_refused_as_an_explicit_write_refuses_it(messages: Any, error: str) -> None:
    from langchain_tiered_memory.messages import to_core_many

    for convert in (to_core_many, lambda m: storable_rows(m, max_chars=100, max_bytes=64_000)):
        with pytest.raises(InvalidInputError) as caught:
            convert(messages)
        assert str(caught.value) == error


def test_recorded_text_is_made_storable_by_the_cores_storable_text() -> None:
    # one function for both adapters (its rules: tests/test_core_storable.py)
    from tiered_memory import storable

    assert storable_text is storable.storable_text
