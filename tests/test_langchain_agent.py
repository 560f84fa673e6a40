"""create_agent with TieredMemoryMiddleware and with TieredMemoryStore (fake tool-calling model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware, SummarizationMiddleware
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolCall, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_tiered_memory import TieredMemoryMiddleware, TieredMemoryStore
from langchain_tiered_memory.messages import from_stored_many
from langchain_tiered_memory.middleware import query_of, turn_to_record
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder
from tiered_memory import ConfigurationError, InvalidInputError, TieredMemory


@tool
def get_time() -> str:
    """The current time."""
    return "12:00"


def _call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def _seed(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "My favourite colour is teal."},
                     {"role": "assistant", "content": "Teal is lovely."}], session_id="old", user_id="u1")
    memory.add_many([{"role": "user", "content": "My favourite colour is crimson."}],
                    session_id="old", user_id="u2")


def _system_text(prompt: list[Any]) -> str:
    return "\n".join(m.text for m in prompt if isinstance(m, SystemMessage))


def test_middleware_injects_memory_and_records_the_turn_once(memory: TieredMemory) -> None:
    _seed(memory)
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[_call("get_time", {}, "c1"), AIMessage("Noon, and teal.")],
                              callbacks=[rec])
    agent = create_agent(model, [get_time], system_prompt="Be brief.",
                         middleware=[TieredMemoryMiddleware(memory)])
    out = agent.invoke({"messages": [HumanMessage("What is my favourite colour, and the time?")]},
                       context={"user_id": "u1", "session_id": "new"})
    assert out["messages"][-1].text == "Noon, and teal."
    assert len(rec.prompts) == 2
    for prompt in rec.prompts:
        system = _system_text(prompt)
        assert system.startswith("Be brief.")  # the agent's own prompt is kept first
        assert "favourite colour is teal" in system and "crimson" not in system
    # memory is not written into the agent's state
    assert not any("<memory" in m.text for m in out["messages"])
    stored = memory.get_messages("new", user_id="u1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[2].content == "12:00" and stored[3].content == "Noon, and teal."
    assert memory.get_messages("new", user_id="u2") == []


def test_middleware_keeps_the_agents_system_blocks_and_adds_memory_as_one_more(memory: TieredMemory) -> None:
    # an agent's system prompt of content blocks (Anthropic's cache_control on its rules) reaches
    # the model block for block, with its id; the memory is a text block after them
    _seed(memory)
    rec = PromptRecorder()
    system = SystemMessage(content=[{"type": "text", "text": "Rule one.", "cache_control": {"type": "ephemeral"}},
                                    {"type": "text", "text": "Rule two."}], id="sys", name="rules")
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Teal.")], callbacks=[rec]), [],
                         system_prompt=system, middleware=[TieredMemoryMiddleware(memory)])
    agent.invoke({"messages": [HumanMessage("What is my favourite colour?")]},
                 context={"user_id": "u1", "session_id": "new"})
    sent = rec.prompts[-1][0]
    assert isinstance(sent, SystemMessage) and (sent.id, sent.name) == ("sys", "rules")
    assert sent.content[:2] == system.content
    assert len(sent.content) == 3 and sent.content[2]["type"] == "text"  # type: ignore[index]
    assert "favourite colour is teal" in sent.content[2]["text"]  # type: ignore[index]


async def test_middleware_async_with_checkpointer_thread(memory: TieredMemory) -> None:
    _seed(memory)
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[AIMessage("Hello!"), AIMessage("You like teal.")], callbacks=[rec])
    agent = create_agent(model, [], middleware=[TieredMemoryMiddleware(memory, user_id="u1")],
                         checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": "t1"}}  # session_id falls back to the thread id
    await agent.ainvoke({"messages": [HumanMessage("hi")]}, cfg)
    await agent.ainvoke({"messages": [HumanMessage("Which colour do I like?")]}, cfg)
    assert "favourite colour is teal" in _system_text(rec.last)
    assert [m.text for m in rec.last if not isinstance(m, SystemMessage)] == [
        "hi", "Hello!", "Which colour do I like?"]
    stored = memory.get_messages("t1", user_id="u1")
    assert [m.content for m in stored] == ["hi", "Hello!", "Which colour do I like?", "You like teal."]


def test_middleware_include_recent_restores_the_session_without_checkpointer(memory: TieredMemory) -> None:
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[AIMessage("Noted."), AIMessage("Bilbao.")], callbacks=[rec])
    agent = create_agent(model, [], middleware=[
        TieredMemoryMiddleware(memory, user_id="u1", session_id="s1", include_recent=True)])
    agent.invoke({"messages": [HumanMessage("I was born in Bilbao.")]})
    agent.invoke({"messages": [HumanMessage("Where was I born?")]})
    assert [m.text for m in rec.last if not isinstance(m, SystemMessage)] == [
        "I was born in Bilbao.", "Noted.", "Where was I born?"]
    assert len(memory.get_messages("s1", user_id="u1")) == 4


def test_include_recent_replays_no_response_id_that_would_drop_the_memory(memory: TieredMemory) -> None:
    """Without a checkpointer, include_recent replays the session; a replayed AI message kept its
    ``resp_`` id, so ChatOpenAI(use_previous_response_id=True) sent only the new message, without
    the agent's system prompt and the memory in it, continuing a stored response instead."""
    import json

    from langchain_openai import ChatOpenAI

    from lc_support import responses_api_server

    _seed(memory)
    with responses_api_server() as (url, bodies):
        model = ChatOpenAI(model="gpt-4.1", base_url=url, api_key="not-needed", use_responses_api=True,
                           use_previous_response_id=True, max_retries=0)
        agent = create_agent(model, [], system_prompt="Be brief.", middleware=[
            TieredMemoryMiddleware(memory, user_id="u1", session_id="s1", include_recent=True)])
        agent.invoke({"messages": [HumanMessage("Hello!")]})
        agent.invoke({"messages": [HumanMessage("What is my favourite colour?")]})
    second = bodies[-1]
    assert "previous_response_id" not in second
    sent = json.dumps(second["input"])
    assert "Be brief." in sent and "teal" in sent and "Hello!" in sent


