"""Which messages of an agent's state are the current turn, and what a model call recalls for: the pure
decisions of :class:`~.middleware.TieredMemoryMiddleware` (no I/O, no memory).

The turn starts at the last message the user wrote (:func:`turn_start`); a summary
(``SummarizationMiddleware``'s ``HumanMessage`` marked ``lc_source="summarization"``) is never part of it.
A message is recorded once no hook will change it (:func:`turn_to_record`). The question is told by its
message id, read before any ``before_model`` hook (``QUESTION_KEY``, in private state), and its text kept
there as a model call's hooks left it (``QUERY_KEY``, never as the user wrote it: a ``PIIMiddleware`` has
not redacted it yet, and LangGraph streams and checkpoints that state, :func:`kept_query`); a call recalls
for it as the request holds it then, the kept text once a hook dropped it (:func:`current_query`). The
store's id of each message the thread's runs stored is kept there too, by the message's id
(``STORED_AS_KEY``, kept across a checkpointed thread's runs while its messages hold them): others
writing to the session meanwhile (a sub-agent given the same context, another thread, between two runs
that continue one turn) cannot push them out of what the middleware reads back, neither to store them
again (:func:`stored_as`) nor to recall them into the prompt that holds them (:func:`shown_by_run`).
(A state from before holds a ``tiered_memory_stored`` list too, the ids one run stored, always among
these; no schema declares it now, and LangGraph restores no channel its graph lacks.)
"""

from __future__ import annotations

import re
from typing import Any, Collection, Mapping, Sequence

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage

__all__ = ["QUERY_KEY", "QUESTION_KEY", "STORED_AS_KEY", "current_query", "is_limit_notice", "is_summary",
           "kept_query", "query_of", "question_of", "shown_by_run", "stored_as", "text_now", "turn_start",
           "turn_to_record"]

QUERY_KEY = "tiered_memory_query"
QUESTION_KEY = "tiered_memory_question_id"
STORED_AS_KEY = "tiered_memory_stored_as"  # the store's ids of the messages the thread's runs stored, by their ids


def _source(message: AnyMessage) -> str | None:
    """The ``lc_source`` LangChain's agent harness marks a message it added with (a summary, a
    background task's notice), or ``None`` for a message the user wrote."""
    source = message.additional_kwargs.get("lc_source")
    return source if isinstance(source, str) else None


def is_summary(message: AnyMessage) -> bool:
    """Whether ``message`` is the summary ``SummarizationMiddleware`` put in place of older messages."""
    return isinstance(message, HumanMessage) and _source(message) == "summarization"


_COUNT = r"\(\d+/\d+"
# The texts LangChain's limit middleware end a run with (exit_behavior="end"), as they build them
# (langchain.agents.middleware.model_call_limit / tool_call_limit), whole: the model never wrote them.
_LIMIT_NOTICES = (
    re.compile(rf"Model call limits exceeded: (?:thread limit {_COUNT}\)(?:, run limit {_COUNT}\))?"
               rf"|run limit {_COUNT}\))"),
    re.compile(rf"(?:'.*' tool|Tool) call limit reached: (?:thread limit exceeded {_COUNT} calls\)"
               rf"(?: and run limit exceeded {_COUNT} calls\))?|run limit exceeded {_COUNT} calls\))\.", re.DOTALL),
)


def is_limit_notice(message: AnyMessage) -> bool:
    """Whether ``message`` is the notice ``ModelCallLimitMiddleware`` or ``ToolCallLimitMiddleware``
    (``exit_behavior="end"``) ends a run with in place of the model's reply (pure): an ``AIMessage`` of
    their exact text, no tool call and no response metadata (a model's reply carries its own)."""
    return (isinstance(message, AIMessage) and isinstance(message.content, str) and not message.tool_calls
            and not message.response_metadata and any(p.fullmatch(message.content) for p in _LIMIT_NOTICES))


def turn_start(messages: list[AnyMessage]) -> int | None:
    """Where the current turn starts (pure): the last message the user wrote, else the last one the
    harness added in its name other than a summary, else (the user's message was summarized away)
    the message after the summary; with no human message at all (a trim dropped the turn's), the
    first message; ``None`` when there are no messages."""
    humans = [n for n, m in enumerate(messages) if isinstance(m, HumanMessage)]
    typed = [n for n in humans if _source(messages[n]) is None]
    others = [n for n in humans if not is_summary(messages[n])]
    if typed or others:
        return (typed or others)[-1]
    if humans:
        return humans[-1] + 1
    return 0 if messages else None  # stored messages among them are skipped by id (turn_to_record)


