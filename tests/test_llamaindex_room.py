"""The room of a TieredMemoryBlock in a real ``Memory``: what the model sees already (the messages of
the short-term queue, stored or not) takes none of the block's ``max_tokens``, so the block fills
them with other memories, never exceeds them, and never repeats a current message."""

from __future__ import annotations

from typing import Callable

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.memory import Memory  # noqa: E402

from li_support import TOKENIZER, chat  # noqa: E402
from test_injection import decoded_items, parse_memory  # noqa: E402

from llamaindex_tiered_memory import TieredMemoryBlock  # noqa: E402
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
