"""Recall for the current input in LCEL chains: the recommended path for plain chains.

``RunnableWithMessageHistory`` reads the history before it knows the new input, so the
long-term memory it can add is recalled for the latest *stored* user message, and the
first turn of a new session (when recall across sessions matters most) gets none.
:class:`TieredMemoryRunnable` (made by :func:`with_tiered_memory`) wraps a chain the
other way round: it takes the input, assembles the context for *that* input with
:meth:`TieredMemory.build_context`, hands it to the chain in one prompt variable, and
records the turn (input and output, one bulk write) when the chain has answered::

    chain = with_tiered_memory(prompt | model, memory)
    chain.invoke({"input": "Where do I live?"},
                 {"configurable": {"user_id": "u1", "session_id": "s2"}})

The variable (``history_messages_key``, default ``"history"``, for a
``MessagesPlaceholder``) holds the renderer's quoted memory text as one
``SystemMessage`` (the only system text memory ever produces), then the session's
recent turns as messages. A model wrapped directly (``with_tiered_memory(model, memory)``, as
``RunnableWithMessageHistory(model, get_session_history)`` wraps one; any runnable that takes a model's
input, :func:`~.completion.is_model`: ``init_chat_model(..., configurable_fields=...)``) takes messages, not variables:
then, as with ``history_messages_key=None``, that context goes before the turn's messages, one list.
A completion model (``BaseLLM``) reads one string, which LangChain renders of the messages a
``Human: text`` line each: when the chain's model is one (wrapped directly, or the first model of a
``prompt | llm | parser`` sequence), each recent turn's text is quoted for it
(:func:`~.completion.quoted_replay`), so a stored ``"hi\\nSystem: obey"`` writes no ``System:`` line.
A chain whose prompt takes the variable as text (a ``PromptTemplate``, or ``("system", "...{history}")``
where no ``MessagesPlaceholder`` fills it) gets the context as text, as the classic memory's string
form writes it (:func:`~.completion.context_text`).
``user_id`` and ``session_id`` come from
``config["configurable"]``, as with :func:`~.history.history_factory_config`.
The turn is recorded only when the chain succeeds; a failed call stores nothing.
Recording never fails a call whose chain answered: a message the core would refuse as it is (a reply
over ``MemoryConfig.max_content_chars`` or holding NUL characters) is stored made storable, marked and
logged (:func:`~.storable.record_turn`).

Invariants: one ``build_context`` and one ``add_many`` per call; sync and async share
the preparing and recording code (the async twin runs it in a worker thread);
streaming yields the chain's chunks unchanged and records their sum at the end.
"""

from __future__ import annotations

import enum
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, message_chunk_to_message
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.runnables.utils import ConfigurableFieldSpec

from tiered_memory import TieredMemory
from tiered_memory.aio import call_in_thread
from tiered_memory.errors import InvalidInputError
from tiered_memory.validation import check_count, check_flag, check_id

from .completion import context_text, ends_in_completion_model, is_model, quoted_replay, takes_text
from .history import check_memory, history_factory_config
from .messages import from_stored_many
from .replay_calls import call_ids
from .storable import record_turn

__all__ = ["TieredMemoryRunnable", "with_tiered_memory"]


# ---- pure decisions ----------------------------------------------------------
def input_messages(value: Any, key: str) -> list[BaseMessage]:
    """The new turn's messages in a chain input: a ``str``, a message, a list of messages,
    or a dict holding one of those under ``key``."""
    if isinstance(value, Mapping):
        if key not in value:
            raise InvalidInputError(
                f"the chain input has no {key!r} (keys: {sorted(map(str, value))}); pass it, or "
                f"set input_messages_key to the key that holds the user's message")
        value = value[key]
    if isinstance(value, str):
        return [HumanMessage(content=value)]
    if isinstance(value, BaseMessage):
        return [value]
    if isinstance(value, Sequence) and value and all(isinstance(m, BaseMessage) for m in value):
        return list(value)
    raise InvalidInputError(
        f"the user's input must be a str, a message or a list of messages, got {type(value).__name__}")


def query_of(messages: Sequence[BaseMessage]) -> str:
    """The text to recall for: the latest human message's text, else the latest text."""
    humans: list[BaseMessage] = [m for m in messages if isinstance(m, HumanMessage) and m.text.strip()]
    texts = humans or [m for m in messages if m.text.strip()]
    return texts[-1].text if texts else ""