def test_middleware_needs_ids(memory: TieredMemory) -> None:
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("x")]), [],
                         middleware=[TieredMemoryMiddleware(memory)])
    with pytest.raises(ConfigurationError, match="user_id and a session_id"):
        agent.invoke({"messages": [HumanMessage("hi")]})


@pytest.mark.parametrize("context", [{"user_id": "", "session_id": "s"}, {"user_id": "u2", "session_id": ""}])
def test_middleware_refuses_an_empty_id_rather_than_use_the_default_users(memory: TieredMemory,
                                                                          context: dict[str, str]) -> None:
    # a run that names an empty user (a request whose user was not filled in) is refused:
    # neither the default user's memory nor another source's user stands in for it
    _seed(memory)
    rec = PromptRecorder()
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Teal.")], callbacks=[rec]), [],
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", session_id="s1")])
    with pytest.raises(InvalidInputError, match="must be a non-empty string"):
        agent.invoke({"messages": [HumanMessage("What is my favourite colour?")]}, context=context,
                     config={"configurable": {"user_id": "u1", "thread_id": "t1"}})
    assert rec.prompts == []  # no model call saw anyone's memory
    assert [s.session_id for u in ("u1", "u2") for s in memory.sessions(u)] == ["old", "old"]  # nothing stored


class _AppUser:
    """A request's user object, as a web framework hands it over (no __str__ of its own)."""


@pytest.mark.parametrize("context", [{"user_id": _AppUser(), "session_id": "s"},
                                     {"user_id": "u2", "session_id": ["s"]}])
def test_middleware_refuses_an_id_that_is_not_a_string_rather_than_its_str(memory: TieredMemory,
                                                                            context: dict[str, Any]) -> None:
    # str() of an object is its repr (a new bucket each process, or one shared by every object
    # whose str() is alike): refused with the typed error the other adapters give
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("x")]), [],
                         middleware=[TieredMemoryMiddleware(memory)])
    with pytest.raises(InvalidInputError, match="must be a str"):
        agent.invoke({"messages": [HumanMessage("hi")]}, context=context)
    assert memory.sessions("u2") == []


