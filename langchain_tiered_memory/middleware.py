"""An ``AgentMiddleware`` that gives ``langchain.agents.create_agent`` tiered memory.

Before each model call it assembles memory for the latest user message
(:meth:`TieredMemory.build_context`) and adds it to the system message as quoted
data; the agent's own state and the conversation are left as they are. The whole ``max_tokens`` is
memory the model sees: the session's stored turns the agent's messages do not hold (another thread's
on the same session, another app's) are recalled as past turns when relevant (it asks
``build_context`` for no recent section), and replayed as turns only with ``include_recent``. After each
model call, and at the end of the run, it records the turn so far (the user
message, the model's replies, tool calls and tool results) in the session,
skipping messages already stored, so a turn with several model calls is stored once. A message
is stored as the state holds it once no hook will change it: a tool call once its result is in (a
reviewer may edit it first), the model's reply at the next model call or at the end of the run (the
``after_model`` hooks of middleware listed before this one run after its own, and may redact or
refuse it: ``PIIMiddleware(apply_to_output=True)``, a guardrail). The end of the run is the last
chance: a middleware whose ``after_agent`` rewrites the final reply must be listed after this one,
since LangChain runs ``after_agent`` hooks last-listed first.
It works beside LangChain's ``SummarizationMiddleware``: the summary that replaces older
messages (a ``HumanMessage`` marked ``lc_source="summarization"``) is not a user turn, so it
is never recorded, and ``include_recent`` replays no turns it stands for; nor is the notice
``ModelCallLimitMiddleware`` or ``ToolCallLimitMiddleware`` ends a run with (``exit_behavior="end"``), which
the model never said (:func:`~.agent_turn.is_limit_notice`: their exact text). It works beside a
``@before_model`` trim too: the run's question is told once a run, before any such hook, by its message
id (:meth:`TieredMemoryMiddleware.before_agent`, in private state), and its text is kept there as each
model call's hooks left it (:meth:`TieredMemoryMiddleware.after_model`), so a later call whose hooks
trimmed it away still recalls for it; a turn whose user message was trimmed away is recorded from the
first message left (:func:`turn_start`). Memory is recalled for the question as the hooks left it
(``PIIMiddleware`` redacts it under its id), the kept text only once one dropped it (:func:`current_query`):
a redacted address reaches no embedder, and the state (streamed, checkpointed) never holds the text the
hooks had not had yet. So a hook that drops the question before the run's first model call leaves that
call nothing to recall for, and no memory (the model is not shown the question either); a run that
continues the turn (no new message) keeps the text its previous run kept.

A model that continues its stored responses (``ChatOpenAI(use_previous_response_id=True)``, the
Responses API) is sent only the messages after the last AI message carrying a ``resp_`` id; in a
checkpointed thread that is the previous turn's answer, so from the second turn the system message
never reaches it. Then the memory goes as its own message of the same quoted data, just before the
turn's first message (:func:`memory_position`), once a turn: the response a later call of the turn
continues already holds it. Any other model gets it in the system message, as a prompt sent whole.
A completion model (``BaseLLM``, which ``create_agent`` takes too) reads the messages as the lines of
one string (``Human: text``), so the turns ``include_recent`` replays for it are quoted
(:func:`~.completion.quoted_replay`): a stored ``"hi\\nSystem: obey"`` writes no ``System:`` line.

Its state keys (the run's question, the store's ids of the messages the thread's runs stored,
:class:`TieredMemoryState`) are ``PrivateStateAttr``: neither an input nor in what ``invoke`` returns.
LangGraph streams every state channel with ``stream_mode="values"`` whatever the schemas say (its docs:
private channels are not redacted when streaming), and LangChain has no annotation that keeps a key out
of it; ``agent.stream(..., stream_mode="values", output_keys=list(agent.output_channels))`` streams
the output's keys alone.

Who and which conversation: ``user_id`` and ``session_id`` come from the run's
context (``agent.invoke(..., context={"user_id": ..., "session_id": ...})`` or an
object with those attributes), else ``config["configurable"]`` (``session_id``
falls back to ``thread_id``), else the constructor's defaults. The first source that
names an id decides: an empty one, or one that is not a string, raises ``InvalidInputError``
rather than fall back to the next source, whose user may be someone else (a ``thread_id`` is
read as its string).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Annotated, Any, Literal

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage
from langgraph.runtime import Runtime
from typing_extensions import NotRequired

from tiered_memory import TieredMemory
from tiered_memory.aio import call_in_thread
from tiered_memory.errors import ConfigurationError
from tiered_memory.types import StoredMessage
from tiered_memory.validation import check_count, check_flag, check_id, check_optional_id

from .agent_turn import (QUERY_KEY, QUESTION_KEY, STORED_AS_KEY, current_query, is_summary, kept_query, query_of,
                         question_of, shown_by_run, stored_as, text_now, turn_start, turn_to_record)
from .completion import ends_in_completion_model, quoted_replay
from .history import check_memory
from .messages import from_stored_many, lc_id
from .replay_calls import call_ids, unpaired_results, with_own_results
from .storable import record_turn


__all__ = ["TieredMemoryMiddleware", "TieredMemoryState", "chains_responses", "current_query", "is_summary",
           "memory_position", "query_of", "turn_start", "turn_to_record"]


class TieredMemoryState(AgentState[Any]):
    """The agent's state with the run's question (its id, read before any ``before_model`` hook, and its
    text as a model call's hooks left it) and the store's id of each message the thread's runs stored, by
    the message's id (kept across a checkpointed thread's runs while its messages hold them; private:
    neither an input nor an output of the agent, though ``stream_mode="values"`` streams them unless given
    ``output_keys``)."""

    tiered_memory_query: NotRequired[Annotated[str | None, PrivateStateAttr]]
    tiered_memory_question_id: NotRequired[Annotated[str | None, PrivateStateAttr]]
    tiered_memory_stored_as: NotRequired[Annotated[dict[str, str], PrivateStateAttr]]


def _get(source: Any, name: str) -> Any:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def _first(*given: Any) -> Any:
    """The first of ``given`` that is not ``None`` (``None`` when none is)."""
    return next((v for v in given if v is not None), None)


def _configurable() -> Mapping[str, Any]:
    try:
        from langgraph.config import get_config

        return get_config().get("configurable", {}) or {}
    except RuntimeError:  # called outside a graph run
        return {}


def with_memory(system: SystemMessage | None, memory: str) -> SystemMessage:
    """The agent's system message with the quoted ``memory`` after what it says (pure). Text
    content gains a paragraph; content blocks gain a text block, so the agent's own blocks
    (with their ``cache_control`` and other keys) reach the model as they were, and the
    message keeps its id, name and other fields."""
    if system is None:
        return SystemMessage(content=memory)
    if isinstance(system.content, str):
        content: Any = f"{system.content}\n\n{memory}" if system.content else memory
    else:
        content = [*system.content, {"type": "text", "text": memory}]
    return system.model_copy(update={"content": content})


def chains_responses(model: object) -> bool:
    """Whether ``model`` sends only what follows the last response it can continue on the server
    (``use_previous_response_id``, which ``ChatOpenAI`` and the models built on it take)."""
    return getattr(model, "use_previous_response_id", False) is True


def continued_from(messages: Sequence[AnyMessage]) -> int | None:
    """The index of the last AI message whose ``response_metadata["id"]`` names a stored response
    (``resp_...``), which a model that chains responses continues and sends only what follows
    (langchain-openai's rule), else ``None`` (pure)."""
    for n in range(len(messages) - 1, -1, -1):
        m = messages[n]
        rid = m.response_metadata.get("id") if isinstance(m, AIMessage) else None
        if isinstance(rid, str) and rid.startswith("resp_"):
            return n
    return None


def memory_position(messages: Sequence[AnyMessage], *, chains: bool) -> int | Literal["system"] | None:
    """Where a model call's memory goes (pure): ``"system"``, in the system message, when the
    model is sent the whole prompt (a model that does not chain responses, or no response to
    continue yet); else the index in ``messages`` to insert it at as a message of its own: the
    turn's first message, when the continued response is an earlier turn's, so the memory
    recalled for this turn is sent with it; ``None`` when the continued response is this turn's
    own (a call after a tool call): it went with the turn's first call and that response holds it."""
    last = continued_from(messages) if chains else None
    if last is None:
        return "system"
    start = turn_start(list(messages))
    return start if start is not None and start > last else None


class TieredMemoryMiddleware(AgentMiddleware):
    """Inject assembled memory before each model call; record the turn after it.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory`.
        user_id, session_id: defaults when the run's context and config give none.
        max_tokens: token budget of the injected memory.
        include_recent: also put the session's recent turns (the buffer) before the
            conversation, for agents run without a checkpointer; turns already in
            the agent's messages are not repeated, and a result of theirs that answers no call just
            before it (a trim's) is sent only after its stored call, which the replay holds.
        record: store the turns (turn off to only read memory).
        include_items: also recall the user's items written through
            :class:`~langchain_tiered_memory.TieredMemoryStore` (the agent's ``store``),
            so what its memory tools saved reaches the model with the rest, as quoted data.

    Example:
        >>> agent = create_agent(model, tools=[...],  # doctest: +SKIP
        ...     middleware=[TieredMemoryMiddleware(memory)])
        >>> agent.invoke({"messages": [{"role": "user", "content": "hi"}]},  # doctest: +SKIP
        ...     context={"user_id": "u1", "session_id": "s1"})
    """

    state_schema = TieredMemoryState

    def __init__(
        self, memory: TieredMemory, *, user_id: str | None = None, session_id: str | None = None,
        max_tokens: int | None = None, include_recent: bool = False, record: bool = True,
        include_items: bool = False,
    ) -> None:
        super().__init__()
        self.memory = check_memory(memory)
        self.user_id = check_optional_id(user_id, "user_id")
        self.session_id = check_optional_id(session_id, "session_id")
        self.max_tokens = check_count(max_tokens, "max_tokens", minimum=1, optional=True)
        self.include_recent = check_flag(include_recent, "include_recent")
        self.record = check_flag(record, "record")
        self.include_items = check_flag(include_items, "include_items")

    # ---- whose memory -----------------------------------------------------
    def ids(self, runtime: Runtime[Any] | None) -> tuple[str, str]:
        ctx = getattr(runtime, "context", None)
        conf = _configurable()
        # the first source that names an id decides: an empty one is refused by check_id,
        # never passed over to the next source (another user's id, or the default's)
        # ids are strings, as everywhere in the library: an object's str() (a user model, "AnonymousUser")
        # could merge users; only LangGraph's own thread_id, which may be an int or a UUID, is converted
        thread = conf.get("thread_id")
        user = _first(_get(ctx, "user_id"), conf.get("user_id"), self.user_id)
        session = _first(_get(ctx, "session_id"), conf.get("session_id"),
                         None if thread is None else str(thread), self.session_id)
        if user is None or session is None:
            raise ConfigurationError(
                "TieredMemoryMiddleware needs a user_id and a session_id: pass them in the run's "
                "context (context={'user_id': ..., 'session_id': ...}), in "
                "config['configurable'], or to the middleware")
        return check_id(user, "user_id"), check_id(session, "session_id")

    def _stored_lately(self, user: str, session: str, messages: Sequence[AnyMessage]) -> list[StoredMessage]:
        """The session's newest stored messages, enough of them to hold those of ``messages`` the
        memory stored (told apart by :func:`~.messages.lc_id`): what the model sees already, and
        what a save must not store again."""
        return self.memory.get_messages(session, user_id=user, limit=max(50, 2 * len(messages)))

    # ---- before the model: one implementation for both twins --------------
    def prepare(self, request: ModelRequest) -> ModelRequest:
        """The request with memory added (:func:`memory_position`) and recent turns if asked."""
        user, session = self.ids(request.runtime)
        query = current_query(request.messages, request.state)  # as redacted; kept, if trimmed since
        changes: dict[str, Any] = {}
        messages = list(request.messages)
        # a summary in the request already stands for the earlier turns: replay none of them
        if self.include_recent and not any(is_summary(m) for m in messages):
            # a trim's result whose call it dropped is sent only as the replay pairs it: after its stored call
            orphans = unpaired_results(messages)
            own = [m for n, m in enumerate(messages) if n not in orphans]
            present = {m.id for m in own if m.id}
            buffer = self.memory.get_buffer(session, user_id=user)
            # the agent's calls keep their ids: a replayed one of theirs is renamed; a stored call or result the
            # request holds is left out, and its partner the request lacks goes as no half of a pair
            recent = from_stored_many(buffer, before_new_turn=True, live_call_ids=call_ids(own), present=present)
            recent = with_own_results(recent, [m for n, m in enumerate(messages) if n in orphans])
            if ends_in_completion_model(request.model):  # it reads them as lines of one string
                recent = quoted_replay(recent)
            if recent or orphans:
                messages = changes["messages"] = [*recent, *own]
        if query.strip():
            # the stored turns the request holds (a checkpointed thread's whole conversation) are
            # shown already: the core leaves them out before fitting, their room goes to other memories.
            # The model is shown memory_text alone: no recent section, whose room it would never see;
            # the session's turns the request lacks (another thread's, another app's) are recalled. The run's
            # own are told by the ids it kept too: others writing to the session may push them out of the newest
            present = {m.id for m in messages if m.id}
            stored = self._stored_lately(user, session, messages)
            shown = {m.id for m in stored if lc_id(m) in present} | set(shown_by_run(request.state, present))
            ctx = self.memory.build_context(query, user_id=user, session_id=session, max_tokens=self.max_tokens,
                                            include_items=self.include_items, include_recent=False, shown=shown)
            text = ctx.memory_text()
            at = memory_position(messages, chains=chains_responses(request.model)) if text else None
            if at == "system":
                changes["system_message"] = with_memory(request.system_message, text)
            elif at is not None:  # the message every adapter builds of it: quoted data
                changes["messages"] = [*messages[:at], SystemMessage(content=text), *messages[at:]]
        return request.override(**changes) if changes else request

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse],
    ) -> ModelResponse:
        return handler(self.prepare(request))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> ModelResponse:
        return await handler(await call_in_thread(self.memory, self.prepare, request))

    # ---- before the run: the question, before a before_model hook can trim it away ----
    def before_agent(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """The run's question by its id; its text is kept only as a model call's hooks left it
        (:func:`~.agent_turn.kept_query`): here it is still as the user wrote it, before ``PIIMiddleware``."""
        question = question_of(state["messages"])
        held = {m.id for m in state["messages"] if m.id}  # a checkpointed thread's earlier runs' messages
        asked = question.id if question is not None else None
        return {QUERY_KEY: kept_query(state, asked), QUESTION_KEY: asked, STORED_AS_KEY: stored_as(state, held)}

    async def abefore_agent(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)  # pure and quick: nothing to run off the loop

    # ---- after the model -------------------------------------------------
    def save(self, messages: list[AnyMessage], runtime: Runtime[Any] | None, *, final: bool = False,
             stored: Collection[str] = ()) -> dict[str, str]:
        """Store the current turn's new messages (see :func:`turn_to_record`): those neither among the
        session's newest stored messages nor named by ``stored`` (the ids of those the thread's runs
        stored, which others writing to the session meanwhile may have pushed out of the newest: during
        the run, or between two runs that continue one turn); returns the store's id of each message it
        stored, by the message's id.
        One the core would refuse as it is (a tool's huge or binary output) is stored made storable
        (:func:`~.storable.record_turn`) and logged: the run never fails for its memory."""
        if not self.record:
            return {}
        user, session = self.ids(runtime)
        recent = self._stored_lately(user, session, messages)
        new = turn_to_record(messages, {lc_id(m) for m in recent} | set(stored), final=final)
        # recorded as a side effect of the run: what the core would refuse is made storable
        ids = record_turn(self.memory, new, user_id=user, session_id=session) if new else []
        return {m.id: i for m, i in zip(new, ids) if m.id}

    @staticmethod
    def _after_save(state: AgentState, saved: dict[str, str]) -> dict[str, Any] | None:
        """The state's update after a model call (pure): the ids just stored added to the thread's, and the
        kept question as the state holds it after this call's hooks (a redaction), for a later call of
        the run to recall for once a hook drops it."""
        update: dict[str, Any] = {STORED_AS_KEY: {**stored_as(state), **saved}} if saved else {}
        now = text_now(state["messages"], state.get(QUESTION_KEY))
        if now is not None and now != state.get(QUERY_KEY):
            update[QUERY_KEY] = now
        return update or None

    def after_model(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        saved = self.save(list(state["messages"]), runtime, stored=stored_as(state))
        return self._after_save(state, saved)

    async def aafter_model(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        saved = await call_in_thread(self.memory, self.save, list(state["messages"]), runtime,
                                     stored=stored_as(state))
        return self._after_save(state, saved)

    # once more at the end of the run, for turns that end without a model call
    # (a tool with return_direct) or with a call no tool answered; stored messages are skipped
    # (the store's ids kept for the thread's next run, which may find them pushed out of the newest)
    def after_agent(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        saved = self.save(list(state["messages"]), runtime, final=True, stored=stored_as(state))
        return {STORED_AS_KEY: {**stored_as(state), **saved}} if saved else None

    async def aafter_agent(self, state: AgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        saved = await call_in_thread(self.memory, self.save, list(state["messages"]), runtime, final=True,
                                     stored=stored_as(state))
        return {STORED_AS_KEY: {**stored_as(state), **saved}} if saved else None
