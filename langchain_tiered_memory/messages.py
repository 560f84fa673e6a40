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
the ``AIMessage`` just before its run of results. A stored ``system`` turn, a tool
result without its call, and anything else come back as a ``HumanMessage`` whose
content is the quoted text (``[stored system message] "..."``), and the media of a quoted
tool result after it. A tool call is sent only when its name and id are plain tokens
(:mod:`tiered_memory.tool_calls`, which every write checks) and no call before it in the message
has its id (:mod:`.replay_calls`): a row written otherwise replays such a call as quoted text in
its ``AIMessage`` (``[stored tool call] "name" with arguments "{...}"``), its other calls as calls,
answered by their results. Nor is an id sent twice in a replay: an older call of an id a newer
call has (Kimi's ids repeat every turn) is sent, with its results, under a new id. The metadata may
only restore details of a message of the stored role with the stored text: a user
turn whose metadata claims another type or other content is read back by role.

Nor may it add text beside the stored text: a replay restores only fields no provider shows
a model as text (ids, tool calls and ``tool_call_id`` for the pairing, ``status``,
``artifact``, response and usage metadata) and a ``name`` that is a plain identifier; never
``additional_kwargs`` (``reasoning_content``, a raw ``function_call``, ``refusal``: partner
packages forward what they find there). Content blocks come back as they are only when each is
a plain text block or media (:mod:`.content_blocks`); else the content is the stored text, as a
string, or, when the message has media, its text blocks' text and its media, in order.
And a replay spells no chat-template turn marker (``<|im_start|>`` comes back as
``\\u003c|im_start|>``), which a local model's server would parse out of the prompt as a real token.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Container, Iterable, Mapping, Sequence, TypeVar

from tiered_memory.quoting import defuse_pieces, defuse_tokens, label_text, map_strings, quote
from tiered_memory.errors import InvalidInputError
from tiered_memory.tool_calls import is_tool_call_id, is_tool_name
from tiered_memory.types import StoredMessage

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_from_dict,
)

from .content_blocks import attachments, block_text, is_text, led_by, replayable, resent
from .replay_calls import sendable_calls, sent_once

__all__ = ["BULKY", "LC_KEY", "OPTIONAL", "drop_fields", "each_message", "fit_metadata", "from_stored",
           "from_stored_many", "lc_id", "metadata_size", "role_of", "text_of", "to_core", "to_core_many", "unchained"]

T = TypeVar("T")

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
    """The text to store and index; a description of the tool calls when there is none (a name
    that is no tool name, :func:`~tiered_memory.tool_calls.is_tool_name`, quoted in it)."""
    text = str(message.text)
    if text.strip():
        return text
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        return "[tool calls] " + "; ".join(  # a name no tool has (a model's slip) quoted, as data
            f"{c.get('name') if is_tool_name(c.get('name')) else quote(str(c.get('name')))}"
            f"({json.dumps(c.get('args', {}), ensure_ascii=False, sort_keys=True)})" for c in calls)
    return f"[{message.type} message without text]"


_NON_FINITE = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}  # json.dumps's spelling -> repr's


def _fields(message: BaseMessage) -> Any:
    """The message's fields as a JSON-safe deep copy (pure): an object JSON cannot hold becomes its
    ``repr``, a number key its string and a float that is no JSON number (``nan``, ``-inf``: a
    model's logprobs) its ``repr`` too, as LangChain's own serialisation would keep them; fields JSON
    cannot write at all (a key that is a tuple, a dict that holds itself, nesting deeper than the
    stack) are an ``InvalidInputError``, before anything is stored. The core checks the result further
    as metadata (its depth, size, NUL and lone surrogates)."""
    try:
        return json.loads(json.dumps(message.model_dump(), ensure_ascii=False, default=repr),
                          parse_constant=_NON_FINITE.__getitem__)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidInputError(f"the {message.type} message's fields (additional_kwargs, response_metadata, ...) "
                                f"cannot be stored as JSON: {type(e).__name__}: {e}") from e


# optional fields dropped, in this order, when the metadata would exceed the core's limit; last the
# content blocks (an inline image is easily larger than the limit): the stored text replays instead
OPTIONAL = ("artifact", "response_metadata", "usage_metadata", "additional_kwargs")
BULKY = (*OPTIONAL, "content")


