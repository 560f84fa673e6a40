"""create_agent with TieredMemoryMiddleware in a checkpointed thread: the agent's state holds the
whole conversation, so the memory recalls none of it again (``build_context(shown=...)``), nor a
twin of it (the same text stored again), and the room those turns would take goes to other
memories. The session's turns the state does not hold (another thread's, another app's) are no
recent section the model never sees: past turns to recall, like any other. And what they add to the
session while a run goes on never makes the run store its own turn twice, nor recall it into its own
prompt. The middleware's state keys stay out of the agent's output (and, given ``output_keys``, out of
what ``stream_mode="values"`` streams)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from typing_extensions import Annotated, NotRequired

from langchain_tiered_memory import TieredMemoryMiddleware
from langchain_tiered_memory.agent_turn import shown_by_run
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder
from test_injection import decoded_items, parse_memory
from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.context.render import OPENING

TOPICS = ["tides", "volcanoes", "rainbows", "glaciers", "comets", "owls", "bees", "jazz", "chess", "bread"] * 3


def test_a_checkpointed_thread_is_not_recalled_into_its_own_prompt(memory: TieredMemory) -> None:
    memory.add_many([m for n, topic in enumerate(TOPICS) for m in (
        {"role": "user", "content": f"Old{n}: what about tides and {topic}?"},
        {"role": "assistant", "content": f"Old answer {n}: tides and {topic} go back a long way."})],
        session_id="last-week", user_id="u1")
    rec = PromptRecorder()
    replies = [AIMessage(f"A{n}: tides and {topic} have a long history.") for n, topic in enumerate(TOPICS)]
    model = ScriptedToolModel(responses=[*replies, AIMessage("Done.")], callbacks=[rec])
    agent = create_agent(model, [], system_prompt="Be brief.", checkpointer=InMemorySaver(),
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", max_tokens=800)])
    cfg = {"configurable": {"thread_id": "t1"}}
    for n, topic in enumerate(TOPICS):
        agent.invoke({"messages": [HumanMessage(f"Q{n}: tell me about tides and {topic}.")]}, cfg)
    agent.invoke({"messages": [HumanMessage("Tell me about tides again.")]}, cfg)
    prompt = rec.last
    conversation = {m.text for m in prompt if not isinstance(m, SystemMessage)}
    assert len(conversation) == 2 * len(TOPICS) + 1  # the state holds the whole thread
    system = "\n".join(m.text for m in prompt if isinstance(m, SystemMessage))
    recalled = decoded_items(parse_memory(system[system.index(OPENING):]))
    assert not set(recalled) & conversation  # nothing the model sees in the thread is repeated
    assert sum(r.startswith("Old") for r in recalled) >= 10  # the room went to last week's turns


def _recalled(rec: PromptRecorder) -> tuple[set[str], list[str], str]:
    """The last prompt's conversation (its texts), the memory items recalled, and the memory block."""
    prompt = rec.last
    system = "\n".join(m.text for m in prompt if isinstance(m, SystemMessage))
    block = system[system.index(OPENING):] if OPENING in system else ""
    return ({m.text for m in prompt if not isinstance(m, SystemMessage)},
            decoded_items(parse_memory(block)) if block else [], block)


