"""Shared helpers of the LlamaIndex adapter tests: chat messages, a small real ``Memory``,
and the rendered memory as sections (real LlamaIndex, no mocks)."""

from __future__ import annotations

from typing import Any

from llama_index.core.llms import ChatMessage
from llama_index.core.memory import Memory

from llamaindex_tiered_memory import TieredMemoryBlock, offline_tokenizer
from llamaindex_tiered_memory.sections import EARLIER_TITLE
from tiered_memory.context.assembly import TITLES

TOKENIZER = offline_tokenizer()
# question and answer turns on other topics, to fill a short-term queue until it flushes
FILLER = [
    ("Can you explain how tides work?", "Tides come from the Moon's gravity pulling on the oceans."),
    ("What is a light year?", "A light year is the distance light travels in one year."),
    ("Why is the sky blue?", "Air scatters blue light more than red light."),
    ("How do volcanoes form?", "Magma rises through weak spots in the Earth's crust."),
    ("What makes a rainbow?", "Sunlight is refracted and reflected inside raindrops."),
    ("Why do cats purr?", "Purring is a vibration of the larynx muscles."),
]


def chat(role: str, text: str) -> ChatMessage:
    return ChatMessage(role=role, content=text)


def turn(user: str, assistant: str) -> list[ChatMessage]:
    return [chat("user", user), chat("assistant", assistant)]


def small_memory(block: TieredMemoryBlock, session_id: str, **kwargs: Any) -> Memory:
    """A Memory whose short-term queue holds ~100 tokens, so a few turns force flushes."""
    kwargs.setdefault("token_limit", 400)
    kwargs.setdefault("chat_history_token_ratio", 0.25)
    kwargs.setdefault("token_flush_size", 40)
    return Memory.from_defaults(session_id=session_id, memory_blocks=[block],
                                tokenizer_fn=TOKENIZER, **kwargs)


def memory_message(messages: list[ChatMessage]) -> str:
    """The text of the system message Memory builds from its blocks ("" if none)."""
    system = [m for m in messages if m.role == "system"]
    return system[0].content or "" if system else ""


def split_memory_text(text: str) -> tuple[str, list[list[str]]]:
    """Rendered memory as its preamble and its sections (a heading line, then one line an
    item), to look inside."""
    head: list[str] = []
    sections: list[list[str]] = []
    inside = False
    for line in text.split("\n"):
        if not inside:
            if line == "<memory>":
                inside = True
            else:
                head.append(line)
        elif line == "</memory>":
            inside = False
        elif line.startswith("## "):
            sections.append([line])
        else:
            assert sections, f"an item before any heading: {line!r}"
            sections[-1].append(line)
    assert not inside, "the block was left open"
    return "\n".join(head), sections


NAMES = {f"## {title}": name for name, title in {**TITLES, "earlier": EARLIER_TITLE}.items()}


def name_of(section: list[str]) -> str:
    """The section's name, from its heading (a real title, or a test's ``name.title()``)."""
    return NAMES.get(section[0], section[0].removeprefix("## ").lower())
