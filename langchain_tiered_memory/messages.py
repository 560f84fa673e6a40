"""Conversion between LangChain messages and the core's stored messages.

A LangChain message becomes one core message: a core ``role``, the message's
text as ``content`` (what the indexes embed and match), and everything else
LangChain knows about it (type, name, id, tool calls, ``tool_call_id``,
``additional_kwargs``, ``response_metadata``, non-text content blocks) under
``metadata["langchain"]``. Reading it back rebuilds an equal message.

A message sent without an ``id`` reads back without one, so it is ``==`` to what was
added, as from LangChain's own histories (the core keys it by its stored id all the same).
Messages the core stored without that key (written through the core API, or
imported) are mapped by role: user -> ``HumanMessage``, assistant ->
``AIMessage``, tool -> ``ToolMessage``, and get the stored id as their ``id``.

Stored memory is data, never instructions, so a replay can produce only three
kinds of message: ``HumanMessage`` for a stored user turn, ``AIMessage`` for an
assistant turn, and ``ToolMessage`` for a tool result that answers a tool call of
an ``AIMessage`` earlier in the same replay. A stored ``system`` turn, a tool
result without its call, and anything else come back as a ``HumanMessage`` whose
content is the quoted text (``[stored system message] "..."``). The metadata may
only restore details of a message of the stored role with the stored text: a user
turn whose metadata claims another type or other content is read back by role.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

from tiered_memory.quoting import label_text, quote
from tiered_memory.errors import InvalidInputError
from tiered_memory.types import StoredMessage

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_from_dict,
)

__all__ = ["LC_KEY", "fit_metadata", "from_stored", "from_stored_many", "lc_id", "role_of", "text_of", "to_core",
           "to_core_many"]

LC_KEY = "langchain"
"""The metadata key that carries what LangChain needs to rebuild the message."""

_TYPE_TO_ROLE = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessageChunk": "system",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "function": "tool",
    "FunctionMessageChunk": "tool",
}
_CHAT_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant",
               "system": "system", "developer": "system", "tool": "tool", "function": "tool"}


def role_of(message: BaseMessage) -> str:
    """The core role of a LangChain message (``ChatMessage`` roles outside the core's
    four are stored as ``assistant``: another speaker, never the user). An instruction role,
    ``system`` or OpenAI's ``developer`` in any case or spacing, is ``system``, so a replay
    demotes it to quoted data rather than showing it raw as an assistant turn."""
    if message.type in ("chat", "ChatMessageChunk"):
        return _CHAT_ROLES.get(str(getattr(message, "role", "")).strip().lower(), "assistant")
    role = _TYPE_TO_ROLE.get(message.type)
    if role is None:
        raise InvalidInputError(
            f"cannot store a LangChain {message.type!r} message; store human, ai, system, "
            "tool, function or chat messages")
    return role


def text_of(message: BaseMessage) -> str:
    """The text to store and index; a description of the tool calls when there is none."""
    text = str(message.text)
    if text.strip():
        return text
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        return "[tool calls] " + "; ".join(
            f"{c.get('name')}({json.dumps(c.get('args', {}), ensure_ascii=False, sort_keys=True)})"
            for c in calls)
    return f"[{message.type} message without text]"


def _jsonable(value: Any) -> Any:
    """A JSON-safe deep copy (objects JSON cannot hold become their ``repr``)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=repr))


# optional fields dropped, in this order, when the metadata would exceed the core's limit
_BULKY = ("artifact", "response_metadata", "usage_metadata", "additional_kwargs")