_SUMMARY = HumanMessage("Here is a summary of the conversation to date:\n\nSteps 1 and 2 ran.", id="sum",
                        additional_kwargs={"lc_source": "summarization"})
_NOTICE = HumanMessage("Background task t_42 finished.", id="n", additional_kwargs={"lc_source": "async_subagent"})
_CALL_X = _call("get_time", {}, "x").model_copy(update={"id": "x"})


_RESULT_X = ToolMessage("t", tool_call_id="x", id="5")


# mid: after a model call (the reply waits: the hooks of middleware listed before may still change it);
# final: at the end of the run
@pytest.mark.parametrize(("messages", "stored", "mid", "final"), [
    ([], set(), [], []),
    ([SystemMessage("s", id="0")], set(), [], []),
    ([HumanMessage("a", id="1"), AIMessage("b", id="2")], set(), ["1"], ["1", "2"]),
    ([HumanMessage("a", id="1"), AIMessage("b", id="2"), HumanMessage("c", id="3"),
      AIMessage("d", id="4")], {"1", "2"}, ["3"], ["3", "4"]),
    ([HumanMessage("c", id="3"), AIMessage("d", id="4"), _RESULT_X], {"3", "4"}, [], ["5"]),
    ([HumanMessage("c", id="3"), SystemMessage("s", id="9"), AIMessage("d", id="4")], set(), ["3"], ["3", "4"]),
    # an earlier reply, its call answered, is recorded at the next model call
    ([HumanMessage("c", id="3"), _CALL_X, _RESULT_X, AIMessage("d", id="4")], {"3"}, ["x", "5"], ["x", "5", "4"]),
    # a summary written by SummarizationMiddleware is not a user turn and is never recorded: the
    # turn is still the user's message on, or, once that was summarized away, what follows the summary
    ([HumanMessage("c", id="3"), _SUMMARY, AIMessage("d", id="4")], {"3"}, [], ["4"]),
    ([_SUMMARY, AIMessage("d", id="4"), _RESULT_X], {"4"}, [], ["5"]),
    # another message the harness added (lc_source) is recorded, but the user's message starts the turn
    ([HumanMessage("c", id="3"), _NOTICE, AIMessage("d", id="4")], set(), ["3", "n"], ["3", "n", "4"]),
    ([_NOTICE, AIMessage("d", id="4")], set(), ["n"], ["n", "4"]),
    # a tool call waits for its result (a reviewer may still replace it): the turn is recorded up to
    # it; at the end of the run, a call that got no result is recorded as the state keeps it
    ([HumanMessage("c", id="3"), _CALL_X], set(), ["3"], ["3", "x"]),
    ([HumanMessage("c", id="3"), _CALL_X, _NOTICE], {"3"}, [], ["x", "n"]),
])
def test_turn_to_record_table(messages: list[Any], stored: set[str], mid: list[str], final: list[str]) -> None:
    assert [m.id for m in turn_to_record(messages, stored)] == mid
    assert [m.id for m in turn_to_record(messages, stored, final=True)] == final


@tool
def step(n: int) -> str:
    """Run step n."""
    return f"step {n} done"


@pytest.mark.parametrize("include_recent", [False, True])
def test_with_summarization_middleware_the_summary_is_not_a_user_turn(memory: TieredMemory,
                                                                      include_recent: bool) -> None:
    # LangChain's SummarizationMiddleware replaces older messages with a HumanMessage marked
    # lc_source="summarization"; the session keeps the real turns, never that summary, recall still
    # happens, and include_recent does not bring back what was summarized
    memory.add_many([{"role": "user", "content": "My build server is called Orion."}], session_id="old", user_id="u")
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[_call("step", {"n": n}, f"c{n}") for n in (1, 2, 3)] + [AIMessage("Done.")],
                              callbacks=[rec])
    summarize = SummarizationMiddleware(model=FakeListChatModel(responses=["Steps ran."]),
                                        trigger=("messages", 4), keep=("messages", 2))
    agent = create_agent(model, [step], middleware=[
        summarize, TieredMemoryMiddleware(memory, include_recent=include_recent)])
    agent.invoke({"messages": [HumanMessage("Run the three steps on my build server.")]},
                 context={"user_id": "u", "session_id": "s"})
    stored = memory.get_messages("s", user_id="u")
    assert [m.role for m in stored] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert not any("summary" in m.content for m in stored)
    summarized = [p for p in rec.prompts if any("summary of the conversation" in m.text for m in p)]
    assert summarized  # the summarization did happen
    for prompt in summarized:
        assert "Orion" in _system_text(prompt)  # memory is still recalled once the request is summarized
        turns = [m for m in prompt if not isinstance(m, SystemMessage)]
        assert "summary of the conversation" in turns[0].text  # nothing summarized comes back


