"""Which of a stored assistant message's tool calls a replay sends as calls (pure).

A provider is sent a call's name and id outside any quoting, and takes each id once in a
message (Anthropic refuses a prompt whose ``tool_use`` ids repeat; OpenAI pairs results with
calls by id). So a call stays a call only when its name and id are plain tokens
(:mod:`tiered_memory.tool_calls`) and no call before it in the message has its id; any other
becomes a quoted line after the message's text (its media kept, :func:`~.content_blocks.appended`),
and a result for it pairs with nothing and replays as quoted data.
"""

from __future__ import annotations

import json
from typing import Any, Container, Sequence

from langchain_core.messages import AIMessage
from langchain_core.messages.tool import ToolCall

from tiered_memory.quoting import quote
from tiered_memory.tool_calls import tool_calls_problem
from tiered_memory.types import StoredMessage

from .content_blocks import appended

__all__ = ["sendable", "sendable_calls"]


def sendable(calls: Sequence[ToolCall]) -> list[bool]:
    """For each of ``calls``, whether a replay may send it as a call (pure): its name and id plain
    tokens, and its id (when it has one) that of no call before it."""
    seen: set[Any] = set()
    out = []
    for c in calls:
        ok = tool_calls_problem([c]) is None and (c.get("id") is None or c.get("id") not in seen)
        if ok and c.get("id") is not None:
            seen.add(c.get("id"))
        out.append(ok)
    return out


def sendable_calls(msg: AIMessage, m: StoredMessage, answered: Container[str] | None) -> AIMessage:
    """``msg`` (rebuilt from ``m``) with only the tool calls a provider may be sent (pure): the others
    (:func:`sendable`) are quoted lines after the message's text, and the results of those calls pair
    with nothing and replay as quoted data. ``answered`` given: a call whose id it lacks is left out
    too; a message left with no text and no call says its stored text, which names its calls."""
    ok = sendable(msg.tool_calls)
    kept = [c for c, good in zip(msg.tool_calls, ok) if good and (answered is None or str(c.get("id")) in answered)]
    if len(kept) == len(msg.tool_calls):
        return msg
    own = str(msg.text)  # blank: the stored text describes the calls
    lines = [f"[stored tool call] {quote(str(c['name']))} with arguments "
             f"{quote(json.dumps(c['args'], ensure_ascii=False, sort_keys=True))}"
             for c, good in zip(msg.tool_calls, ok) if not good]
    if not (kept or lines or own.strip()):
        lines = [m.content]
    return msg.model_copy(update={"tool_calls": kept, "content": appended(msg.content, own, "\n".join(lines))})
