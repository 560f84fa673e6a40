"""The room of a TieredMemoryBlock in a real ``Memory``: what the model sees already (the messages of
the short-term queue, stored or not) takes none of the block's ``max_tokens``, so the block fills
them with other memories, never exceeds them, and never repeats a current message."""

from __future__ import annotations

from typing import Callable

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.memory import Memory  # noqa: E402
from llama_index.core.storage.chat_store.sql import MessageStatus  # noqa: E402

from li_support import TOKENIZER, chat  # noqa: E402
from test_injection import decoded_items, parse_memory  # noqa: E402

from llamaindex_tiered_memory import TieredMemoryBlock, WriteThroughMemory  # noqa: E402
from tiered_memory import StaticEmbedder, TieredMemory  # noqa: E402

QUESTION = "Which things did my dog Rex chew this week, a red shoe or a blue sock?"
# notes about Rex of one size each (a two-digit number is one token), more than the block holds, each
# costing about what the question costs (with braces, which the block escapes)
NOTES = [f"Note {n}: my dog Rex chewed a red shoe and a blue sock {{this week}}." for n in range(10, 22)]


def _block_text(carrier: str) -> str:
    """The block's own text in the message ``Memory`` put it in."""
    return carrier.split("<tiered_memory>\n", 1)[1].split("\n</tiered_memory>", 1)[0]


async def test_a_question_asked_again_leaves_its_room_to_other_memories(
        make_memory: Callable[..., TieredMemory]) -> None:
    """Ana asked the question in an earlier session, Bo never did; both ask it now, in a plain
    ``Memory`` (the queue is not stored). Ana's old question is the best match: the block must not
    show it (the model reads it in the queue), and its room goes to the next notes, so Ana gets as
    many memories as Bo, within the block's max_tokens."""
    memory = make_memory(embedder=StaticEmbedder())
    for user in ("ana", "bo"):
        memory.add_many([{"role": "user", "content": n} for n in NOTES], session_id="notes", user_id=user)
    memory.add_many([{"role": "user", "content": QUESTION}], session_id="last-week", user_id="ana")
    shown: dict[str, list[str]] = {}
    for user in ("ana", "bo"):
        block = TieredMemoryBlock(memory=memory, user_id=user, max_tokens=200)
        mem = Memory.from_defaults(session_id="today", memory_blocks=[block], tokenizer_fn=TOKENIZER)
        await mem.aput(chat("user", QUESTION))
        text = _block_text((await mem.aget())[0].content or "")
        assert memory.count_tokens(text) <= 200, user  # its escaped braces counted
        shown[user] = decoded_items(parse_memory(text))
        assert QUESTION not in shown[user], user  # the model reads it in the queue
    assert len(shown["bo"]) > 3 and all(i in NOTES for i in shown["bo"] + shown["ana"])
    assert len(shown["ana"]) == len(shown["bo"]), shown  # before: one note fewer, the question's room empty


# a question longer than a note, its answer, and a turn before them
ASKED = ("Which things did my dog Rex chew this week? I keep finding torn things in the hall, by the door, "
         "under the stairs and behind the sofa, and I would like to know which of them he chewed.")
ANSWERED = "Rex chewed the red shoe and the blue sock."
BEFORE = ("Can you help me plan the garden? I want tomatoes, beans, peas, carrots, lettuce, onions, garlic, "
          "potatoes, courgettes, pumpkins, strawberries and herbs, in six beds along the south fence.")


@pytest.mark.parametrize("write_through", [False, True], ids=["Memory", "WriteThroughMemory"])
async def test_a_question_asked_again_in_the_conversation_leaves_its_room_to_other_memories(
        make_memory: Callable[..., TieredMemory], write_through: bool) -> None:
    """The user asks again what they asked earlier in this conversation, its turn flushed out of the queue
    (stored). The block does not show the old question (the model reads it in the queue) but keeps its
    answer, and fills its max_tokens: no note it left out would fit (before, the old question's room in
    the recent turns went unused)."""
    memory = make_memory(embedder=StaticEmbedder())
    memory.add_many([{"role": "user", "content": n} for n in NOTES], session_id="notes", user_id="ana")
    block = TieredMemoryBlock(memory=memory, user_id="ana", max_tokens=400, every_turn=write_through)
    # the queue holds ~60 tokens: the question asked again alone; the blocks have room for the whole 400
    mem = (WriteThroughMemory if write_through else Memory).from_defaults(
        session_id="today", memory_blocks=[block], tokenizer_fn=TOKENIZER, token_limit=4000,
        chat_history_token_ratio=0.015, token_flush_size=40)
    for q, a in [(BEFORE, "Six beds: let us start with the tomatoes."), (ASKED, ANSWERED)]:
        await mem.aput_messages([chat("user", q), chat("assistant", a)])
    await mem.aput(chat("user", ASKED))
    assert [m.content for m in await mem.aget_all(status=MessageStatus.ACTIVE)] == [ASKED]
    assert [m.content for m in memory.get_messages("today", user_id="ana")][2:4] == [ASKED, ANSWERED]  # flushed
    text = _block_text((await mem.aget())[0].content or "")
    items = decoded_items(parse_memory(text))
    assert ASKED not in items and len(set(items)) == len(items)  # the model reads it in the queue
    assert ANSWERED in items
    one_note = max(memory.count_tokens(f"{line}\n") for line in text.splitlines() if "Note " in line)
    assert 400 - one_note < memory.count_tokens(text) <= 400, items  # before: its room unused