def test_the_sessions_turns_outside_the_thread_take_no_unseen_room(make_memory: Callable[..., TieredMemory]) -> None:
    """A new thread on a session another app (or thread) stored turns in: the core spent up to
    BudgetConfig.buffer_share of max_tokens on those turns as a recent section, which the middleware
    never showed; they were left out of recall too. Now the whole budget is memory the model sees,
    and the session's earlier turns are recalled as past turns when they are relevant."""
    memory = make_memory(embedder=StaticEmbedder())
    memory.add_many([m for n, topic in enumerate(TOPICS) for m in (
        {"role": "user", "content": f"Old{n}: what about tides and {topic}?"},
        {"role": "assistant", "content": f"Old answer {n}: tides and {topic} go back a long way."})],
        session_id="last-week", user_id="u1")
    memory.add_many([m for n, topic in enumerate(TOPICS[:10]) for m in (
        {"role": "user", "content": f"Web{n}: do tides reach the {topic} museum?"},
        {"role": "assistant", "content": f"Web answer {n}: the {topic} museum floods at spring tides."})],
        session_id="s1", user_id="u1")  # the web chat's turns of the same session
    rec = PromptRecorder()
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Done.")], callbacks=[rec]), [],
                         checkpointer=InMemorySaver(),
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", max_tokens=400)])
    agent.invoke({"messages": [HumanMessage("Tell me about tides and the museum again.")]},
                 {"configurable": {"thread_id": "new-thread", "session_id": "s1"}})
    _, recalled, block = _recalled(rec)
    assert any(r.startswith("Web") for r in recalled)  # the session's turns, recalled as data
    assert 0.85 * 400 <= memory.count_tokens(block) <= 400  # the budget went to what the model sees


def test_a_twin_of_a_turn_in_the_thread_is_not_recalled(make_memory: Callable[..., TieredMemory]) -> None:
    """What the user says in the thread was stored before by another call (another app, an import):
    the thread's message is a duplicate of it under another id, and the first came back as recalled
    memory beside the turn the model sees. Now it is left out; a turn in other words is not."""
    memory = make_memory(embedder=StaticEmbedder())
    said = "My locker code is 4512, the one by the pool."
    memory.add_many([{"role": "user", "content": said},
                     {"role": "user", "content": "My bike lock code is 1234, the one by the gate."}],
                    session_id="imported", user_id="u1")
    rec = PromptRecorder()
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Noted."), AIMessage("4512.")], callbacks=[rec]),
                         [], checkpointer=InMemorySaver(),
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", max_tokens=400)])
    cfg = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [HumanMessage(said)]}, cfg)
    agent.invoke({"messages": [HumanMessage("What is my locker code?")]}, cfg)
    conversation, recalled, _ = _recalled(rec)
    assert said in conversation and "My bike lock code is 1234, the one by the gate." in recalled
    assert not set(recalled) & conversation  # the model reads the locker code once


def _owls_with_a_sub_agent(memory: TieredMemory, *callbacks: Any, **options: Any) -> None:
    """One run on session s1 whose tool is a sub-agent writing 60 turns to the same session."""

    @tool
    def research(topic: str) -> str:
        """Research the topic (a sub-agent that records its own long turn in the same session)."""
        memory.add_many([{"role": "user" if n % 2 == 0 else "assistant", "content": f"step {n} on {topic}"}
                         for n in range(60)], session_id="s1", user_id="u1")
        return "found it"

    call = AIMessage("", tool_calls=[{"name": "research", "args": {"topic": "owls"}, "id": "c1", "type": "tool_call"}])
    agent = create_agent(ScriptedToolModel(responses=[call, AIMessage("Owls, then.")], callbacks=list(callbacks)),
                         [research], middleware=[TieredMemoryMiddleware(memory, user_id="u1", session_id="s1", **options)])
    agent.invoke({"messages": [HumanMessage("Look into owls.")]})