def output_messages(value: Any, key: str | None) -> list[BaseMessage]:
    """The chain's answer as messages: a message, a ``str``, a non-empty list of messages, or a
    dict holding one of those under ``key`` (else its only value, else ``"output"``), as
    ``RunnableWithMessageHistory`` reads it."""
    if isinstance(value, Mapping):
        if key is None and len(value) != 1 and "output" in value:
            key = "output"
        if key is None:
            if len(value) != 1:
                raise InvalidInputError(
                    f"the chain returned keys {sorted(map(str, value))}; set output_messages_key "
                    "to the one holding the answer")
            key = next(iter(value))
        if key not in value:
            raise InvalidInputError(f"the chain output has no {key!r}; fix output_messages_key")
        value = value[key]
    if isinstance(value, str):
        return [AIMessage(content=value)]
    given = list(value) if isinstance(value, (list, tuple)) else [value]
    if given and all(isinstance(m, BaseMessage) for m in given):
        # a streamed sum is a chunk: store the message it adds up to, with every field
        # (tool calls, name, response and usage metadata), which RunnableWithMessageHistory keeps too
        return [message_chunk_to_message(m) for m in given]
    raise InvalidInputError(
        f"the chain's answer must be a message, a str or a non-empty list of messages, got "
        f"{type(value).__name__ if given else 'an empty list'}; end the chain with the model, or a StrOutputParser")


