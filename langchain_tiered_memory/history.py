"""A LangChain chat message history backed by :class:`~tiered_memory.TieredMemory`.

``TieredChatMessageHistory`` is what ``RunnableWithMessageHistory`` reads before a
call and appends to after it. Reads return the session's token-bounded buffer
(the newest whole turns within ``MemoryConfig.buffer``), not the full session:
everything older stays in the store and is reachable through recall. With
``include_memory=True`` the assembled long-term memory comes first, as one
``SystemMessage`` of quoted data (:meth:`MemoryContext.memory_text`), and the turns after it
are replayed as a prompt's (``before_new_turn``, :func:`~.messages.from_stored_many`): without
the tool calls no stored result answers, which providers refuse, and the AI messages without the
provider's response id: ``ChatOpenAI(use_previous_response_id=True)`` would send only what
follows the last one and leave the memory out.

Note that ``RunnableWithMessageHistory`` reads the history before it sees the new
input, so the long-term memory is recalled for the latest *stored* user message.
To recall for the new input itself, use :class:`~.middleware.TieredMemoryMiddleware`
(``create_agent``) or :class:`~.retriever.TieredMemoryRetriever` in the chain. Nor can the replay
rename its tool calls off the input's (:func:`~.replay_calls.sent_once`): an input that brings an AI
message whose tool call has the id of a stored call (a whole tool round passed as input, with ids that
repeat every turn, Kimi's ``functions.get_weather:0``) sends that id twice, which Anthropic refuses;
such a chain belongs in :func:`~.runnable.with_tiered_memory`, which sees the input. (The usual input, a
human message or the results of the newest stored call, is unaffected: the newest call keeps its id.)
"""

from __future__ import annotations

import contextlib
import enum
import threading
from typing import Any, Callable, Iterator, Sequence

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.runnables.utils import ConfigurableFieldSpec

from tiered_memory import TieredMemory
from tiered_memory.aio import call_in_thread
from tiered_memory.types import StoredMessage
from tiered_memory.errors import ConfigurationError, InvalidInputError
from tiered_memory.validation import check_count, check_flag, check_id

from .messages import from_stored_many, to_core_many
from .storable import record_turn

__all__ = ["TieredChatMessageHistory", "check_memory", "history_factory", "history_factory_config"]


def check_memory(memory: object) -> TieredMemory:
    """``memory`` if it is a :class:`~tiered_memory.TieredMemory` (checked when an adapter is
    built, so a wrong argument is not found at the first call)."""
    if not isinstance(memory, TieredMemory):
        raise InvalidInputError(f"memory must be a TieredMemory, got {type(memory).__name__}")
    return memory


def _latest_user_text(buffer: Sequence[StoredMessage]) -> str:
    return next((m.content for m in reversed(buffer) if m.role == "user"), "")