def test_a_long_write_to_the_session_during_the_run_does_not_store_the_turn_twice(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The middleware told what it had stored by the session's newest 50 messages (or twice the
    state's): a sub-agent given the same context, another thread on the session, writing more than
    that while a tool ran, pushed the turn's question out of them, and it was stored again."""
    memory = make_memory(embedder=StaticEmbedder())

    _owls_with_a_sub_agent(memory)
    own = [(m.role, m.content) for m in memory.get_messages("s1", user_id="u1") if not m.content.startswith("step ")]
    assert own == [("user", "Look into owls."), ("assistant", '[tool calls] research({"topic": "owls"})'),
                   ("tool", "found it"), ("assistant", "Owls, then.")]


def test_a_long_write_to_the_session_during_the_run_does_not_recall_the_runs_own_turn(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The turns the prompt holds were told to build_context as shown by the session's newest 50
    messages (or twice the state's): another writer adding more than that to the session while a tool
    ran (a sub-agent given the same context, another thread) pushed the run's own question out of them,
    and the next model call recalled it into its own prompt, beside the question itself. The ids the run
    stored (kept in its private state) are shown too now; the other writer's turns are still recalled."""
    memory = make_memory(embedder=StaticEmbedder())

    rec = PromptRecorder()
    _owls_with_a_sub_agent(memory, rec, max_tokens=3000)
    conversation, recalled, _ = _recalled(rec)
    assert "Look into owls." in conversation and len(rec.prompts) == 2
    assert "Look into owls." not in recalled  # the model reads its question once
    assert sum(r.startswith("step ") for r in recalled) >= 10  # the other writer's turns are memory


def test_the_private_state_keys_stay_out_of_the_output_and_of_values_streamed_by_output_keys(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The middleware's state keys (the run's question, the ids it stored) are PrivateStateAttr: out of
    the agent's input and output schemas, so out of what invoke returns. LangGraph streams every state
    channel with stream_mode="values" whatever the schemas say (its docs: private channels are not
    redacted when streaming); ``output_keys=list(agent.output_channels)`` streams the output's alone."""
    memory = make_memory(embedder=StaticEmbedder())
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Hello."), AIMessage("Hello again.")]), [],
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", session_id="s1")])
    private = {"tiered_memory_query", "tiered_memory_question_id", "tiered_memory_stored_as"}
    assert private <= set(TieredMemoryMiddleware.state_schema.__annotations__)
    out = agent.invoke({"messages": [HumanMessage("Hi.")]})
    assert not private & set(out) and not private & set(agent.output_channels)
    chunks = list(agent.stream({"messages": [HumanMessage("Hi again.")]}, stream_mode="values",
                               output_keys=list(agent.output_channels)))
    assert chunks and not any(private & set(c) for c in chunks)
    assert [m.text for m in chunks[-1]["messages"]] == ["Hi again.", "Hello again."]
    everything = list(agent.stream({"messages": [HumanMessage("Hi.")]}, stream_mode="values"))
    assert private & set(everything[-1])  # without output_keys: LangGraph's documented default


@pytest.mark.parametrize("state, present, shown", [
    ({}, {"a"}, []),  # a state from before: none kept
    ({"tiered_memory_stored_as": {"a": "s1", "b": "s2"}}, {"a", "c"}, ["s1"]),  # b is out of the prompt (a trim)
    ({"tiered_memory_stored_as": ["a", "b"]}, {"a"}, []),  # not a mapping: nothing read from it
    ({"tiered_memory_stored_as": {"a": 1, 2: "s2", "c": "s3"}}, {"a", "c"}, ["s3"]),  # ids are strings
])
def test_shown_by_run_table(state: dict[str, Any], present: set[str], shown: list[str]) -> None:
    assert shown_by_run(state, present) == shown


def test_a_long_write_to_the_session_between_runs_does_not_recall_the_threads_turns(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The same in a checkpointed thread across runs: another app writing more than 50 messages to the
    session between two runs pushed the thread's earlier turns out of the newest, and the second run
    recalled them beside themselves. The store's ids the runs kept stay in the thread's state while its
    messages hold them."""
    memory = make_memory(embedder=StaticEmbedder())
    rec = PromptRecorder()
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Owls hunt at night."), AIMessage("Yes.")],
                                           callbacks=[rec]), [], checkpointer=InMemorySaver(),
                         middleware=[TieredMemoryMiddleware(memory, user_id="u1", max_tokens=3000)])
    cfg = {"configurable": {"thread_id": "t1", "session_id": "s1"}}
    agent.invoke({"messages": [HumanMessage("Look into owls.")]}, cfg)
    memory.add_many([{"role": "user" if n % 2 == 0 else "assistant", "content": f"step {n} on owls"}
                     for n in range(60)], session_id="s1", user_id="u1")
    agent.invoke({"messages": [HumanMessage("Do owls hunt at night?")]}, cfg)
    conversation, recalled, _ = _recalled(rec)
    assert {"Look into owls.", "Owls hunt at night."} <= conversation
    assert not set(recalled) & conversation  # the thread's turns are read once
    assert sum(r.startswith("step ") for r in recalled) >= 10


def test_a_run_continuing_the_turn_after_a_long_write_does_not_store_the_turn_again(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A second run of a checkpointed thread that continues the same turn (invoked with no new message,
    as after a run that failed or stopped): its turn starts at the first run's question, which the save
    skipped only among the session's newest 50 messages and the ids this run stored. Another app writing
    more than that to the session between the runs pushed the first run's messages out of the newest, and
    they were stored twice. The store's ids the thread's runs kept are read as stored now."""
    memory = make_memory(embedder=StaticEmbedder())
    agent = create_agent(ScriptedToolModel(responses=[AIMessage("Owls hunt at night."), AIMessage("And mice.")]),
                         [], checkpointer=InMemorySaver(), middleware=[TieredMemoryMiddleware(memory, user_id="u1")])
    cfg = {"configurable": {"thread_id": "t1", "session_id": "s1"}}
    agent.invoke({"messages": [HumanMessage("Look into owls.")]}, cfg)
    memory.add_many([{"role": "user" if n % 2 == 0 else "assistant", "content": f"step {n} on owls"}
                     for n in range(60)], session_id="s1", user_id="u1")
    out = agent.invoke({"messages": []}, cfg)
    assert [m.text for m in out["messages"]] == ["Look into owls.", "Owls hunt at night.", "And mice."]
    own = [(m.role, m.content) for m in memory.get_messages("s1", user_id="u1") if not m.content.startswith("step ")]
    assert own == [("user", "Look into owls."), ("assistant", "Owls hunt at night."), ("assistant", "And mice.")]


class _OldState(AgentState[Any]):
    tiered_memory_stored: NotRequired[Annotated[list[str], PrivateStateAttr]]


class _OldKey(AgentMiddleware):
    """The key the middleware kept before (the ids one run stored), written as it wrote it."""

    state_schema = _OldState

    def before_agent(self, state: AgentState, runtime: Any) -> dict[str, Any] | None:
        return {"tiered_memory_stored": [m.id for m in state["messages"] if m.id]}


def test_a_thread_checkpointed_with_the_old_stored_key_runs_on(make_memory: Callable[..., TieredMemory]) -> None:
    """A checkpoint written before holds ``tiered_memory_stored``, which no schema declares now: the
    thread's next run restores without it and stores its new turn once."""
    memory = make_memory(embedder=StaticEmbedder())
    saver, cfg = InMemorySaver(), {"configurable": {"thread_id": "t1", "session_id": "s1"}}

    def run(question: str, answer: str, *extra: AgentMiddleware) -> list[str]:
        agent = create_agent(ScriptedToolModel(responses=[AIMessage(answer)]), [], checkpointer=saver,
                             middleware=[TieredMemoryMiddleware(memory, user_id="u1"), *extra])
        return [m.text for m in agent.invoke({"messages": [HumanMessage(question)]}, cfg)["messages"]]

    run("Look into owls.", "Owls hunt.", _OldKey())
    assert saver.get(cfg)["channel_values"]["tiered_memory_stored"]  # the old key is in the checkpoint
    assert run("And bats?", "Bats too.") == ["Look into owls.", "Owls hunt.", "And bats?", "Bats too."]
    assert [m.content for m in memory.get_messages("s1", user_id="u1")] == [
        "Look into owls.", "Owls hunt.", "And bats?", "Bats too."]