def metadata_size(lc: Any) -> int:
    """The bytes of ``{"langchain": lc}`` as the core measures metadata (pure; a lone surrogate is
    counted, and refused by the core's check of metadata)."""
    return len(json.dumps({LC_KEY: lc}, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def drop_fields(lc: dict[str, Any], names: Iterable[str], fits: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``lc`` as it is when ``fits`` takes it, else without the fields ``names`` of its data, one at a
    time in that order, until ``fits`` takes what is left (pure), each added to ``"dropped"``'s names
    (kept from ``lc``); when all are gone and still nothing fits, what is left, for the core to refuse."""
    if fits(lc):
        return lc
    data = dict(lc["data"])
    dropped = list(lc.get("dropped", []))
    for name in names:
        if name in data:
            del data[name]
            dropped.append(name)
            if fits({**lc, "data": data, "dropped": dropped}):
                break
    return {**lc, "data": data, "dropped": dropped}


def fit_metadata(lc: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """``lc`` without its bulkiest optional fields until its JSON fits ``max_bytes`` (pure).

    Dropped field names are listed under ``"dropped"``; content blocks go last (the message then
    replays as its stored text, without its media); type, id, name, tool calls and
    ``tool_call_id`` are never dropped (if they alone are too big, the core rejects the
    message with a clear error).
    """
    return drop_fields(lc, BULKY, lambda kept: metadata_size(kept) <= max_bytes)


def to_core(message: BaseMessage, *, timestamp: Any = None, max_metadata_bytes: int = 64_000) -> dict[str, Any]:
    """One LangChain message as a core message dict (the input is not mutated)."""
    if not isinstance(message, BaseMessage):
        raise InvalidInputError(f"expected a LangChain BaseMessage, got {type(message).__name__}")
    role = role_of(message)
    content = text_of(message)
    data = _fields(message)
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


def each_message(messages: Iterable[BaseMessage], convert: Callable[[BaseMessage], T]) -> list[T]:
    """``convert`` of each of ``messages``, in order; an error names the bad message's index, as the core's do."""
    if isinstance(messages, (str, bytes, BaseMessage)) or not isinstance(messages, Iterable):
        raise InvalidInputError(f"expected a sequence of LangChain messages, got {type(messages).__name__}")
    out: list[T] = []
    for n, m in enumerate(messages):
        try:
            out.append(convert(m))
        except InvalidInputError as e:
            raise InvalidInputError(f"message {n}: {e}") from e
    return out


def to_core_many(messages: Iterable[BaseMessage], *, max_metadata_bytes: int = 64_000) -> list[dict[str, Any]]:
    """LangChain messages as core message dicts, in order; an error names the bad message's index."""
    return each_message(messages, lambda m: to_core(m, max_metadata_bytes=max_metadata_bytes))


def _demoted(m: StoredMessage, what: str, content: Any = "") -> HumanMessage:
    """A stored message that may not keep its own role, as quoted user-side data; with the media
    of ``content`` (the checked blocks of the message it was) after it."""
    return HumanMessage(content=led_by(f"[stored {what}] {quote(m.content)}", content), id=lc_id(m))


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

# the fields a replay restores: none is shown to a model as text (``name`` is, so it is checked).
# Not restored: ``additional_kwargs`` (partner packages forward keys found there: a raw
# ``function_call``, ``reasoning_content``, ``refusal``), ``invalid_tool_calls`` (their raw
# ``args`` text is sent as a call), ``tool_call_chunks`` (``tool_calls`` rebuild them), extras.
_REPLAYED = frozenset({"content", "id", "name", "tool_calls", "tool_call_id", "status", "artifact",
                       "response_metadata", "usage_metadata"})
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what OpenAI accepts as a message name


def _rebuilt(m: StoredMessage) -> BaseMessage:
    """The message the LangChain metadata describes, when it is one of the stored role
    with the stored text; else the message by role. Only :data:`_REPLAYED` fields come back."""
    lc = m.metadata.get(LC_KEY)
    want = _CLASS_OF_ROLE.get(m.role)
    if want is None or not isinstance(lc, Mapping) or not isinstance(lc.get("data"), Mapping):
        return _by_role(m)
    data = {k: v for k, v in lc["data"].items() if k in _REPLAYED}
    if not (isinstance(data.get("name"), str) and _NAME.fullmatch(data["name"])):
        data.pop("name", None)
    data.setdefault("content", m.content)  # the id stays as sent: none when the caller gave none
    try:
        msg = messages_from_dict([{"type": lc.get("type"), "data": data}])[0]
    except (ValueError, TypeError, KeyError):
        return _by_role(m)  # an unknown or damaged record still reads back as a plain message
    return msg if isinstance(msg, want) and text_of(msg) == m.content else _by_role(m)


def _resendable(msg: BaseMessage) -> BaseMessage:
    """``msg`` with only the blocks a replay may resend (pure): blocks that may carry other text
    give way to the text blocks' text, which is the stored text (or blank, when the stored text
    describes the tool calls the message keeps), and its media stays (:func:`~.content_blocks.resent`)."""
    if replayable(msg.content):
        return msg
    return msg.model_copy(update={"content": resent(list(msg.content)) if attachments(msg.content) else str(msg.text)})


def _defused(msg: BaseMessage) -> BaseMessage:
    """``msg`` with no chat-template turn marker spelt in what a provider shows a model: its
    text, its text blocks (read as one text, :func:`~tiered_memory.quoting.defuse_pieces`), its
    tool calls (name, id, arguments) and ``tool_call_id``, each through
    :func:`~tiered_memory.quoting.defuse_tokens` (a copy; ``msg`` itself when nothing
    changes, which is nearly always)."""
    update: dict[str, Any] = {}
    if isinstance(msg.content, str):
        update["content"] = defuse_tokens(msg.content)
    else:  # a chat template renders the text parts one after the other: a marker may span two
        content = list(msg.content)
        texts = [n for n, b in enumerate(content) if isinstance(b, str) or isinstance(b, Mapping) and is_text(b)]
        for n, text in zip(texts, defuse_pieces([block_text(content[n]) for n in texts])):
            block = content[n]
            content[n] = text if isinstance(block, str) else {**block, "text": text}
        update["content"] = content
    if isinstance(msg, AIMessage) and msg.tool_calls:
        update["tool_calls"] = [{**c, "name": defuse_tokens(c["name"]), "args": map_strings(c["args"], defuse_tokens),
                                 "id": None if c.get("id") is None else defuse_tokens(str(c["id"]))}
                                for c in msg.tool_calls]
    if isinstance(msg, ToolMessage):
        update["tool_call_id"] = defuse_tokens(msg.tool_call_id)
    changed = {k: v for k, v in update.items() if v != getattr(msg, k)}
    return msg.model_copy(update=changed) if changed else msg


def from_stored(m: StoredMessage, *, answered_calls: frozenset[str] | set[str] = frozenset()) -> BaseMessage:
    """Rebuild the LangChain message of a stored message (never a system message), with no
    chat-template turn marker spelt in it (``<|im_start|>`` replays as ``\\u003c|im_start|>``).

    A tool result keeps its ``ToolMessage`` only when its ``tool_call_id`` is in
    ``answered_calls`` (the calls of the assistant message just before it that no result answered
    yet; :func:`from_stored_many` passes those) and is a plain token; an assistant message's tool
    call is sent only when its name and id are plain tokens
    (:func:`~tiered_memory.tool_calls.tool_calls_problem`) and no earlier call of the message has its
    id (:func:`~.replay_calls.sendable`), else it comes back as quoted text.
    """
    if not isinstance(m, StoredMessage):
        raise InvalidInputError(f"from_stored takes a StoredMessage (as the memory's reads return), "
                                f"got {type(m).__name__}")
    return _replayed(m, answered_calls, None)


def _replayed(m: StoredMessage, answered_calls: Container[str], calls_answered: Container[str] | None) -> BaseMessage:
    """:func:`from_stored`'s message; ``calls_answered`` (before a new turn) the ids of the calls a
    replayed result answers, the others left out."""
    if m.role == "system":
        return _demoted(m, "system message")
    msg = _rebuilt(m)
    if isinstance(msg, AIMessage):
        msg = sendable_calls(msg, m, calls_answered)
    if isinstance(msg, ToolMessage) and not (is_tool_call_id(msg.tool_call_id) and msg.tool_call_id in answered_calls):
        return _demoted(m, "tool result", msg.content)
    return _defused(_resendable(msg))


def from_stored_many(messages: Sequence[StoredMessage], *, before_new_turn: bool = False,
                     live_call_ids: Iterable[str] = (), present: Container[str] = ()) -> list[BaseMessage]:
    """Rebuild stored messages in order; tool results are paired with the calls just before them:
    a result keeps its ``ToolMessage`` only in the run of results right after the assistant message
    whose call it answers, and only the first for a call; any other is quoted data (ids repeat across
    turns: Kimi's ``functions.search:0``), placed after that run's ``ToolMessages``: providers take
    a call's results right after it, and a quoted result stored between two of them cuts no run.

    ``before_new_turn``: the replay goes before a new turn of a prompt, so a tool call that no
    replayed result answers never will be there, and providers refuse such a prompt (each call
    must be followed by its result). Those calls are dropped from their assistant message; one
    left with none comes back as its stored text, which names the calls. (A run a guardrail ended
    after a call it refused stores the call so, as the agent's state holds it.)
    Nor does the replay continue a provider's stored response: an AI message comes back without
    its ``response_metadata["id"]``, by which ``ChatOpenAI(use_previous_response_id=True)`` would
    send only what follows it (dropping the memory and the system prompt before it) and resume a
    server-side response that may be gone (:func:`unchained`).

    And no tool-call id is sent twice, nor one of ``live_call_ids`` (those of the messages the prompt
    sends after the replay: the live turn's, never renamed): the newest call of an id keeps it, an
    older one and its results get a new one (:func:`~.replay_calls.sent_once`; Kimi's ids repeat in
    every turn, and Anthropic refuses a prompt whose ``tool_use`` ids repeat).

    ``present``: the ids (:func:`lc_id`) of the messages the prompt holds, left out, and their partners
    paired as the replay holds them: a result whose call the prompt holds is quoted data, a call whose
    result it holds is unanswered (dropped ``before_new_turn``). (A thread replayed from before its tools
    ran holds the stored call and the tool's new result, under a new id.)
    """
    replay: list[tuple[BaseMessage, StoredMessage, set[str]]] = []  # with its row and the calls results answered
    held: list[tuple[BaseMessage, StoredMessage, set[str]]] = []  # the run's quoted results: after its ToolMessages
    waiting: set[str] = set()  # the calls of the last assistant message no result answered yet
    asker: set[str] = set()  # the calls of that message a result answered
    for m in messages:
        msg = from_stored(m, answered_calls=waiting)
        if lc_id(m) in present:  # left out: a result of it answers nothing here, nor one after a message of it
            if isinstance(msg, ToolMessage):
                waiting.discard(msg.tool_call_id)
            elif m.role != "tool":
                waiting = set()
        elif isinstance(msg, ToolMessage):  # providers take a call's results right after it, once each
            waiting.discard(msg.tool_call_id)
            asker.add(msg.tool_call_id)
            replay.append((msg, m, set()))
        elif m.role == "tool":  # a result that answers no waiting call, quoted: the run goes on after it
            held.append((msg, m, set()))
        else:  # a run of results ends at any other message
            replay += held
            held, asker = [], set()
            waiting = {str(c["id"]) for c in msg.tool_calls if c.get("id")} if isinstance(msg, AIMessage) else set()
            replay.append((msg, m, asker))
    replay += held
    if not before_new_turn:
        return sent_once([msg for msg, _, _ in replay], live_call_ids)
    return sent_once([unchained(_replayed(m, frozenset(), answered) if isinstance(msg, AIMessage) and any(
        str(c.get("id")) not in answered for c in msg.tool_calls) else msg) for msg, m, answered in replay],
        live_call_ids)


def unchained(msg: BaseMessage) -> BaseMessage:
    """``msg`` without the provider's response id (pure): a prompt rebuilt from the store is
    complete in itself, no continuation of the response the id names."""
    if not isinstance(msg, AIMessage) or "id" not in msg.response_metadata:
        return msg
    kept = {k: v for k, v in msg.response_metadata.items() if k != "id"}
    return msg.model_copy(update={"response_metadata": kept})
