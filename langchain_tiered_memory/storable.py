"""A turn's messages as rows the core will store: what every recording path of the adapter writes.

:class:`~.middleware.TieredMemoryMiddleware`, :class:`~.runnable.TieredMemoryRunnable` and the classic
``save_context`` (:class:`~.classic.TieredConversationMemory`) record a turn as a side effect of a call,
after the model answered, so a message the core would refuse must not fail the call (its answer lost,
the rest of the turn unrecorded): a reply, an input or a tool's output longer than
``MemoryConfig.max_content_chars`` (a fetched page, a read file) or holding NUL characters (a binary
file), a lone surrogate anywhere, or a tool call
whose arguments alone pass ``max_metadata_bytes`` (a file written through a tool). Such a message
is stored changed, as the LlamaIndex block stores one (its text by the same core function,
:func:`~tiered_memory.storable.storable_text`): NUL characters removed and lone surrogates
replaced, in its text and its fields; the text cut to the limit, between two characters as a
reader sees them, ending with the core's cut marker; fields the core cannot hold (over
``max_metadata_bytes``, nested deeper than it keeps, or that JSON cannot write: a tool's artifact
may be any object; tool calls or a ``tool_call_id`` that are no plain tokens:
:mod:`tiered_memory.tool_calls`) left out, the optional ones first (artifact, response and usage
metadata, ``additional_kwargs``), then all but the type and id (the message then replays by role, as its
stored text, and a result of its calls as quoted data). The row says what changed under
``metadata["langchain_repaired"]``, and :func:`record_turn` (the one I/O shell over the pure
functions, which all three paths call) logs it. A message the core accepts comes back as
:func:`~.messages.to_core` writes it. An explicit write (``TieredChatMessageHistory.add_messages``)
still refuses such a message with a typed error.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from langchain_core.messages import BaseMessage

from tiered_memory import TieredMemory
from tiered_memory.errors import InvalidInputError
from tiered_memory.json_values import check_json_value
from tiered_memory.storable import clean_strings, storable_text
from tiered_memory.tool_calls import tool_call_id_problem, tool_calls_problem

from .messages import BULKY, LC_KEY, OPTIONAL, drop_fields, each_message, metadata_size, to_core

__all__ = ["REPAIRED_KEY", "record_turn", "storable_rows"]

log = logging.getLogger("tiered_memory")

REPAIRED_KEY = "langchain_repaired"  # metadata of a stored message that had to be changed


def _fits(lc: dict[str, Any], max_bytes: int) -> bool:
    """Whether the core takes ``lc`` as the message's metadata (pure)."""
    try:
        check_json_value({LC_KEY: lc}, "metadata")  # at most MAX_JSON_DEPTH deep (an artifact may be deeper)
    except InvalidInputError:
        return False
    return metadata_size(lc) <= max_bytes


def _storable_row(row: dict[str, Any], max_chars: int, max_bytes: int, changes: list[str]) -> dict[str, Any]:
    text, more = storable_text(row["content"], max_chars)
    changes = [*changes, *more]
    lc = row["metadata"][LC_KEY]
    if not text.strip():  # it was NUL characters only
        text = f"[{lc['type']} message without text]"
    clean = clean_strings(lc)
    if clean != lc:
        changes.append("removed NUL characters or replaced lone surrogates in its fields")
    data = dict(clean["data"])
    if (problem := tool_calls_problem(data.get("tool_calls"))) is not None:  # a model's slip, sent unquoted
        changes.append(f"left out its tool calls: {problem}")  # by a replay: its text still names them
        del data["tool_calls"]
        data.pop("tool_call_chunks", None)
    if "tool_call_id" in data and (problem := tool_call_id_problem(data["tool_call_id"])) is not None:
        changes.append(f"left out its {problem}")
        del data["tool_call_id"]
    if text != row["content"]:  # the fields' content is the text as it was: the stored text replays
        data.pop("content", None)
    # the bulky optional fields first, then all but the id (kept, so the message is recorded once)
    order = [*BULKY, *sorted(set(data) - set(BULKY) - {"id"})]
    lc = drop_fields({**clean, "data": data}, order, lambda kept: _fits(kept, max_bytes))
    new_drops = lc.get("dropped", [])[len(clean.get("dropped", [])):]
    if new_drops:
        changes.append(f"left out its fields {', '.join(new_drops)}: over max_metadata_bytes or too deep")
    if not changes:
        return row
    return {**row, "content": text, "metadata": {**row["metadata"], LC_KEY: lc, REPAIRED_KEY: changes}}


def _row(message: BaseMessage, max_bytes: int) -> tuple[dict[str, Any], list[str]]:
    """``message`` as a core message dict; one whose optional fields JSON cannot write at all (an
    artifact with a tuple key) without them, saying so."""
    try:
        return to_core(message, max_metadata_bytes=max_bytes), []
    except InvalidInputError:
        if not isinstance(message, BaseMessage):
            raise
        optional: dict[str, Any] = {k: None if k in ("artifact", "usage_metadata") else {}
                                    for k in OPTIONAL if k in type(message).model_fields}
        row = to_core(message.model_copy(update=optional), max_metadata_bytes=max_bytes)  # still wrong: raised
        return row, [f"left out its fields {', '.join(sorted(optional))}: JSON cannot write them"]


def storable_rows(messages: Iterable[BaseMessage], *, max_chars: int, max_bytes: int) -> list[dict[str, Any]]:
    """``messages`` as core message dicts (:func:`~.messages.to_core_many`), each one the core would
    refuse for its text or its fields made storable, saying how under ``REPAIRED_KEY`` (pure).
    ``max_chars`` and ``max_bytes`` are the memory's ``max_content_chars`` and ``max_metadata_bytes``."""
    def storable(message: BaseMessage) -> dict[str, Any]:  # raises for what no row holds (a RemoveMessage)
        row, changes = _row(message, max_bytes)
        return _storable_row(row, max_chars, max_bytes, changes)

    return each_message(messages, storable)


def record_turn(memory: TieredMemory, messages: Iterable[BaseMessage], *, user_id: str,
                session_id: str) -> list[str]:
    """Store ``messages`` in one bulk write, each the core would refuse as it is made storable
    (:func:`storable_rows`) and logged as a warning: a turn recorded after the model answered.
    Returns the stored ids, one a message, in order."""
    config = memory.config
    rows = storable_rows(messages, max_chars=config.max_content_chars, max_bytes=config.max_metadata_bytes)
    for row in rows:
        if REPAIRED_KEY in row["metadata"]:
            log.warning("a %s message of session %r was changed to be storable: %s",
                        row["role"], session_id, "; ".join(row["metadata"][REPAIRED_KEY]))
    return memory.add_many(rows, session_id=session_id, user_id=user_id) if rows else []
