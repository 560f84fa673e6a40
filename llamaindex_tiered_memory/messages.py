"""LlamaIndex chat messages and the core's messages (pure): the text of a ``ChatMessage``,
that text made storable, the core message dicts :class:`~.block.TieredMemoryBlock` stores,
the query it recalls for, and whether a recalled turn is one the model sees already.

Roles map to the core's four (``developer`` is ``system``, ``function`` is ``tool``, an
unknown role is ``user``); a role that changed on the way is kept in the metadata.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from llama_index.core.base.llms.types import ChatMessage, TextBlock

from tiered_memory.context.render import CUT_MARKER, OPENING
from tiered_memory.errors import InvalidInputError
from tiered_memory.storable import clean_strings, storable_text
from tiered_memory.tool_calls import tool_call_id_problem

MAX_QUERY_CHARS = 2000
WRAPPER = "<memory>"  # how LlamaIndex's template opens the memory blocks it puts before a message's text
CLOSING = "</memory>"  # closes render_memory's block, then the template's
REPAIRED_KEY = "llamaindex_repaired"  # metadata of a stored message whose text had to be changed

_ROLES = {
    "system": "system", "developer": "system", "user": "user", "assistant": "assistant",
    "chatbot": "assistant", "model": "assistant", "tool": "tool", "function": "tool",
}


def check_messages(messages: object, name: str = "messages") -> list[ChatMessage]:
    """``messages`` as a new list, if it is a list or tuple of ``ChatMessage``; else
    :class:`~tiered_memory.errors.InvalidInputError` saying which item is wrong (pure)."""
    if isinstance(messages, ChatMessage) or not isinstance(messages, (list, tuple)):
        raise InvalidInputError(f"{name} must be a list of llama_index ChatMessage, got {type(messages).__name__}")
    for n, m in enumerate(messages):
        if not isinstance(m, ChatMessage):
            raise InvalidInputError(f"{name}[{n}] must be a llama_index ChatMessage, got {type(m).__name__}")
    return list(messages)


def message_text(message: ChatMessage) -> str:
    """The text of a chat message: its text blocks, joined by newlines, without a rendered memory.
    ``Memory.get()`` adds the memory as a text block of its own before a system or user message's
    text; given back (an app resuming from what it sent, a chat store returning the objects
    ``Memory`` wrote into), it is a prompt's memory, neither stored nor recalled for. Kept as the
    message's ``content`` (one text), it is followed by the message's own words, which stay
    (:func:`without_rendered_memory`)."""
    texts = [b.text for b in message.blocks if isinstance(b, TextBlock)]
    return "\n".join(t for t in (without_rendered_memory(t) for t in texts) if t is not None)


def without_rendered_memory(text: str) -> Optional[str]:
    """``text`` without the memory ``Memory.get()`` put before it (pure); ``None`` when nothing else
    is left, or when the memory is cut short (its end is not there to tell where it stops).

    That memory is LlamaIndex's ``<memory>`` wrapper of its blocks, one of them holding a memory
    :func:`~tiered_memory.context.render.render_memory` rendered, whose stored text spells no tag,
    so the first ``</memory>`` after it closes it and the wrapper's own next ``</memory>`` follows.
    A rendered memory inside other text (no wrapper before it) is removed alone."""
    at = text.find(OPENING)
    if at < 0:
        return text
    end = text.find(CLOSING, at + len(OPENING))
    if end < 0:
        return None
    end += len(CLOSING)
    head = text[:at]
    if head.lstrip().startswith(WRAPPER):  # Memory's template: <memory>, the blocks, </memory>, then the text
        close = text.find(CLOSING, end)
        end = len(text) if close < 0 else close + len(CLOSING)
        head = ""
    rest = (head + text[end:]).strip("\n")
    return rest if rest.strip() else None


def to_core_messages(messages: Iterable[ChatMessage], max_chars: Optional[int] = None) -> list[dict[str, Any]]:
    """Chat messages as core message dicts (new objects); messages without text are skipped.

    Text is made storable with :func:`~tiered_memory.storable.storable_text` (``max_chars``: the core's
    ``max_content_chars``), and a ``tool_call_id`` that is no plain token
    (:func:`~tiered_memory.tool_calls.tool_call_id_problem`) left out, so one bad message never makes
    the core refuse the batch; a changed message says how in ``metadata["llamaindex_repaired"]``.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        text, changes = storable_text(message_text(m), max_chars)
        if not text.strip():
            continue  # e.g. an assistant turn that only calls tools
        role = str(getattr(m.role, "value", m.role))
        metadata: dict[str, Any] = {"source": "llamaindex"}
        if _ROLES.get(role, "user") != role:
            metadata["llamaindex_role"] = role
        for key in ("tool_call_id", "name"):
            value = m.additional_kwargs.get(key)
            problem = tool_call_id_problem(value) if key == "tool_call_id" else None
            if isinstance(value, str) and problem is None:
                metadata[key] = clean_strings(value)
            elif isinstance(value, str):  # a replay sends it outside any quoting: the core refuses it
                changes = [*changes, f"left out its {problem}"]
        if changes:
            metadata[REPAIRED_KEY] = changes
        out.append({"role": _ROLES.get(role, "user"), "content": text, "metadata": metadata})
    return out


def build_query(messages: Sequence[ChatMessage]) -> str:
    """What to recall for: the latest user message, else the latest message with text.

    The text is made valid (:func:`~tiered_memory.storable.storable_text`, without a length limit): a lone surrogate
    the chat store accepted (badly decoded input or tool output) would make the core refuse
    the query, and with it every ``Memory.get()`` while that message is the latest."""
    texts = [(m.role, storable_text(message_text(m))[0]) for m in messages]
    for role, text in reversed(texts):
        if role == "user" and text.strip():
            return text[-MAX_QUERY_CHARS:]
    for _, text in reversed(texts):
        if text.strip():
            return text[-MAX_QUERY_CHARS:]
    return ""


def shown_already(item_text: str, current_texts: set[str]) -> bool:
    """Whether a recalled turn is one of ``current_texts`` (pure).

    ``current_texts`` are the current messages as stored (:func:`~tiered_memory.storable.storable_text`). A turn
    the core cut to its budget (its text ends with ``CUT_MARKER``) matches the current
    text it is the head of; a cut that kept no text matches nothing.
    """
    if item_text in current_texts:
        return True
    marker = CUT_MARKER.strip()
    if not item_text.endswith(marker):
        return False
    head = item_text[: -len(marker)].strip()
    return bool(head) and any(t.lstrip().startswith(head) for t in current_texts)
