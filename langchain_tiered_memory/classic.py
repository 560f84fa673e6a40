"""The bridge for apps still on classic chains: a ``BaseMemory`` for ``memory=``.

LangChain 1.x moved ``BaseMemory``, ``ConversationChain`` and ``LLMChain`` to
``langchain-classic`` and recommends ``create_agent`` with a store instead (see
:mod:`.middleware` and :mod:`.store`). Apps that still build classic chains can
switch to tiered memory by changing one argument::

    chain = ConversationChain(llm=model, memory=TieredConversationMemory(
        memory=memory, user_id="u1", session_id="s1"))

It behaves like the classic ``ConversationBufferMemory``: ``memory_key`` names the
prompt variable, ``input_key``/``output_key`` pick which chain values are stored,
and ``return_messages`` chooses messages (for chat prompts) or one string (for
string prompts). The variable holds the assembled context for the current input:
relevant long-term memory (quoted data) followed by the session's recent turns. In the
string form each turn is one line whose text is quoted (``Human: "hi"``, see
:func:`~.completion.quoted_turns`), where ``ConversationBufferMemory`` writes it raw.
Without an input (``load_memory_variables({})``, how the classic docs look at a
memory) there is nothing to recall for, so it holds the session's buffer, as
``ConversationBufferMemory`` does; ``buffer``, ``buffer_as_messages``,
``buffer_as_str`` and ``chat_memory`` (a :class:`~.history.TieredChatMessageHistory`
of the session) are there too.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from langchain_classic.base_memory import BaseMemory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import ConfigDict, field_validator, model_validator

from tiered_memory import InvalidInputError, TieredMemory
from tiered_memory.aio import call_in_thread
from tiered_memory.errors import TypedArgumentsModel
from tiered_memory.validation import check_count, check_id

from .completion import context_text, quoted_turns
from .history import TieredChatMessageHistory
from .messages import from_stored_many
from .storable import record_turn

__all__ = ["TieredConversationMemory"]


def turn_text(value: Any, what: str) -> str:
    """The text to store for one side of a turn (pure): a string as it is, a message's text,
    a number as written; a list or mapping (several messages, a structured value) has no one
    text to store, and ``None`` none at all, so both are an ``InvalidInputError`` (for a list or
    mapping, one that says which key to point at)."""
    if isinstance(value, str):
        return value
    if value is None:
        raise InvalidInputError(f"the {what} is None: there is no text to store")
    if isinstance(value, BaseMessage):
        return value.text
    if isinstance(value, (list, tuple, dict, set)):
        raise InvalidInputError(
            f"the {what} is a {type(value).__name__}, not one text or message: set input_key / output_key "
            "to the key that holds the text of the turn")
    return str(value)


def chain_values(values: Any, what: str, example: str) -> dict[str, Any]:
    """``values`` if it is a chain's ``what`` (``inputs``, ``outputs``): a mapping of names to
    values, as a chain passes them; else an ``InvalidInputError`` (pure). A str would otherwise
    be read as its characters, each a key."""
    if not isinstance(values, Mapping):
        raise InvalidInputError(f"the chain {what} must be a dict such as {{{example!r}: ...}}, "
                                f"got {type(values).__name__}")
    return dict(values)


# options of LangChain's other classic memories (window, token buffer, summary, vector store), and what stands in
# for each here: refused with that, so an app swapping one of them in learns what bounds the context
_CLASSIC_OPTIONS = {
    "k": "the recent turns are the session's token-bounded buffer (MemoryConfig.buffer), older turns are "
         "recalled rather than dropped, and max_tokens bounds the whole context",
    "max_token_limit": "max_tokens bounds the whole context (recalled memory and recent turns; "
                       "MemoryConfig.buffer the recent turns)",
    "llm": "older turns are recalled, not summarised into the prompt; pass TieredMemory(llm=...) to have "
           "episodes and facts written at end_session",
    "chat_memory": "this memory is always its own session of `memory` (user_id, session_id), whose "
                   "TieredChatMessageHistory is its chat_memory",
    "prompt": "older turns are recalled, not summarised, so there is no summarising prompt",
    # VectorStoreRetrieverMemory's
    "retriever": "the memory recalls from `memory` itself (this user's sessions, facts and episodes) for the "
                 "input; for Documents from it in a chain, use TieredMemoryRetriever",
    "return_docs": "the variable holds the context as text or messages, never Documents; for Documents, use "
                   "TieredMemoryRetriever",
    "exclude_input_keys": "only the input_key's value is stored (as the user's message), never the other inputs",
}


class TieredConversationMemory(TypedArgumentsModel, BaseMemory):
    """Classic chain memory backed by :class:`~tiered_memory.TieredMemory`.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory`.
        user_id: whose memory it is.
        session_id: the conversation this chain is having.
        memory_key: the prompt variable to fill (default ``"history"``).
        input_key: the chain input to store and to recall for; default the only
            input that is not a memory variable (or ``stop``). With several, set it:
            the call fails when the memory is loaded, before the model runs (the classic
            buffer memories fail only when saving, after it), as it does when the inputs
            lack the ``input_key`` set.
        output_key: the chain output to store; default the only output, else ``"output"``.
        return_messages: a list of messages instead of one string.
        human_prefix, ai_prefix: speaker labels of the string form.
        max_tokens: token budget of the assembled context.

    A key that is missing or ambiguous, inputs or outputs that are no mapping, or a turn that is
    ``None``, raise :class:`~tiered_memory.errors.InvalidInputError` (a ``ValueError``, as in the
    classic memories) and nothing is stored. A bad or unknown constructor argument is refused with
    :class:`~tiered_memory.errors.InvalidArgumentsError`, which is pydantic's ``ValidationError`` too;
    one of the window, token-buffer, summary or vector-store retriever memories (``k``,
    ``max_token_limit``, ``llm``, ``prompt``, ``chat_memory``, ``retriever``, ``return_docs``,
    ``exclude_input_keys``) with what stands in for it here.

    Example:
        >>> chain = ConversationChain(llm=model, memory=TieredConversationMemory(  # doctest: +SKIP
        ...     memory=memory, user_id="u1", session_id="s2"))
        >>> chain.invoke({"input": "Where do I live?"})  # doctest: +SKIP
    """

    # a misspelt option (``retrun_messages=``) is refused, not silently ignored; the other classic
    # memories' options (``k=``, ``chat_memory=``, ...) with what stands in for them (_CLASSIC_OPTIONS)
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: TieredMemory
    user_id: str
    session_id: str
    memory_key: str = "history"
    input_key: str | None = None
    output_key: str | None = None
    return_messages: bool = False
    human_prefix: str = "Human"
    ai_prefix: str = "AI"
    max_tokens: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_classic_options(cls, data: Any) -> Any:
        given = [name for name in _CLASSIC_OPTIONS if isinstance(data, Mapping) and name in data]
        if given:
            raise InvalidInputError("; ".join(f"{name}= (of LangChain's classic memories) has no use here: "
                                              f"{_CLASSIC_OPTIONS[name]}" for name in given))
        return data

    @field_validator("user_id", "session_id")
    @classmethod
    def _check_ids(cls, value: str, info: Any) -> str:
        return check_id(value, info.field_name)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _check_budget(cls, value: Any) -> int | None:
        return check_count(value, "max_tokens", minimum=1, optional=True)

    @property
    def memory_variables(self) -> list[str]:
        return [self.memory_key]

    def _input_key(self, inputs: dict[str, Any]) -> str:
        """``input_key``, else the one input that is not a memory variable or ``stop`` (as the
        classic memories pick it), refused with an ``InvalidInputError`` when there is none or several."""
        if self.input_key is not None:
            if self.input_key not in inputs:
                raise InvalidInputError(
                    f"the chain inputs have no {self.input_key!r} (keys: {sorted(map(str, inputs))}); "
                    "fix input_key")
            return self.input_key
        keys = sorted(str(k) for k in inputs if k not in self.memory_variables and k != "stop")
        if len(keys) != 1:
            raise InvalidInputError(
                f"One input key expected got {keys}: set input_key to the one that holds the user's message")
        return keys[0]

    def _input_text(self, inputs: dict[str, Any]) -> str:
        key = self._input_key(inputs)
        return turn_text(inputs[key], f"input {key!r}")

    def _query(self, inputs: dict[str, Any]) -> str | None:
        """The text to recall for, or ``None`` when the call carries no input at all. A call with
        inputs but not the one to store fails here, before the model runs, not at the save."""
        if not any(k not in self.memory_variables and k != "stop" for k in inputs):
            return None
        return self._input_text(inputs)

    # ---- the buffer, as on ConversationBufferMemory --------------------------
    @property
    def chat_memory(self) -> TieredChatMessageHistory:
        """This session as a chat history (the same store; writes through it are shared)."""
        return TieredChatMessageHistory(self.memory, self.session_id, user_id=self.user_id)

    @property
    def buffer_as_messages(self) -> list[BaseMessage]:
        """The session's token-bounded buffer of recent turns, as messages."""
        return self.chat_memory.messages

    @property
    def buffer_as_str(self) -> str:
        """The same buffer as one string, a turn a line: ``human_prefix``/``ai_prefix`` and the
        turn's text quoted (:func:`quoted_turns`)."""
        return quoted_turns(self.buffer_as_messages, self.human_prefix, self.ai_prefix)

    @property
    def buffer(self) -> Any:
        """``buffer_as_messages`` when ``return_messages``, else ``buffer_as_str``."""
        return self.buffer_as_messages if self.return_messages else self.buffer_as_str

    async def abuffer_as_messages(self) -> list[BaseMessage]:
        return await self.chat_memory.aget_messages()

    async def abuffer_as_str(self) -> str:
        return quoted_turns(await self.abuffer_as_messages(), self.human_prefix, self.ai_prefix)

    async def abuffer(self) -> Any:
        return await (self.abuffer_as_messages() if self.return_messages else self.abuffer_as_str())

    def _output_text(self, outputs: dict[str, Any]) -> str:
        if self.output_key is not None:
            if self.output_key not in outputs:
                raise InvalidInputError(
                    f"the chain outputs have no {self.output_key!r} (keys: {sorted(map(str, outputs))}); "
                    "fix output_key")
            value = outputs[self.output_key]
        elif len(outputs) == 1:
            value = next(iter(outputs.values()))
        elif "output" in outputs:
            value = outputs["output"]
        else:
            raise InvalidInputError(
                f"got output keys {sorted(map(str, outputs))}; set output_key to the one to store")
        return turn_text(value, "output")

    def load_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The assembled context for this input: long-term memory, then recent turns.
        Without an input to recall for (``{}``, a blank input, an image alone), the session's
        buffer (:attr:`buffer`) as it goes before a new turn: without the tool calls no result
        answers and the provider's response ids (:func:`~.messages.from_stored_many`)."""
        query = self._query(chain_values(inputs, "inputs", "input"))
        memory_text = ""
        if query is None or not query.strip():  # nothing to recall for: the buffer, replayed before a new turn
            buffer = self.memory.get_buffer(self.session_id, user_id=self.user_id)
            recent = from_stored_many(buffer, before_new_turn=True)
        else:
            ctx = self.memory.build_context(query, user_id=self.user_id, session_id=self.session_id,
                                            max_tokens=self.max_tokens)
            recent = from_stored_many(ctx.recent_messages, before_new_turn=True)
            memory_text = ctx.memory_text()
        if self.return_messages:
            lead: list[BaseMessage] = [SystemMessage(content=memory_text)] if memory_text else []
            return {self.memory_key: lead + recent}
        return {self.memory_key: context_text(memory_text, recent, self.human_prefix, self.ai_prefix)}

    def save_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        """Store the turn (the input as a user message, the output as an AI message). The chain calls
        this after the model answered: a text the core would refuse as it is (over ``max_content_chars``,
        holding NUL characters) is stored made storable and marked (:func:`~.storable.record_turn`)."""
        inputs, outputs = chain_values(inputs, "inputs", "input"), chain_values(outputs, "outputs", "output")
        turn = [HumanMessage(content=self._input_text(inputs)),
                AIMessage(content=self._output_text(outputs))]
        record_turn(self.memory, turn, user_id=self.user_id, session_id=self.session_id)

    def clear(self) -> None:
        """Delete this session's messages."""
        self.memory.clear_session(self.session_id, user_id=self.user_id)

    def end_session(self) -> Any:
        """Close the session in long-term memory: extract facts and compress it into an
        episode (with the memory's LLM, else by rules). Returns the episode, if any."""
        return self.memory.end_session(self.session_id, user_id=self.user_id)

    async def aend_session(self) -> Any:
        return await self.memory.aend_session(self.session_id, user_id=self.user_id)

    # async twins: the same implementation, off the event loop
    async def aload_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return await call_in_thread(self.memory, self.load_memory_variables, inputs)

    async def asave_context(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        await call_in_thread(self.memory, self.save_context, inputs, outputs)

    async def aclear(self) -> None:
        await call_in_thread(self.memory, self.clear)
