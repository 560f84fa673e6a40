"""What a stored tool call may be named and identified by (pure).

A replay sends a stored tool call's name and id to a model's provider as fields of their own,
outside any quoting (the LangChain adapter rebuilds ``AIMessage.tool_calls`` and
``ToolMessage.tool_call_id`` from them), so they may only be plain tokens: letters, digits and
``_ . : -``, as providers restrict them. A name (:data:`TOOL_NAME`) is what any of them accepts
as a function name: OpenAI's and Anthropic's ``[a-zA-Z0-9_-]``, Gemini's dots and colons (MCP
tools are often namespaced so), at most 128 characters; an id (:data:`TOOL_CALL_ID`) is the same
characters, at most 256 (Kimi's and DeepSeek's ids name the tool: ``functions.get_weather:0``).
Nothing with a space, a line break, a quote or a bracket: no sentence, no chat-template marker.

Every write checks the fields a replay reads (:func:`check_tool_calls`, from
:func:`~tiered_memory.validation.normalize_message`, so ``add_many``, ``add`` and the import):
the tool calls and ``tool_call_id`` of the LangChain adapter's record of a message
(``metadata["langchain"]["data"]``) and ``metadata["tool_call_id"]`` (a tool result's, written
through the core API or by the LlamaIndex block), whatever the message's role. A row written
otherwise (another writer, an older version) is checked again as it is replayed.

Calls that share an id are not refused, in one message or across messages: each id is a plain
token, safe to send, and a message with two calls of one id is what some models return; the
recording paths store a reply after the model answered, where an error would fail the user's run,
and the import reads what older versions stored. A replay sends each id once instead (the
LangChain adapter's replay renames an older call's id and its results').
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import InvalidInputError

__all__ = ["TOOL_CALL_ID", "TOOL_NAME", "check_tool_calls", "is_tool_call_id", "is_tool_name",
           "tool_calls_problem", "tool_call_id_problem"]

TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
TOOL_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,256}")
_RULE = "letters, digits, _ . : - only"


def is_tool_name(value: object) -> bool:
    """Whether ``value`` is a tool name a replay may send as one (:data:`TOOL_NAME`)."""
    return isinstance(value, str) and TOOL_NAME.fullmatch(value) is not None


def is_tool_call_id(value: object) -> bool:
    """Whether ``value`` is a tool-call id a replay may send as one (:data:`TOOL_CALL_ID`)."""
    return isinstance(value, str) and TOOL_CALL_ID.fullmatch(value) is not None


def _shown(value: object) -> str:
    return repr(value[:80] if isinstance(value, str) else value)


def tool_calls_problem(calls: object) -> str | None:
    """Why a replay could not send ``calls`` (a LangChain record's ``tool_calls``) as tool calls,
    or ``None``: each call's name a :func:`is_tool_name`, its id ``None`` or a :func:`is_tool_call_id`.
    What is no list of mappings is left to the replay, which reads such a record by role."""
    for n, call in enumerate(calls if isinstance(calls, list) else []):
        if not isinstance(call, Mapping):
            continue
        name, call_id = call.get("name"), call.get("id")
        if not is_tool_name(name):
            return f"tool call {n}'s name {_shown(name)} is no tool name ({_RULE}, 1 to 128 characters)"
        if call_id is not None and not is_tool_call_id(call_id):
            return f"tool call {n}'s id {_shown(call_id)} is no tool-call id ({_RULE}, 1 to 256 characters)"
    return None


def tool_call_id_problem(value: object) -> str | None:
    """Why a replay could not send ``value`` as a tool result's ``tool_call_id``, or ``None``."""
    if is_tool_call_id(value):
        return None
    return f"tool_call_id {_shown(value)} is no tool-call id ({_RULE}, 1 to 256 characters)"


def check_tool_calls(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` (a message's, checked JSON); :class:`~tiered_memory.errors.InvalidInputError`
    when it names a tool call or tool result a replay could not send as one."""
    lc = metadata.get("langchain")
    data = lc.get("data") if isinstance(lc, Mapping) else None
    problem = None
    if isinstance(data, Mapping):
        problem = tool_calls_problem(data.get("tool_calls"))
        if problem is None and "tool_call_id" in data:
            problem = tool_call_id_problem(data["tool_call_id"])
    if problem is None and metadata.get("tool_call_id") is not None:
        problem = tool_call_id_problem(metadata["tool_call_id"])
    if problem is not None:
        raise InvalidInputError(f"metadata: {problem}: a replay sends it to the model outside any quoting. "
                                "Nothing was written; name tools and ids as providers take them")
    return metadata