@pytest.mark.parametrize(("messages", "query"), [
    ([], ""),
    ([HumanMessage("Where is my order?"), AIMessage("Checking.")], "Where is my order?"),
    ([HumanMessage("Where is my order?"), _NOTICE], "Where is my order?"),  # a notice is not the request
    ([_SUMMARY, AIMessage("d")], _SUMMARY.text),  # the request was summarized: the summary holds it
])
def test_recall_is_for_what_the_user_wrote(messages: list[Any], query: str) -> None:
    assert query_of(messages) == query


# ---- the LangGraph store path ---------------------------------------------------
@dataclass
class UserContext:
    user_id: str


@tool
def remember(text: str, runtime: ToolRuntime[UserContext]) -> str:
    """Remember a fact about the user."""
    user = runtime.context.user_id
    runtime.store.put((user, "memories"), str(abs(hash(text))), {"text": text})
    return "saved"


@tool
def recall(query: str, runtime: ToolRuntime[UserContext]) -> str:
    """Recall facts about the user."""
    user = runtime.context.user_id
    hits = runtime.store.search((user, "memories"), query=query, limit=3)
    return "\n".join(h.value["text"] for h in hits) or "nothing"


def test_create_agent_with_store_across_restart(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("agent-store")
    model = ScriptedToolModel(responses=[
        _call("remember", {"text": "The user is allergic to peanuts."}, "r1"), AIMessage("Saved.")])
    agent = create_agent(model, [remember, recall], store=TieredMemoryStore(memory, fields=["text"]),
                         context_schema=UserContext)
    agent.invoke({"messages": [HumanMessage("Note that I'm allergic to peanuts.")]}, context=UserContext("u1"))
    memory.close()

    reopened = make_memory("agent-store")
    script = [_call("recall", {"query": "food allergies"}, "q1"), AIMessage("Avoid peanuts.")]
    store = TieredMemoryStore(reopened, fields=["text"])
    for user in ("u1", "u2"):
        agent = create_agent(ScriptedToolModel(responses=list(script)), [remember, recall], store=store,
                             context_schema=UserContext)
        out = agent.invoke({"messages": [HumanMessage("What am I allergic to?")]}, context=UserContext(user))
        tool_out = next(m for m in out["messages"] if isinstance(m, ToolMessage)).text
        if user == "u1":
            assert "allergic to peanuts" in tool_out
        else:
            assert tool_out == "nothing"  # another user's store items are never searched


@tool(return_direct=True)
def lookup_order(order_id: str) -> str:
    """Look up an order's status."""
    return f"Order {order_id} has shipped."


def test_middleware_records_a_turn_that_ends_in_a_direct_tool(memory: TieredMemory) -> None:
    model = ScriptedToolModel(responses=[_call("lookup_order", {"order_id": "A7"}, "o1")])
    agent = create_agent(model, [lookup_order], middleware=[TieredMemoryMiddleware(memory, user_id="u", session_id="s")])
    out = agent.invoke({"messages": [HumanMessage("Where is order A7?")]})
    assert out["messages"][-1].text == "Order A7 has shipped."
    stored = memory.get_messages("s", user_id="u")
    assert [m.role for m in stored] == ["user", "assistant", "tool"]
    assert stored[-1].content == "Order A7 has shipped."


@pytest.mark.parametrize("damaged", ["junk", {"data": "junk"}, {"type": "human", "data": {"id": 7}}, ["x"]])
def test_a_stored_message_with_damaged_langchain_metadata_never_breaks_a_run(memory: TieredMemory,
                                                                              damaged: Any) -> None:
    memory.add_many([{"role": "user", "content": "I keep bees.", "metadata": {"langchain": damaged}},
                     {"role": "assistant", "content": "How sweet."}], session_id="s1", user_id="u1")
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Still bees.")]), [], middleware=[
        TieredMemoryMiddleware(memory, user_id="u1", session_id="s1", include_recent=True)])
    agent.invoke({"messages": [HumanMessage("What do I keep?")]})
    assert [m.content for m in memory.get_messages("s1", user_id="u1")] == [
        "I keep bees.", "How sweet.", "What do I keep?", "Still bees."]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "300"}, "max_tokens"),
    ({"user_id": ""}, "user_id"), ({"session_id": 5}, "session_id"),
])
def test_bad_middleware_arguments_are_refused_when_it_is_built(memory: TieredMemory, kwargs: dict[str, Any],
                                                                match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        TieredMemoryMiddleware(memory, **kwargs)
    with pytest.raises(InvalidInputError, match="memory must be a TieredMemory"):
        TieredMemoryMiddleware("./memory")  # type: ignore[arg-type]


def test_a_photo_larger_than_the_metadata_limit_does_not_fail_the_run(memory: TieredMemory) -> None:
    photo = {"type": "image", "base64": "A" * (memory.config.max_metadata_bytes + 10_000), "mime_type": "image/png"}
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("A cat.")]), [],
                         middleware=[TieredMemoryMiddleware(memory)])
    out = agent.invoke({"messages": [HumanMessage(content=[{"type": "text", "text": "What is this?"}, photo])]},
                       context={"user_id": "u", "session_id": "s"})
    assert out["messages"][-1].text == "A cat."
    assert [m.content for m in memory.get_messages("s", user_id="u")] == ["What is this?", "A cat."]


