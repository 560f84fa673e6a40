"""TieredMemoryBlock and the input a real ``Memory`` hands it: text the core refuses is stored
repaired and the flush goes on, a session with no text ends as a no-op, and what is not a list of
chat messages or a valid session id is refused with a typed error, storing nothing."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ImageBlock, TextBlock, ToolCallBlock  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402
from llama_index.core.storage.chat_store.sql import MessageStatus  # noqa: E402

from li_support import FILLER, TOKENIZER, chat, memory_message, small_memory, turn  # noqa: E402

from llamaindex_tiered_memory import TieredMemoryBlock, WriteThroughMemory, aend_session, end_session  # noqa: E402
from llamaindex_tiered_memory.messages import REPAIRED_KEY  # noqa: E402
from tiered_memory import InvalidInputError, MemoryConfig, TieredMemory, UsageError  # noqa: E402
from tiered_memory.context.render import CUT_MARKER, PREAMBLE  # noqa: E402


# ---- text the core refuses ------------------------------------------------------
LIMIT = 2_000  # max_content_chars of the stores below: a long message stays cheap to build
BAD_TEXT = {
    "nul": ("tool output: binary\x00junk", "tool output: binaryjunk"),
    "surrogate": ("decoded badly \udcff here", "decoded badly ? here"),
}


@pytest.mark.parametrize("kind", ["nul", "surrogate", "too long"])
async def test_a_message_the_core_refuses_is_stored_repaired_and_the_flush_goes_on(
    make_memory: Callable[..., TieredMemory], caplog: pytest.LogCaptureFixture, kind: str,
) -> None:
    tm = make_memory(config=MemoryConfig(max_content_chars=LIMIT))
    bad = "pasted log " + "line of log output\n" * 200 if kind == "too long" else BAD_TEXT[kind][0]
    mem = small_memory(TieredMemoryBlock(memory=tm, user_id="u1"), "s1")
    await mem.aput_messages(turn("My dog is called Biscuit.", "Nice name."))
    with caplog.at_level(logging.WARNING, logger="llamaindex_tiered_memory.block"):
        await mem.aput(ChatMessage(role="tool", content=bad, additional_kwargs={"tool_call_id": "c1"}))
        await mem.aput_messages(turn("What's up?", "Not much."))
        for q, a in FILLER:
            await mem.aput_messages(turn(q, a))

    stored = tm.get_messages("s1", user_id="u1")
    contents = [m.content for m in stored]
    assert "My dog is called Biscuit." in contents  # the rest of the batch reached long-term memory
    assert "What's up?" in contents
    tool = [m for m in stored if m.role == "tool"]
    assert len(tool) == 1 and tool[0].metadata[REPAIRED_KEY]
    if kind == "too long":
        assert len(tool[0].content) == LIMIT and tool[0].content.endswith(CUT_MARKER)
        assert bad.startswith(tool[0].content[: -len(CUT_MARKER)])
    else:
        assert tool[0].content == BAD_TEXT[kind][1]
    assert any("changed to be storable" in r.getMessage() for r in caplog.records)


async def test_write_through_stores_a_refused_message_repaired_and_keeps_it_in_the_queue(
    make_memory: Callable[..., TieredMemory],
) -> None:
    tm = make_memory(config=MemoryConfig(max_content_chars=LIMIT))
    block = TieredMemoryBlock(memory=tm, user_id="u1", every_turn=True)
    mem = WriteThroughMemory.from_defaults(session_id="s1", memory_blocks=[block], tokenizer_fn=TOKENIZER)
    huge = "x" * (LIMIT + 1)
    await mem.aput(chat("user", "binary\x00junk"))
    await mem.aput_messages([chat("assistant", huge), chat("user", "\x00")])  # the last has no text left
    queue = [m.content for m in await mem.aget_all()]
    assert queue == ["binary\x00junk", huge, "\x00"]  # the chat store keeps what the caller gave
    stored = [m.content for m in tm.get_messages("s1", user_id="u1")]
    assert stored[0] == "binaryjunk" and len(stored) == 2
    assert len(stored[1]) == LIMIT and stored[1].endswith(CUT_MARKER)


async def test_a_lone_surrogate_in_the_latest_user_message_does_not_break_recall(memory: TieredMemory) -> None:
    # badly decoded input the chat store accepts; the core refuses it as a query
    memory.add_many([{"role": "user", "content": "My dog is called Biscuit."}], session_id="old", user_id="u1")
    mem = Memory.from_defaults(session_id="s1", tokenizer_fn=TOKENIZER,
                               memory_blocks=[TieredMemoryBlock(memory=memory, user_id="u1")])
    await mem.aput(chat("user", "What is my dog called? \udcff"))
    got = await mem.aget()
    assert "Biscuit" in memory_message(got)
    assert got[-1].content == "What is my dog called? \udcff"  # the queue keeps what the caller gave
    assert "Biscuit" in memory_message(await mem.aget(input="my dog \udcff?"))


# ---- ending a session that stored no text --------------------------------------------
@pytest.mark.parametrize(
    "messages",
    [
        [],
        [ChatMessage(role="user", blocks=[ImageBlock(url="https://example.com/x.png")])],
        [ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [{"id": "1"}]})],
    ],
    ids=["fresh", "image only", "tool call only"],
)
async def test_end_session_with_no_stored_text_is_a_no_op(memory: TieredMemory, messages: list[ChatMessage]) -> None:
    mem = Memory.from_defaults(session_id="s1", tokenizer_fn=TOKENIZER,
                               memory_blocks=[TieredMemoryBlock(memory=memory, user_id="u1")])
    if messages:
        await mem.aput_messages(messages)
    assert await aend_session(mem) is None
    assert memory.get_messages("s1", user_id="u1") == [] and memory.episodes("u1") == []
    assert len(await mem.aget_all(status=MessageStatus.ARCHIVED)) == len(messages)  # the queue moved, as documented
    await mem.aput_messages(turn("The spare key is under the mat.", "Noted."))
    await aend_session(mem)  # a session with text still ends with an episode
    assert len(memory.episodes("u1")) == 1


# ---- bad input: a typed error, nothing stored ------------------------------------------
NOT_MESSAGES = {
    "a string": "hello",
    "one message, not a list": ChatMessage(role="user", content="hello"),
    "dicts": [{"role": "user", "content": "hello"}],
    "a None inside": [ChatMessage(role="user", content="hello"), None],
    "a number": 5,
}


@pytest.mark.parametrize("bad", list(NOT_MESSAGES.values()), ids=list(NOT_MESSAGES))
async def test_what_is_not_a_list_of_chat_messages_is_refused_with_a_typed_error(
    memory: TieredMemory, bad: Any,
) -> None:
    block = TieredMemoryBlock(memory=memory, user_id="u1", session_id="s1")
    calls = {
        "aget": lambda: block.aget(bad),
        "aput (flush)": lambda: block.aput(bad, from_short_term_memory=True, session_id="s1"),
        "aput": lambda: block.aput(bad),
        "arecord": lambda: block.arecord(bad),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidInputError, match="ChatMessage"):
            await call()
    assert memory.get_messages("s1", user_id="u1") == []  # not even the good first message


async def test_an_empty_or_invalid_session_id_is_refused_not_replaced(memory: TieredMemory) -> None:
    block = TieredMemoryBlock(memory=memory, user_id="u1", session_id="fallback")
    for sid in ["", "  ", "a\x00b", 5]:
        with pytest.raises(InvalidInputError, match="session_id"):
            await block.arecord([chat("user", "hello")], session_id=sid)
        with pytest.raises(InvalidInputError, match="session_id"):
            await block.aget([chat("user", "hello")], session_id=sid)
    assert memory.get_messages("fallback", user_id="u1") == []


async def test_outside_a_memory_puts_with_nothing_to_store_are_no_ops_without_a_session(
    memory: TieredMemory,
) -> None:
    # LlamaIndex's own blocks take aput([]) and messages without text on their own; ours needs a
    # session only to store something, and says so rather than inventing one
    block = TieredMemoryBlock(memory=memory, user_id="u1")
    nothing = [
        [],
        [ChatMessage(role="user", blocks=[ImageBlock(url="http://example.com/cat.png")])],
        [ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_call_id="c1", tool_name="weather")])],
    ]
    for messages in nothing:
        await block.aput(messages)
        await block.aput(messages, from_short_term_memory=True)
        assert await block.arecord(messages) == []
    with pytest.raises(UsageError, match="session"):
        await block.aput([chat("user", "my cat is Miso")])
    with pytest.raises(InvalidInputError, match="session_id"):  # a bad session id is still refused
        await block.aput([], session_id="")
    assert memory.sessions("u1") == []  # nothing stored anywhere


def test_end_session_refuses_what_is_not_a_memory(memory: TieredMemory) -> None:
    with pytest.raises(InvalidInputError, match="Memory"):
        end_session(TieredMemoryBlock(memory=memory, user_id="u1"))  # type: ignore[arg-type]


# ---- the memory Memory inserted, handed back as conversation ----------------------------
@pytest.mark.parametrize("kept_as", ["blocks", "content"])
@pytest.mark.parametrize("insert_method", ["system", "user"])
async def test_the_memory_a_memory_inserted_into_a_message_is_never_stored_as_conversation(
    memory: TieredMemory, insert_method: str, kept_as: str,
) -> None:
    # Memory.get() puts the block's quoted memory into a system message or into the latest user
    # message (as a text block of its own). An app that keeps what it sent the model and resumes
    # from it (chat_history=, put_messages), or a chat store that hands back the objects it holds
    # (Memory writes into them), gives those messages back: the memory must not be stored as the
    # user's words, where each round would quote the last one again. An app that keeps each
    # message's content (a string column, JSON) has the memory and the user's words in one text
    # block: the words are stored, without the memory
    block = TieredMemoryBlock(memory=memory, user_id="u1", tokenizer_fn=TOKENIZER)
    monday = small_memory(block, "monday")
    await monday.aput_messages(turn("I live in Lisbon and I am vegetarian.", "Noted!"))
    await aend_session(monday)
    tuesday = small_memory(block, "tuesday", insert_method=insert_method)
    await tuesday.aput(chat("user", "Where should I eat tonight?"))
    sent = await tuesday.aget()
    assert any(PREAMBLE in b.text for m in sent for b in m.blocks if isinstance(b, TextBlock))
    if kept_as == "content":
        sent = [ChatMessage(role=m.role, content=m.content) for m in sent]

    resumed = small_memory(block, "resumed", chat_history=sent)
    await resumed.aput_messages(turn("Somewhere near the river?", "Try the vegetarian place by the river."))
    for q, a in FILLER:
        await resumed.aput_messages(turn(q, a))
    await aend_session(resumed)

    stored = memory.get_messages("resumed", user_id="u1")
    assert [m.content for m in stored if PREAMBLE in m.content or "<memory>" in m.content] == []
    assert [(m.role, m.content) for m in stored][:3] == [
        ("user", "Where should I eat tonight?"), ("user", "Somewhere near the river?"),
        ("assistant", "Try the vegetarian place by the river.")]