class TieredChatMessageHistory(BaseChatMessageHistory):
    """One session of one user, as a LangChain chat history.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory`.
        session_id: the conversation (positional, as in every LangChain history, or by name).
        user_id: whose memory it is (scopes all reads and writes).
        include_memory: prepend the assembled long-term memory (relevant older turns,
            and the other layers the core provides) as a leading ``SystemMessage``.
        max_tokens: token budget of that assembly (default ``MemoryConfig.budget``): the
            memory message and the recent turns fit it, the oldest turns going first; a
            newest message longer than the whole budget comes back cut, with a marker. Without
            ``include_memory`` the buffer's own limits apply and nothing is cut.
        hold_reads: answer every read with the first one's messages until this history
            writes (``add_messages``, ``clear``). For a history made for one call, as
            :func:`history_factory`'s are: ``RunnableWithMessageHistory`` without a
            ``history_messages_key`` reads the history again after the call and drops as many
            leading input messages as it holds, so a recall changed meanwhile (the user's
            other sessions written by a tool or another tab) would drop the new message.
        record_answers: store a message the core would refuse as it is (a reply over
            ``max_content_chars``, NUL characters, fields over ``max_metadata_bytes``) changed
            and marked, as the middleware does (:func:`~.storable.record_turn`), instead of
            raising: for a history written after the model answered, as
            ``RunnableWithMessageHistory`` writes :func:`history_factory`'s.

    Example:
        >>> history = TieredChatMessageHistory(memory, "s1", user_id="u1")  # doctest: +SKIP
        >>> history.add_messages([HumanMessage("hi"), AIMessage("hello")])  # doctest: +SKIP
        >>> [m.type for m in history.messages]  # doctest: +SKIP
        ['human', 'ai']
    """

    def __init__(
        self, memory: TieredMemory, session_id: str, *, user_id: str,
        include_memory: bool = False, max_tokens: int | None = None, hold_reads: bool = False,
        record_answers: bool = False,
    ) -> None:
        self.memory = check_memory(memory)
        self.session_id = check_id(session_id, "session_id")
        self.user_id = check_id(user_id, "user_id")
        self.include_memory = check_flag(include_memory, "include_memory")
        self.max_tokens = check_count(max_tokens, "max_tokens", minimum=1, optional=True)
        self.hold_reads = check_flag(hold_reads, "hold_reads")
        self.record_answers = check_flag(record_answers, "record_answers")
        self._held: list[BaseMessage] | None = None
        self._guard = threading.Lock()
        self._writes = 0  # writes begun and ended: a read that spans one is not held
        self._writing = 0  # writes running now (a cancelled async one's thread too)

    # ---- reads: one implementation, run in a worker thread by the async twin ----
    def _read(self) -> list[BaseMessage]:
        with self._guard:
            held, seen = self._held if self.hold_reads else None, self._writes
        if held is None:
            held = self._fresh()
            with self._guard:
                if self.hold_reads and self._writes == seen and not self._writing:
                    self._held = held
        return list(held)

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """A write: what reads hold is forgotten when it begins and when it ends, and a read
        that overlaps it is not held, since it may have read the state before it."""
        with self._guard:
            self._held, self._writes, self._writing = None, self._writes + 1, self._writing + 1
        try:
            yield
        finally:
            with self._guard:
                self._held, self._writes, self._writing = None, self._writes + 1, self._writing - 1

    def _fresh(self) -> list[BaseMessage]:
        buffer = self.memory.get_buffer(self.session_id, user_id=self.user_id)
        if not self.include_memory:
            return from_stored_many(buffer)
        # a prompt rebuilt from the store (the memory before the turns) goes before a new turn:
        # without the tool calls no replayed result answers (a run stopped after its call), which
        # providers refuse, and continuing no stored response, which would send only what follows it
        query = _latest_user_text(buffer)
        if not query.strip():
            return from_stored_many(buffer, before_new_turn=True)
        ctx = self.memory.build_context(query, user_id=self.user_id, session_id=self.session_id,
                                        max_tokens=self.max_tokens)
        text = ctx.memory_text()
        lead: list[BaseMessage] = [SystemMessage(content=text)] if text else []
        return lead + from_stored_many(ctx.recent_messages, before_new_turn=True)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's token-bounded buffer (after the memory message if enabled)."""
        return self._read()

    async def aget_messages(self) -> list[BaseMessage]:
        return await call_in_thread(self.memory, self._read)

    # ---- writes: one implementation each, run in a worker thread by the async twin ----
    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store messages in one bulk write (one embedding batch, one transaction).

        Strict: a message the core would refuse raises its typed error and nothing is stored, since an explicit
        write is the caller's to split or clean; a history that ``record_answers`` (a turn recorded after the
        model answered) stores it changed and marked instead."""
        with self._write():
            if self.record_answers:
                record_turn(self.memory, messages, user_id=self.user_id, session_id=self.session_id)
                return
            rows = to_core_many(messages, max_metadata_bytes=self.memory.config.max_metadata_bytes)
            if rows:
                self.memory.add_many(rows, session_id=self.session_id, user_id=self.user_id)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await call_in_thread(self.memory, self.add_messages, messages)

    def clear(self) -> None:
        """Delete this session's messages (other sessions and users are untouched)."""
        with self._write():
            self.memory.clear_session(self.session_id, user_id=self.user_id)

    async def aclear(self) -> None:
        await call_in_thread(self.memory, self.clear)

    def end_session(self) -> Any:
        """Close the session in long-term memory: extract facts and compress it into an
        episode (with the memory's LLM, else by rules). Returns the episode, if any."""
        with self._write():
            return self.memory.end_session(self.session_id, user_id=self.user_id)

    async def aend_session(self) -> Any:
        return await call_in_thread(self.memory, self.end_session)

    def __repr__(self) -> str:
        return (f"TieredChatMessageHistory(user_id={self.user_id!r}, "
                f"session_id={self.session_id!r}, include_memory={self.include_memory})")


class _NotGiven(enum.Enum):
    SESSION_ID = "session_id"


def history_factory_config() -> list[ConfigurableFieldSpec]:
    """The ``history_factory_config`` for ``RunnableWithMessageHistory``: ``user_id`` and
    ``session_id``, read from ``config["configurable"]``."""
    return [
        ConfigurableFieldSpec(id="user_id", annotation=str, name="User ID",
                              description="Whose memory to use.", default="", is_shared=True),
        ConfigurableFieldSpec(id="session_id", annotation=str, name="Session ID",
                              description="The conversation.", default="", is_shared=True),
    ]


def history_factory(
    memory: TieredMemory, *, include_memory: bool = False, max_tokens: int | None = None,
) -> Callable[..., TieredChatMessageHistory]:
    """A ``get_session_history(user_id, session_id)`` for ``RunnableWithMessageHistory``: a
    new history for each call, whose reads agree until it writes (``hold_reads``), and which
    stores the turn the chain answered even where the core would refuse a message of it as it
    is (``record_answers``: changed, marked and logged). Give the chain
    ``history_factory_config=history_factory_config()`` too: by default it passes the session id
    alone, and the call raises :class:`~tiered_memory.errors.ConfigurationError` saying so.

    Example:
        >>> chain = RunnableWithMessageHistory(  # doctest: +SKIP
        ...     prompt | model, history_factory(memory),
        ...     input_messages_key="input", history_messages_key="history",
        ...     history_factory_config=history_factory_config())
        >>> chain.invoke({"input": "hi"},  # doctest: +SKIP
        ...     {"configurable": {"user_id": "u1", "session_id": "s1"}})
    """

    check_memory(memory)
    check_count(max_tokens, "max_tokens", minimum=1, optional=True)
    include_memory = check_flag(include_memory, "include_memory")

    def get_session_history(user_id: str,
                            session_id: str | _NotGiven = _NotGiven.SESSION_ID) -> TieredChatMessageHistory:
        if isinstance(session_id, _NotGiven):  # RunnableWithMessageHistory's default: its session_id, alone
            raise ConfigurationError(
                "history_factory's histories need a user_id and a session_id, and RunnableWithMessageHistory "
                "passed one id: pass history_factory_config=history_factory_config() to it, so that it reads "
                "both from config['configurable']")
        return TieredChatMessageHistory(memory, user_id=user_id, session_id=session_id,
                                        include_memory=include_memory, max_tokens=max_tokens, hold_reads=True,
                                        record_answers=True)

    return get_session_history
