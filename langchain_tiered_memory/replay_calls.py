"""Which of a stored assistant message's tool calls a replay sends as calls, and with which ids (pure).

A provider is sent a call's name and id outside any quoting, and takes each id once in a
prompt (Anthropic refuses a request whose ``tool_use`` ids repeat anywhere in its messages; OpenAI
pairs results with calls by id). So a call stays a call only when its name and id are plain tokens
(:mod:`tiered_memory.tool_calls`) and no call before it in the message has its id; any other
becomes a quoted line after the message's text (its media kept, :func:`~.content_blocks.appended`),
and a result for it pairs with nothing and replays as quoted data. A message stored with two calls
of one id (as a model returned it) is not refused when written: the recording paths store a reply
after the fact, the import reads what older versions wrote, and the replay quotes the second call.

Across messages ids repeat by design (Kimi's and DeepSeek's servers number each turn's calls,
``functions.get_weather:0``), so a replayed prompt sends each id once (:func:`sent_once`): the
newest call of an id keeps it (the last call a caller may still answer, and the calls of the live
turn the agent sends beside the replay, which are never renamed), and each older call gets a new
id made from its own (another number at its end: ``functions.get_weather:1``), which the results
that answer it get too. The ids are the replay's to choose: the stored ones are unchanged.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Container, Iterable, Sequence

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.tool import ToolCall

from tiered_memory.quoting import quote
from tiered_memory.tool_calls import tool_calls_problem
from tiered_memory.types import StoredMessage

from .content_blocks import appended

__all__ = ["call_ids", "sendable", "sendable_calls", "sent_once", "unpaired_results", "with_own_results"]

_NUMBERED = re.compile(r"(.*?)([0-9]{1,9})", re.DOTALL)  # an id and the number it ends in (its last 9 digits)


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


def call_ids(messages: Iterable[BaseMessage]) -> set[str]:
    """The tool-call ids ``messages`` send (pure): their calls' and their results'."""
    out: set[str] = set()
    for m in messages:
        if isinstance(m, AIMessage):
            out.update(str(c["id"]) for c in m.tool_calls if c.get("id") is not None)
        elif isinstance(m, ToolMessage):
            out.add(m.tool_call_id)
    return out


def _fresh(call_id: str, taken: set[str]) -> str:
    """An id made from ``call_id`` that is none of ``taken`` (pure), at most 256 characters. An id
    that ends in a number ends in the next free one (Kimi's ``functions.get_weather:0`` becomes
    ``functions.get_weather:1``, ``call_0`` ``call_1``): Kimi's chat template shows a model the ids of
    the history, it writes its next ones alike, and its server reads the tool's name out of them.
    Any other gets ``-2``, ``-3``, ... (``call_ab-2``)."""
    numbered = _NUMBERED.fullmatch(call_id)
    head, sep, start = (numbered[1], "", int(numbered[2]) + 1) if numbered else (call_id, "-", 2)
    for n in itertools.count(start):
        made = head[:256 - len(sep) - len(str(n))] + sep + str(n)
        if made not in taken:
            return made
    raise AssertionError("unreachable")  # count() never ends


def sent_once(messages: Sequence[BaseMessage], live: Iterable[str] = ()) -> list[BaseMessage]:
    """``messages`` (a replay: each ``ToolMessage`` in the run of results right after the
    ``AIMessage`` whose call it answers) with no tool-call id sent twice, nor one of ``live`` (the
    ids of the messages the prompt sends after the replay, never renamed) (pure). The newest call of
    an id keeps it; an older one gets a new id (:func:`_fresh`), and the results of its run that
    answer it get the same."""
    taken = set(live)
    renames: dict[int, dict[str, str]] = {}  # by the AIMessage's place: each call's id -> the id sent
    for n in range(len(messages) - 1, -1, -1):  # newest first: it keeps its id
        msg = messages[n]
        if isinstance(msg, AIMessage):
            names = renames[n] = {}
            for old in (str(c["id"]) for c in msg.tool_calls if c.get("id") is not None):
                names[old] = _fresh(old, taken) if old in taken else old
                taken.add(names[old])
    out: list[BaseMessage] = []
    names = {}  # the last AIMessage's: the results after it answer its calls
    for n, msg in enumerate(messages):
        if isinstance(msg, AIMessage):
            names = renames[n]
            if any(new != old for old, new in names.items()):
                msg = msg.model_copy(update={"tool_calls": [
                    c if c.get("id") is None else {**c, "id": names[str(c["id"])]} for c in msg.tool_calls]})
        elif isinstance(msg, ToolMessage) and names.get(msg.tool_call_id, msg.tool_call_id) != msg.tool_call_id:
            msg = msg.model_copy(update={"tool_call_id": names[msg.tool_call_id]})
        out.append(msg)
    return out


def unpaired_results(messages: Sequence[BaseMessage]) -> set[int]:
    """The places in ``messages`` of the ``ToolMessage``\\ s a provider refuses there (pure): those not in the
    run of results right after the ``AIMessage`` whose call they answer, or answering it a second time.
    (A trim that keeps the last messages keeps a result whose call it drops: LangChain's
    ``trim_messages`` without ``start_on``, a ``@before_model`` hook keeping the first and last few.)"""
    out: set[int] = set()
    waiting: set[str] = set()  # the calls of the AIMessage before this run of results no result answered yet
    for n, m in enumerate(messages):
        if isinstance(m, ToolMessage):
            if m.tool_call_id not in waiting:
                out.add(n)
            waiting.discard(m.tool_call_id)
        else:
            waiting = call_ids([m]) if isinstance(m, AIMessage) else set()
    return out


def with_own_results(replay: Sequence[BaseMessage], own: Iterable[BaseMessage]) -> list[BaseMessage]:
    """``replay`` with each of its ``ToolMessage``\\ s that has the id of one of ``own`` (results the prompt
    left out of its own messages, which the replay pairs with their stored calls) replaced by that one,
    under the ``tool_call_id`` the replay gave it (pure): the prompt sends the result as the agent holds
    it (the store may keep a shortened copy of a tool's huge output); a quoted stored copy stays quoted."""
    by_id = {m.id: m for m in own if isinstance(m, ToolMessage) and m.id}
    return [by_id[m.id].model_copy(update={"tool_call_id": m.tool_call_id})
            if isinstance(m, ToolMessage) and m.id in by_id else m for m in replay]