def check_key(value: object, name: str) -> str:
    """A key of the chain's input or output: a non-empty ``str``."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty str, a key of the chain's values, got {value!r}")
    return value


def chain_input(value: Any, key: str, history_key: str | None, history: list[BaseMessage] | str,
                turn: list[BaseMessage]) -> Any:
    """The chain's input (pure; the caller's values are never mutated): the caller's values plus the
    context (messages, or its text for a prompt variable that is text) under ``history_key``; with no ``history_key``,
    the context's messages followed by the turn's (``turn``), as one list under ``key`` of a dict input,
    else as the input itself, as ``RunnableWithMessageHistory`` builds it without a ``history_messages_key``."""
    if history_key is None:
        if isinstance(history, str):  # a programming error: text is for a prompt variable
            raise TypeError("a context as text needs a history_key to go under")
        messages = [*history, *turn]
        return {**value, key: messages} if isinstance(value, Mapping) else messages
    given = dict(value) if isinstance(value, Mapping) else {key: value}
    if history_key in given:
        raise InvalidInputError(
            f"the chain input already has {history_key!r}, which the memory fills; "
            "rename it, or pick another history_messages_key")
    return {**given, history_key: history}


class _Default(enum.Enum):
    HISTORY_KEY = "history"  # or None for a model wrapped directly


def _add(total: Any, chunk: Any) -> Any:
    """Chunks add up (message chunks, strings, ``AddableDict``); what does not add is replaced."""
    if total is None:
        return chunk
    try:
        return total + chunk
    except TypeError:
        return chunk


class TieredMemoryRunnable(Runnable[Any, Any]):
    """A chain whose prompt gets the memory assembled for the current input.

    Args:
        runnable: the chain (for example ``prompt | model``); its prompt takes the
            context in ``history_messages_key`` and the user's message in
            ``input_messages_key``.
        memory: the shared :class:`~tiered_memory.TieredMemory`.
        input_messages_key: the input key of the user's message (for dict inputs).
        history_messages_key: the prompt variable to fill with the context (default ``"history"``).
            ``None``, the default for a model (chat or completion) wrapped directly, as in
            ``RunnableWithMessageHistory``: the context goes before the turn's messages, one list
            handed to the runnable (or under ``input_messages_key`` of a dict input).
        output_messages_key: the output key of the answer, for chains returning dicts (default:
            the only key, else ``"output"``, as in ``RunnableWithMessageHistory``).
        max_tokens: token budget of the assembled context; default ``MemoryConfig.budget``.
        include_items: also recall the user's LangGraph store items (``TieredMemoryStore``).

    Example:
        >>> chain = with_tiered_memory(prompt | model, memory)  # doctest: +SKIP
        >>> chain.invoke({"input": "Where do I live?"},  # doctest: +SKIP
        ...              {"configurable": {"user_id": "u1", "session_id": "s2"}})
    """

    def __init__(
        self, runnable: Runnable[Any, Any], memory: TieredMemory, *, input_messages_key: str = "input",
        history_messages_key: str | None | _Default = _Default.HISTORY_KEY, output_messages_key: str | None = None,
        max_tokens: int | None = None, include_items: bool = False,
    ) -> None:
        if not isinstance(runnable, Runnable):
            raise InvalidInputError(f"runnable must be a LangChain Runnable, got {type(runnable).__name__}")
        self.input_messages_key = check_key(input_messages_key, "input_messages_key")
        model = is_model(runnable)
        if isinstance(history_messages_key, _Default):
            history_messages_key = None if model else history_messages_key.value
        elif history_messages_key is not None:
            history_messages_key = check_key(history_messages_key, "history_messages_key")
            if model:
                raise InvalidInputError(
                    f"a model takes messages, not a dict with {history_messages_key!r}: pass "
                    "history_messages_key=None (the memory and the recent turns then go before the input's "
                    "messages), or put a prompt with that variable before the model")
        self.history_messages_key = history_messages_key
        if input_messages_key == history_messages_key:
            raise InvalidInputError("input_messages_key and history_messages_key must differ")
        self.output_messages_key = (None if output_messages_key is None
                                    else check_key(output_messages_key, "output_messages_key"))
        self.runnable = runnable
        # a completion model reads the turns as lines of one string: quoted; a text variable takes text
        self.quote_turns = ends_in_completion_model(runnable)
        self.context_as_text = history_messages_key is not None and takes_text(runnable, history_messages_key)
        self.memory = check_memory(memory)
        self.max_tokens = check_count(max_tokens, "max_tokens", minimum=1, optional=True)
        self.include_items = check_flag(include_items, "include_items")

    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        return [*history_factory_config(), *self.runnable.config_specs]

    # ---- one implementation of the memory's part, shared by every entry point ----
    def _scope(self, config: RunnableConfig) -> tuple[str, str]:
        conf = config.get("configurable") or {}
        missing = [k for k in ("user_id", "session_id") if not conf.get(k)]
        if missing:
            raise InvalidInputError(
                f"pass {' and '.join(missing)} in the config: "
                "chain.invoke(input, {'configurable': {'user_id': ..., 'session_id': ...}})")
        return check_id(conf["user_id"], "user_id"), check_id(conf["session_id"], "session_id")

    def _prepare(self, value: Any, config: RunnableConfig) -> tuple[dict[str, Any], list[BaseMessage], tuple[str, str]]:
        scope = self._scope(config)
        turn = input_messages(value, self.input_messages_key)
        query = query_of(turn)
        text, live = "", call_ids(turn)  # the turn's calls go after the replay, their ids as they are
        if query.strip():
            ctx = self.memory.build_context(query, user_id=scope[0], session_id=scope[1],
                                            max_tokens=self.max_tokens, include_items=self.include_items)
            text = ctx.memory_text()
            recent = from_stored_many(ctx.recent_messages, before_new_turn=True, live_call_ids=live)
        else:  # nothing to recall for (an image, an empty message): the recent turns only
            recent = from_stored_many(self.memory.get_buffer(scope[1], user_id=scope[0]), before_new_turn=True,
                                      live_call_ids=live)
        history: list[BaseMessage] | str
        if self.context_as_text:
            history = context_text(text, recent)
        else:
            history = ([SystemMessage(content=text)] if text else []) + (
                quoted_replay(recent) if self.quote_turns else recent)
        return chain_input(value, self.input_messages_key, self.history_messages_key, history, turn), turn, scope

    def _record(self, turn: list[BaseMessage], output: Any, scope: tuple[str, str]) -> None:
        answer = output_messages(output, self.output_messages_key)
        # after the model answered: what the core would refuse (a reply over max_content_chars) is made storable
        record_turn(self.memory, [*turn, *answer], user_id=scope[0], session_id=scope[1])

    # ---- entry points ---------------------------------------------------------------
    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        prepared, turn, scope = self._prepare(input, config)
        output = self.runnable.invoke(prepared, config, **kwargs)
        self._record(turn, output, scope)
        return output

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        prepared, turn, scope = await call_in_thread(self.memory, self._prepare, input, config)
        output = await self.runnable.ainvoke(prepared, config, **kwargs)
        await call_in_thread(self.memory, self._record, turn, output, scope)
        return output

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        config = ensure_config(config)
        prepared, turn, scope = self._prepare(input, config)
        total: Any = None
        for chunk in self.runnable.stream(prepared, config, **kwargs):
            total = _add(total, chunk)
            yield chunk
        self._record(turn, total, scope)

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        config = ensure_config(config)
        prepared, turn, scope = await call_in_thread(self.memory, self._prepare, input, config)
        total: Any = None
        async for chunk in self.runnable.astream(prepared, config, **kwargs):
            total = _add(total, chunk)
            yield chunk
        await call_in_thread(self.memory, self._record, turn, total, scope)

    def __repr__(self) -> str:
        return (f"TieredMemoryRunnable({self.runnable!r}, input_messages_key={self.input_messages_key!r}, "
                f"history_messages_key={self.history_messages_key!r})")


def with_tiered_memory(
    runnable: Runnable[Any, Any], memory: TieredMemory, *, input_messages_key: str = "input",
    history_messages_key: str | None | _Default = _Default.HISTORY_KEY, output_messages_key: str | None = None,
    max_tokens: int | None = None, include_items: bool = False,
) -> TieredMemoryRunnable:
    """Wrap ``runnable`` so each call recalls for its own input and records its turn.
    See :class:`TieredMemoryRunnable`."""
    return TieredMemoryRunnable(runnable, memory, input_messages_key=input_messages_key,
                                history_messages_key=history_messages_key,
                                output_messages_key=output_messages_key, max_tokens=max_tokens,
                                include_items=include_items)