def fit_metadata(lc: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """``lc`` without its bulkiest optional fields until its JSON fits ``max_bytes`` (pure).

    Dropped field names are listed under ``"dropped"``; type, id, name, tool calls and
    ``tool_call_id`` are never dropped (if they alone are too big, the core rejects the
    message with a clear error).
    """
    def size(obj: Any) -> int:
        return len(json.dumps({LC_KEY: obj}, ensure_ascii=False).encode("utf-8"))

    if size(lc) <= max_bytes:
        return lc
    data = dict(lc["data"])
    dropped: list[str] = []
    for name in _BULKY:
        if name in data:
            del data[name]
            dropped.append(name)
            if size({**lc, "data": data, "dropped": dropped}) <= max_bytes:
                break
    return {**lc, "data": data, "dropped": dropped}


def to_core(message: BaseMessage, *, timestamp: Any = None, max_metadata_bytes: int = 64_000) -> dict[str, Any]:
    """One LangChain message as a core message dict (the input is not mutated)."""
    if not isinstance(message, BaseMessage):
        raise InvalidInputError(f"expected a LangChain BaseMessage, got {type(message).__name__}")
    role = role_of(message)
    content = text_of(message)
    data = _jsonable(message.model_dump())
    if data.get("content") == content:
        del data["content"]  # the stored content is the same; don't keep it twice
    # drop empty defaults to keep metadata small; from_stored restores them
    data = {k: v for k, v in data.items() if v not in (None, {}, [], "") or k == "content"}
    data.pop("type", None)
    lc = fit_metadata({"type": message.type, "data": data}, max_metadata_bytes)
    out: dict[str, Any] = {"role": role, "content": content, "metadata": {LC_KEY: lc}}
    if timestamp is not None:
        out["timestamp"] = timestamp
    return out


def to_core_many(messages: Iterable[BaseMessage], *, max_metadata_bytes: int = 64_000) -> list[dict[str, Any]]:
    """LangChain messages as core message dicts, in order; an error names the bad message's index."""
    if isinstance(messages, (str, bytes, BaseMessage)) or not isinstance(messages, Iterable):
        raise InvalidInputError(f"expected a sequence of LangChain messages, got {type(messages).__name__}")
    out: list[dict[str, Any]] = []
    for n, m in enumerate(messages):
        try:
            out.append(to_core(m, max_metadata_bytes=max_metadata_bytes))
        except InvalidInputError as e:  # say which one, as the core's bulk writes do
            raise InvalidInputError(f"message {n}: {e}") from e
    return out


def _demoted(m: StoredMessage, what: str) -> HumanMessage:
    """A stored message that may not keep its own role, as quoted user-side data."""
    return HumanMessage(content=f"[stored {what}] {quote(m.content)}", id=lc_id(m))


def lc_id(m: StoredMessage) -> str:
    """The message's LangChain id when one was stored (so callers can match it), else the stored
    id; metadata of any shape (damaged, or written by other code) gives the stored id."""
    lc = m.metadata.get(LC_KEY)
    data = lc.get("data") if isinstance(lc, Mapping) else None
    found = data.get("id") if isinstance(data, Mapping) else None
    return found if isinstance(found, str) and found else m.id


def _by_role(m: StoredMessage) -> BaseMessage:
    if m.role == "user":
        return HumanMessage(content=m.content, id=lc_id(m))
    if m.role == "assistant":
        return AIMessage(content=m.content, id=lc_id(m))
    if m.role == "tool":
        call_id = m.metadata.get("tool_call_id")
        return ToolMessage(content=m.content, id=lc_id(m), tool_call_id=str(call_id or m.id))
    return _demoted(m, f"{label_text(m.role)} message")  # a role written by other code may be any text


# the one message class each stored role may come back as (subclasses such as chunks too)
_CLASS_OF_ROLE: dict[str, type[BaseMessage]] = {"user": HumanMessage, "assistant": AIMessage, "tool": ToolMessage}


def _rebuilt(m: StoredMessage) -> BaseMessage:
    """The message the LangChain metadata describes, when it is one of the stored role
    with the stored text; else the message by role."""
    lc = m.metadata.get(LC_KEY)
    want = _CLASS_OF_ROLE.get(m.role)
    if want is None or not isinstance(lc, Mapping) or not isinstance(lc.get("data"), Mapping):
        return _by_role(m)
    data = dict(lc["data"])
    data.setdefault("content", m.content)  # the id stays as sent: none when the caller gave none
    try:
        msg = messages_from_dict([{"type": lc.get("type"), "data": data}])[0]
    except (ValueError, TypeError, KeyError):
        return _by_role(m)  # an unknown or damaged record still reads back as a plain message
    return msg if isinstance(msg, want) and text_of(msg) == m.content else _by_role(m)


def from_stored(m: StoredMessage, *, answered_calls: frozenset[str] | set[str] = frozenset()) -> BaseMessage:
    """Rebuild the LangChain message of a stored message (never a system message).

    A tool result keeps its ``ToolMessage`` only when its ``tool_call_id`` is in
    ``answered_calls`` (the tool calls of the assistant messages replayed before it);
    :func:`from_stored_many` passes those.
    """
    if m.role == "system":
        return _demoted(m, "system message")
    msg = _rebuilt(m)
    if isinstance(msg, ToolMessage) and msg.tool_call_id not in answered_calls:
        return _demoted(m, "tool result")
    return msg


def from_stored_many(messages: Sequence[StoredMessage]) -> list[BaseMessage]:
    """Rebuild stored messages in order; tool results are paired with the calls before them."""
    out: list[BaseMessage] = []
    calls: set[str] = set()
    for m in messages:
        msg = from_stored(m, answered_calls=calls)
        if isinstance(msg, AIMessage):
            calls.update(str(c.get("id")) for c in msg.tool_calls if c.get("id"))
        out.append(msg)
    return out
