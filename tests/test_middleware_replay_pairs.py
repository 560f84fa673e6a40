"""``TieredMemoryMiddleware(include_recent=True)`` never sends half of a stored tool call and its result.

The replay leaves out the stored messages the request holds already. When the request holds only one
of a call and its result under the stored message's id, the other must not stay in the replay as it
was: a ``ToolMessage`` no call is right before, or a call no result follows, which OpenAI and
Anthropic refuse ("messages with role 'tool' must be a response to a preceding message with
'tool_calls'"). A real run gets there by LangGraph's time travel: replaying a checkpointed thread from
the checkpoint before its tools ran runs the tool again, so the request holds the stored call (same
message id) and a new result (a new id), while the stored result of the first run is in the session;
and by a trim that drops older messages (``RemoveMessage``; LangChain's ``trim_messages`` without
``start_on``), which leaves the request a stored result whose call only the replay holds: the request sends
it only right after that call, as the replay places it (the state keeps the trim's messages). Each captured
model request is checked: every ``ToolMessage`` in the run of results right after the ``AIMessage``
whose call it answers, every call answered before the next message that is no result, and no call id
twice."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest

from langchain.agents import create_agent
from langchain.agents.middleware import before_model
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, ToolMessage, trim_messages
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.messages import from_stored_many, to_core
from langchain_tiered_memory.replay_calls import unpaired_results, with_own_results
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder, get_time, keep_last_three, time_call
from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.types import StoredMessage

CONTEXT = {"user_id": "u1", "session_id": "s1"}


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    """The pairing is the point, not what is recalled: the static embedder keeps each run fast."""
    return make_memory(embedder=StaticEmbedder())


def pairing_problems(messages: Sequence[BaseMessage]) -> list[str]:
    """What a provider refuses in ``messages`` (pure): a result not in the run of results right after
    the ``AIMessage`` with its call (or answering it twice), a call with no result before the next
    message that is no result."""
    problems: list[str] = []
    waiting: set[str] = set()  # the last AIMessage's calls no result answered yet
    for m in messages:
        if isinstance(m, ToolMessage):
            if m.tool_call_id not in waiting:
                problems.append(f"result {m.tool_call_id!r} ({m.text!r}) answers no call just before it")
            waiting.discard(m.tool_call_id)
            continue
        if waiting:
            problems.append(f"calls {sorted(waiting)} unanswered before a {m.type} message ({m.text!r})")
        waiting = {str(c["id"]) for c in m.tool_calls} if isinstance(m, AIMessage) else set()
    if waiting:
        problems.append(f"calls {sorted(waiting)} unanswered at the end")
    return problems


def test_pairing_problems_finds_each_break() -> None:
    call, result = time_call("c1"), ToolMessage("12:00", tool_call_id="c1")
    assert pairing_problems([HumanMessage("q"), call, result, AIMessage("a")]) == []
    assert len(pairing_problems([HumanMessage("q"), result, AIMessage("a")])) == 1
    assert len(pairing_problems([call, HumanMessage("q"), result])) == 2
    assert len(pairing_problems([call, result, result])) == 1
    assert len(pairing_problems([call])) == 1


def _rows(*messages: BaseMessage) -> list[StoredMessage]:
    return [StoredMessage(id=f"row{n}", user_id="u1", session_id="s1", timestamp=float(n), seq=n, **{
        k: v for k, v in to_core(m).items() if k in ("role", "content", "metadata")}) for n, m in enumerate(messages)]


def _described(m: BaseMessage) -> str:
    """The message's type and its calls' ids, else its text."""
    calls = [str(c["id"]) for c in m.tool_calls] if isinstance(m, AIMessage) else []
    return " ".join([m.type, *calls] if calls else [m.type, m.tool_call_id if isinstance(m, ToolMessage) else m.text])


_TWO_CALLS = AIMessage("", id="ai", tool_calls=[{"name": "get_time", "args": {}, "id": c, "type": "tool_call"}
                                                 for c in ("c1", "c2")])


@pytest.mark.parametrize(("present", "sent"), [
    ((), ["human q", "ai c1 c2", "tool c1", "tool c2", "ai Noon."]),
    (("q",), ["ai c1 c2", "tool c1", "tool c2", "ai Noon."]),  # a pair the prompt lacks whole goes whole
    (("ai",), ["human q", 'human [stored tool result] "12:00"', 'human [stored tool result] "noon"', "ai Noon."]),
    (("t1",), ["human q", "ai c2", "tool c2", "ai Noon."]),  # the call whose result the prompt holds is left out
    (("t1", "t2"), ["human q", "ai [tool calls] get_time({}); get_time({})", "ai Noon."]),  # its text names them
    (("ai", "t1", "t2"), ["human q", "ai Noon."]),
])
def test_the_replay_pairs_what_the_prompt_holds_as_left_out(present: tuple[str, ...], sent: list[str]) -> None:
    rows = _rows(HumanMessage("q", id="q"), _TWO_CALLS, ToolMessage("12:00", tool_call_id="c1", id="t1"),
                 ToolMessage("noon", tool_call_id="c2", id="t2"), AIMessage("Noon.", id="a"))
    replay = from_stored_many(rows, before_new_turn=True, present=set(present))
    assert pairing_problems(replay) == []
    assert [_described(m) for m in replay] == sent


def test_a_thread_replayed_from_before_its_tools_gets_no_result_without_its_call(memory: TieredMemory) -> None:
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[time_call("c1"), AIMessage("Noon."), AIMessage("Still noon.")],
                              callbacks=[rec])
    agent = create_agent(model, [get_time], checkpointer=InMemorySaver(),
                         middleware=[TieredMemoryMiddleware(memory, include_recent=True)])
    cfg: Any = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [HumanMessage("What time is it?")]}, cfg, context=CONTEXT)
    stored = memory.get_messages("s1", user_id="u1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    # LangGraph's time travel: replay from the checkpoint whose next step runs the tools
    before_tools = next(s for s in agent.get_state_history(cfg) if s.next == ("tools",))
    out = agent.invoke(None, before_tools.config, context=CONTEXT)
    assert out["messages"][-1].text == "Still noon."
    assert len(rec.prompts) == 3
    replayed = rec.last
    assert [pairing_problems(p) for p in rec.prompts] == [[], [], []], replayed
    # the stored result the request replaced went as quoted data; the request's own pair is whole
    assert replayed[-1].tool_call_id == "c1" and replayed[-2].tool_calls[0]["id"] == "c1"  # type: ignore[attr-defined]
    assert any(isinstance(m, HumanMessage) and "[stored tool result]" in m.text for m in replayed)


@before_model
def keep_first_and_last_three(state: Any, runtime: Any) -> dict[str, Any] | None:
    """The trim LangChain's short-term memory docs show: the first message and the last few."""
    messages = state["messages"]
    return None if len(messages) <= 4 else {
        "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), messages[0], *messages[-3:]]}


@before_model
def trimmed_by_langchain(state: Any, runtime: Any) -> dict[str, Any] | None:
    """LangChain's ``trim_messages`` keeping the last three messages (no ``start_on``): it keeps a result
    whose call it drops."""
    kept = trim_messages(state["messages"], strategy="last", token_counter=len, max_tokens=3)
    return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *kept]}