def _settled(turn: list[AnyMessage]) -> list[AnyMessage]:
    """``turn`` up to its first AI message with a tool call that has no result yet (pure)."""
    answered = {m.tool_call_id for m in turn if isinstance(m, ToolMessage)}
    for n, m in enumerate(turn):
        if isinstance(m, AIMessage) and any(c.get("id") not in answered for c in m.tool_calls):
            return turn[:n]
    return turn


def _before_reply(turn: list[AnyMessage]) -> list[AnyMessage]:
    """``turn`` up to its last AI message, the reply of the model call just made (pure)."""
    last = max((n for n, m in enumerate(turn) if isinstance(m, AIMessage)), default=len(turn))
    return turn[:last]


def turn_to_record(messages: list[AnyMessage], stored_ids: set[str], *, final: bool = False) -> list[AnyMessage]:
    """The messages of the current turn (:func:`turn_start` on) not yet stored (pure).

    System messages are instructions and a summary restates stored turns: neither is recorded, nor the
    notice a limit middleware ends a run with (:func:`is_limit_notice`), which the model never said.
    A stored id is never recorded again, so a message is recorded only once no hook will change it:
    before the run ends (``final``), the model's latest reply waits, with what follows it, since the
    ``after_model`` hooks of middleware listed before this one run after its own and may still
    rewrite or refuse it (``PIIMiddleware(apply_to_output=True)``, a guardrail); and a tool call
    waits for its result, as until it runs a reviewer (``HumanInTheLoopMiddleware``) may still
    replace it under the same message id. ``final`` (the run has ended) records the rest, the
    calls that got no result too, as the state keeps them.
    """
    start = turn_start(messages)
    if start is None:
        return []
    turn = messages[start:] if final else _settled(_before_reply(messages[start:]))
    return [m for m in turn
            if not isinstance(m, SystemMessage) and not is_summary(m) and not is_limit_notice(m)
            and not (m.id and m.id in stored_ids)]


def question_of(messages: Sequence[AnyMessage]) -> AnyMessage | None:
    """The latest message the user wrote, else the latest human one (pure)."""
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    typed = [m for m in humans if _source(m) is None]
    return (typed or humans)[-1] if humans else None


def query_of(messages: list[AnyMessage]) -> str:
    """The text to recall for (pure): the latest message the user wrote, else the latest human one."""
    question = question_of(messages)
    return question.text if question is not None else ""


def text_now(messages: Sequence[AnyMessage], question_id: object) -> str | None:
    """The text of the message ``question_id`` names as ``messages`` hold it now, ``None`` if gone (pure)."""
    if not isinstance(question_id, str):
        return None
    return next((m.text for m in messages if m.id == question_id), None)


def kept_query(state: Mapping[str, Any], question_id: str | None) -> str | None:
    """The question's text a run starts with (pure): the text ``state`` kept for the question
    ``question_id`` names, as an earlier run's model call left it (a run that continues the turn), else
    ``None``: the text of a new question is kept once a model call's hooks have had it."""
    kept = state.get(QUERY_KEY)
    same = question_id is not None and state.get(QUESTION_KEY) == question_id
    return kept if same and isinstance(kept, str) else None


def current_query(messages: Sequence[AnyMessage], state: Mapping[str, Any]) -> str:
    """The text a model call recalls for (pure): the run's question (its id kept in ``state`` before any
    ``before_model`` hook) as ``messages`` hold it now, which a hook may have redacted under its id
    (``PIIMiddleware``); once a hook dropped it (a trim), the text kept as an earlier call's hooks left it,
    else nothing (``""``: no text the hooks had); with no question kept (a state from before), :func:`query_of`."""
    asked = state.get(QUESTION_KEY)
    now = text_now(messages, asked)
    kept = state.get(QUERY_KEY)
    if now is not None:
        return now
    if isinstance(kept, str):
        return kept
    return "" if isinstance(asked, str) else query_of(list(messages))


def stored_as(state: Mapping[str, Any], among: Collection[str] | None = None) -> dict[str, str]:
    """The store's id of each message the thread's runs stored, by the message's id, as ``state`` keeps
    them (pure; none in a state from before); only those of ``among`` ids when given."""
    ids = state.get(STORED_AS_KEY)
    if not isinstance(ids, Mapping):
        return {}
    return {k: v for k, v in ids.items() if isinstance(k, str) and isinstance(v, str) and (among is None or k in among)}


def shown_by_run(state: Mapping[str, Any], present: Collection[str]) -> list[str]:
    """The store's ids of the messages the thread's runs stored that are among the ``present`` message
    ids, the prompt's (pure): shown to the model already, whoever wrote to the session since."""
    return list(stored_as(state, present).values())