@tool
def send_email(to: str) -> str:
    """Send an email."""
    return f"sent to {to}"


class _ReplacingEdits(HumanInTheLoopMiddleware):
    """HITL as LangChain 1.0 shipped it: a reviewer's edit replaces the call in the AIMessage
    (same message id), and that call is the one that runs."""

    @staticmethod
    def _process_decision(decision: Any, tool_call: ToolCall, config: Any) -> tuple[ToolCall | None, None]:
        if decision["type"] == "edit":
            edited = decision["edited_action"]
            return ToolCall(type="tool_call", name=edited["name"], args=edited["args"], id=tool_call["id"]), None
        return tool_call, None


def test_middleware_records_the_tool_call_a_reviewer_edited_not_the_one_proposed(memory: TieredMemory) -> None:
    model = ScriptedToolModel(responses=[_call("send_email", {"to": "boss@x"}, "e1"), AIMessage("Sent.")])
    review = _ReplacingEdits(interrupt_on={"send_email": True}, edit_notice=None)
    # listed after the reviewer, the memory's after_model runs before the review pauses the run
    agent = create_agent(model, [send_email], middleware=[review, TieredMemoryMiddleware(memory, user_id="u")],
                         checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t1"}}
    assert "__interrupt__" in agent.invoke({"messages": [HumanMessage("Email my boss.")]}, config)
    edit = {"type": "edit", "edited_action": {"name": "send_email", "args": {"to": "team@x"}}}
    out = agent.invoke(Command(resume={"decisions": [edit]}), config)
    assert next(m for m in out["messages"] if isinstance(m, ToolMessage)).text == "sent to team@x"
    stored = from_stored_many(memory.get_messages("t1", user_id="u"))
    assert [m.type for m in stored] == ["human", "ai", "tool", "ai"]
    assert isinstance(stored[1], AIMessage)
    assert [c["args"] for c in stored[1].tool_calls] == [{"to": "team@x"}]  # the call that ran
    assert not any("boss@x" in m.text for m in stored)