def ids_sent_twice(messages: Sequence[BaseMessage]) -> list[str]:
    """The tool-call ids more than one call in ``messages`` has (pure)."""
    ids = [str(c["id"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    return sorted({i for i in ids if ids.count(i) > 1})


@pytest.mark.parametrize("trim", [keep_last_three, trimmed_by_langchain, keep_first_and_last_three],
                         ids=["last_three", "trim_messages", "first_and_last_three"])
def test_a_trim_that_keeps_a_result_without_its_call_sends_the_pair_whole(memory: TieredMemory, trim: Any) -> None:
    """A trim left the last call's request a result whose call it dropped (the stored call is in the
    replay): the request sends no orphan result; the result goes right after its stored call, whole. The
    agent's state keeps the trim's messages as they were."""
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[time_call("c1"), time_call("c2"), AIMessage("Noon.")], callbacks=[rec])
    agent = create_agent(model, [get_time], middleware=[trim, TieredMemoryMiddleware(memory, include_recent=True)])
    out = agent.invoke({"messages": [HumanMessage("What time is it?")]}, context=CONTEXT)
    assert out["messages"][-1].text == "Noon."
    assert len(rec.prompts) == 3
    # the trim's own break, in the state the middleware leaves alone
    assert pairing_problems(out["messages"][:-1]) == ["result 'c1' ('12:00') answers no call just before it"]
    assert [pairing_problems(p) for p in rec.prompts] == [[], [], []], rec.last
    assert [ids_sent_twice(p) for p in rec.prompts] == [[], [], []], rec.last
    pairs = [(m.tool_calls[0]["id"], r.text) for m, r in zip(rec.last, rec.last[1:])
             if isinstance(m, AIMessage) and m.tool_calls and isinstance(r, ToolMessage)]
    assert pairs == [("c1", "12:00"), ("c2", "12:00")]
    assert not any("[stored tool" in m.text for m in rec.last)



def test_a_trimmed_result_paired_in_the_replay_goes_under_the_renamed_id(memory: TieredMemory) -> None:
    """Kimi's server numbers each turn's calls (``functions.get_time:0``), so the live call may have the id of
    the stored call the trim dropped: the replayed call is renamed, and the result sent after it with it."""
    rec = PromptRecorder()
    kimi = "functions.get_time:0"
    model = ScriptedToolModel(responses=[time_call(kimi), time_call(kimi), AIMessage("Noon.")], callbacks=[rec])
    agent = create_agent(model, [get_time], middleware=[
        trimmed_by_langchain, TieredMemoryMiddleware(memory, include_recent=True)])
    agent.invoke({"messages": [HumanMessage("What time is it?")]}, context=CONTEXT)
    assert [pairing_problems(p) for p in rec.prompts] == [[], [], []], rec.last
    assert [ids_sent_twice(p) for p in rec.prompts] == [[], [], []], rec.last
    assert [_described(m) for m in rec.last] == ["human What time is it?", "ai functions.get_time:1",
                                                 "tool functions.get_time:1", "ai functions.get_time:0",
                                                 "tool functions.get_time:0"]

def test_a_result_no_stored_call_answers_is_left_out_of_the_request(memory: TieredMemory) -> None:
    """Nothing stored to pair it with (``record=False``): the trim's orphan result is left out of what is sent,
    never out of the agent's state."""
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[time_call("c1"), time_call("c2"), AIMessage("Noon.")], callbacks=[rec])
    agent = create_agent(model, [get_time], middleware=[
        trimmed_by_langchain, TieredMemoryMiddleware(memory, include_recent=True, record=False)])
    out = agent.invoke({"messages": [HumanMessage("What time is it?")]}, context=CONTEXT)
    assert [m.type for m in out["messages"]] == ["tool", "ai", "tool", "ai"]  # the trim's, kept
    assert [pairing_problems(p) for p in rec.prompts] == [[], [], []], rec.last
    assert [_described(m) for m in rec.last] == ["ai c2", "tool c2"]


@pytest.mark.parametrize(("messages", "unpaired"), [
    ([HumanMessage("q"), time_call("c1"), ToolMessage("", tool_call_id="c1")], set()),
    ([ToolMessage("", tool_call_id="c1"), time_call("c2"), ToolMessage("", tool_call_id="c2")], {0}),
    ([HumanMessage("q"), ToolMessage("", tool_call_id="c1"), time_call("c2")], {1}),
    ([time_call("c1"), HumanMessage("q"), ToolMessage("", tool_call_id="c1")], {2}),  # not right after its call
    ([time_call("c1"), ToolMessage("", tool_call_id="c1"), ToolMessage("", tool_call_id="c1")], {2}),  # twice
    ([_TWO_CALLS, ToolMessage("", tool_call_id="c2"), ToolMessage("", tool_call_id="c1")], set()),
])
def test_unpaired_results(messages: list[BaseMessage], unpaired: set[int]) -> None:
    assert unpaired_results(messages) == unpaired
    assert len(pairing_problems([m for n, m in enumerate(messages) if n in unpaired])) == len(unpaired)


def test_a_paired_result_goes_as_the_agent_holds_it_under_the_replayed_id() -> None:
    replay = [time_call("c1-2"), ToolMessage("[shortened]", id="t1", tool_call_id="c1-2"),
              HumanMessage('[stored tool result] "x"', id="t2")]
    own = [ToolMessage("the whole output", id="t1", tool_call_id="c1"), ToolMessage("x", id="t2", tool_call_id="c9")]
    sent = with_own_results(replay, own)
    assert [(m.type, m.text) for m in sent] == [("ai", ""), ("tool", "the whole output"),
                                                ("human", '[stored tool result] "x"')]
    assert sent[1].tool_call_id == "c1-2" and own[0].tool_call_id == "c1"  # type: ignore[attr-defined]
