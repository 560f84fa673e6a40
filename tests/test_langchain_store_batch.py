"""The LangGraph store's batches: LangGraph's semantics, and concurrent async calls coalesced."""

from __future__ import annotations

import asyncio
import gc
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_store
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, GetOp, ListNamespacesOp, MatchCondition, Op, PutOp, SearchOp
from langgraph.types import Send

from langchain_tiered_memory import TieredMemoryStore
from langchain_tiered_memory.store_batch import plan_batch, spread_results
from langchain_tiered_memory.testing import ScriptedToolModel
from tiered_memory import TieredMemory
from tiered_memory.errors import InvalidInputError
from tiered_memory.testing import CountingEmbedder

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

G1 = GetOp(("u1",), "a")
G2 = GetOp(("u1",), "b")
S1 = SearchOp(("u1",), {"tag": {"$in": ["x"]}}, 10, 0, "tea")  # a dict filter: not hashable
LS = ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("u1",)),))
P1 = PutOp(("u1",), "a", {"v": 1})
D1 = PutOp(("u1",), "a", None)


@dataclass
class Who:
    user_id: str


class Notes(MessagesState):
    note: str
    found: list[str]


@pytest.mark.parametrize("ops, reads, read_of, writes", [
    ([], [], [], []),
    ([G1, P1, G1, G2], [G1, G2], [0, None, 0, 1], [P1]),
    ([P1, D1], [], [None, None], [P1, D1]),
    ([S1, LS, S1, G1], [S1, LS, G1], [0, 1, 0, 2], []),
])
def test_plan_batch_table(ops: list[Op], reads: list[Op], read_of: list[int | None], writes: list[PutOp]) -> None:
    plan = plan_batch(ops)
    assert (plan.reads, plan.read_of, plan.writes) == (reads, read_of, writes)


def test_spread_results_gives_each_caller_its_own_list() -> None:
    plan = plan_batch([S1, P1, S1])
    shared: list[object] = ["hit"]
    out = spread_results(plan, [shared])  # type: ignore[list-item]
    assert out == [["hit"], None, ["hit"]]
    assert out[0] is not out[2]


async def test_concurrent_calls_run_as_one_batch(make_memory: Callable[..., TieredMemory], embedder: Any) -> None:
    counting = CountingEmbedder(embedder)
    store = TieredMemoryStore(make_memory(embedder=counting), fields=["text"])
    await asyncio.gather(*[store.aput(("u1", "notes"), f"k{i}", {"text": f"note {i} about tea"})
                           for i in range(40)])
    assert counting.batches == [40]  # forty awaits, one batch: one embedding call
    got = await asyncio.gather(*[store.aget(("u1", "notes"), f"k{i}") for i in range(40)],
                               store.asearch(("u1",), query="tea", limit=3),
                               store.alist_namespaces(prefix=("u1",)))
    assert [g.value["text"] for g in got[:40]] == [f"note {i} about tea" for i in range(40)]  # type: ignore[union-attr]
    assert len(got[40]) == 3 and got[41] == [("u1", "notes")]  # type: ignore[arg-type]


async def test_a_bad_call_fails_alone_and_a_cancelled_one_still_writes(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory)
    good = asyncio.ensure_future(store.aput(("u1",), "ok", {"v": 1}))
    bad = asyncio.ensure_future(store.aput(("u1",), "bad", {"v": {1, 2}}))  # a set is not JSON
    cancelled = asyncio.ensure_future(store.aput(("u1",), "gone", {"v": 3}))
    await asyncio.sleep(0)
    cancelled.cancel()
    await good
    with pytest.raises(InvalidInputError):
        await bad
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert (await store.aget(("u1",), "ok")).value == {"v": 1}  # type: ignore[union-attr]
    assert await store.aget(("u1",), "bad") is None
    assert (await store.aget(("u1",), "gone")).value == {"v": 3}  # type: ignore[union-attr]


async def test_a_cancelled_call_in_a_batch_that_fails_still_writes_alone(memory: TieredMemory) -> None:
    """The batch fails on another caller's operation and each caller's run again alone: the
    cancelled one's writes too (its reads are not run for nobody)."""
    store = TieredMemoryStore(memory)
    bad = asyncio.ensure_future(store.aput((" ",), "k", {"v": 1}))  # a blank user: refused when the batch runs
    cancelled = asyncio.ensure_future(store.abatch([GetOp(("u1",), "gone"), PutOp(("u1",), "gone", {"v": 3})]))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(InvalidInputError):
        await bad
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert (await store.aget(("u1",), "gone")).value == {"v": 3}  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [
    lambda store: store.aput((" ",), "k", {"v": 1}),  # a blank user label: caught only when the batch runs
    lambda store: store.aput(("u1",), "t", {"v": 1}, ttl=-5),
    lambda store: store.asearch(("u1",), filter={"v": {"$bogus": 1}}),
])
async def test_a_bad_call_found_only_when_the_batch_runs_still_fails_alone(memory: TieredMemory, bad: Any) -> None:
    store = TieredMemoryStore(memory)
    results = await asyncio.gather(store.aput(("u1",), "ok", {"v": 1}), bad(store), store.aget(("u1",), "ok"),
                                   return_exceptions=True)
    assert results[0] is None and isinstance(results[1], InvalidInputError)
    assert (await store.aget(("u1",), "ok")).value == {"v": 1}  # type: ignore[union-attr]


async def test_a_write_is_read_by_the_next_awaited_call_and_a_batch_reads_before_it(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory)
    await store.aput(("u1",), "k", {"v": 1})
    put, seen = await asyncio.gather(store.aput(("u1",), "k", {"v": 2}), store.aget(("u1",), "k"))
    assert put is None and seen.value == {"v": 1}  # type: ignore[union-attr]  # same tick: the state before
    assert (await store.aget(("u1",), "k")).value == {"v": 2}  # type: ignore[union-attr]


def test_one_store_serves_several_event_loops_and_sync_calls(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory)

    async def write(n: int) -> None:
        await asyncio.gather(*[store.aput(("u1",), f"k{n}-{i}", {"v": i}) for i in range(5)])

    asyncio.run(write(1))
    asyncio.run(write(2))  # a second loop gets its own queue
    store.put(("u1",), "sync", {"v": 0})
    assert len(store.search(("u1",), limit=20)) == 11


def test_an_event_loop_that_used_the_store_is_not_kept_alive(memory: TieredMemory) -> None:
    """Each loop's queue is held weakly by its loop, but the queue kept its finished draining
    task, which holds the loop: every ``asyncio.run`` that made an async store call (a sync
    web handler running an agent per request) was kept for the store's lifetime."""
    store = TieredMemoryStore(memory)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def call(n: int) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await store.aput(("u1",), f"k{n}", {"v": n})
        assert (await store.aget(("u1",), f"k{n}")).value == {"v": n}  # type: ignore[union-attr]

    for n in range(3):
        asyncio.run(call(n))
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]


@pytest.mark.timeout(60)
async def test_a_stop_iteration_in_a_batch_fails_its_caller_and_the_next_calls_run(memory: TieredMemory) -> None:
    """A ``StopIteration`` raised while a batch ran (here by the user mapping) never reached
    the batch's task, which waited forever, and every later async call on that loop queued
    behind it for good."""
    def owner(namespace: tuple[str, ...], key: str | None) -> str | None:
        return next(iter([])) if namespace[0] == "broken" else namespace[0]

    store = TieredMemoryStore(memory, user_namespace=owner)
    with pytest.raises(RuntimeError):
        await store.aput(("broken",), "k", {"v": 1})
    await store.aput(("u1",), "k", {"v": 2})
    assert (await store.aget(("u1",), "k")).value == {"v": 2}  # type: ignore[union-attr]


def test_an_unknown_operation_is_refused_before_anything_runs(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory)
    with pytest.raises(InvalidInputError, match="unknown store operation"):
        store.batch([PutOp(("u1",), "k", {"v": 1}), "not an op"])  # type: ignore[list-item]
    assert store.get(("u1",), "k") is None


async def test_an_async_agent_and_graph_use_the_store_from_their_running_loop(memory: TieredMemory) -> None:
    # what LangGraph users do: an async tool awaits runtime.store.aput/asearch (coalesced), a graph
    # node mixes awaited calls with a sync get on the loop's thread; each reads its own writes
    @tool
    async def note(text: str, runtime: ToolRuntime[Who]) -> str:
        """Save a note, then read the notes back."""
        ns = (runtime.context.user_id, "notes")
        assert runtime.store is not None
        await asyncio.gather(runtime.store.aput(ns, "n1", {"text": text}),
                             runtime.store.aput(ns, "n2", {"text": "Likes long walks."}))
        hits = await runtime.store.asearch(ns, query="food allergy", limit=1)
        return hits[0].value["text"]

    store = TieredMemoryStore(memory, fields=["text"])
    call = AIMessage(content="", tool_calls=[{"name": "note", "args": {"text": "Allergic to peanuts."},
                                              "id": "c1", "type": "tool_call"}])
    agent = create_agent(ScriptedToolModel(responses=[call, AIMessage("Noted.")]), [note], store=store,
                         context_schema=Who)
    out = await agent.ainvoke({"messages": [HumanMessage("Remember my allergy.")]}, context=Who("u1"))
    assert next(m for m in out["messages"] if isinstance(m, ToolMessage)).text == "Allergic to peanuts."

    async def node(state: MessagesState) -> dict[str, Any]:
        s = get_store()
        await s.aput(("u2", "notes"), "k", {"text": "From a node."})
        got = s.get(("u2", "notes"), "k")  # sync, on the loop's thread
        listed = await s.alist_namespaces(prefix=("u1",))
        return {"messages": [AIMessage(f"{got.value['text'] if got else None} {listed}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    result = await graph.compile(store=store).ainvoke({"messages": []})
    assert result["messages"][-1].text == "From a node. [('u1', 'notes')]"
    assert [h.key for h in store.search(("u2",), query="node")] == ["k"]


@tool
def remember(text: str) -> str:
    """Save a note, then find it again by meaning."""
    store = get_store()  # the graph's store, from LangGraph's config: no runtime argument
    store.put(("u1", "notes"), "sync", {"text": text})
    return str(store.search(("u1", "notes"), query=text, limit=1)[0].value["text"])


@tool
async def aremember(text: str) -> str:
    """Save a note, then find it again by meaning (async)."""
    store = get_store()
    await store.aput(("u2", "notes"), "async", {"text": text})
    return str((await store.asearch(("u2", "notes"), query=text, limit=1))[0].value["text"])


@pytest.mark.parametrize("make_agent", ["create_agent", "create_react_agent"])
async def test_a_tool_reads_the_store_with_get_store_in_create_agent_and_create_react_agent(
        memory: TieredMemory, make_agent: str) -> None:
    # the other agent tests reach the store through ToolRuntime; tools written for LangGraph's
    # prebuilt agent (still used, though deprecated since LangGraph 1.0) call get_store() instead
    from langgraph.prebuilt import create_react_agent
    from langgraph.warnings import LangGraphDeprecatedSinceV10

    store = TieredMemoryStore(memory, fields=["text"])

    def agent(name: str) -> Any:
        call = AIMessage(content="", tool_calls=[{"name": name, "args": {"text": "Allergic to peanuts."},
                                                  "id": "c1", "type": "tool_call"}])
        model = ScriptedToolModel(responses=[call, AIMessage("Noted.")])
        if make_agent == "create_agent":
            return create_agent(model, [remember, aremember], store=store)
        with pytest.warns(LangGraphDeprecatedSinceV10):
            return create_react_agent(model, [remember, aremember], store=store)

    def answer(out: dict[str, Any]) -> str:
        return str(next(m for m in out["messages"] if isinstance(m, ToolMessage)).text)

    ask = {"messages": [HumanMessage("Remember my allergy.")]}
    assert answer(await asyncio.to_thread(agent("remember").invoke, ask)) == "Allergic to peanuts."
    assert answer(await agent("remember").ainvoke(ask)) == "Allergic to peanuts."  # a sync tool, async graph
    assert answer(await agent("aremember").ainvoke(ask)) == "Allergic to peanuts."
    saved = [store.get(("u1", "notes"), "sync"), store.get(("u2", "notes"), "async")]
    assert [item.value if item else None for item in saved] == [{"text": "Allergic to peanuts."}] * 2


def test_parallel_sync_branches_of_a_graph_write_through_runtime_and_a_node_reads_through_store(
        memory: TieredMemory) -> None:
    # a sync graph whose Send fan-out runs one node per note in LangGraph's thread pool, each
    # putting through runtime.store at once; the next node gets the store as its `store`
    # argument, as LangGraph injects it, and a checkpointer keeps the thread
    notes = ["espresso coffee every morning", "jazz while coding", "tea at night", "cycling on sundays",
             "coffee beans from Kenya", "reads novels"]

    def fan_out(state: Notes) -> list[Send]:
        return [Send("save", {"note": n}) for n in notes]

    def save(state: Notes, runtime: Runtime[Who]) -> dict[str, Any]:
        assert runtime.store is not None
        runtime.store.put((runtime.context.user_id, "notes"), state["note"].split()[0], {"text": state["note"]})
        return {}

    def recall(state: Notes, *, store: BaseStore) -> dict[str, Any]:
        return {"found": [h.key for h in store.search(("u1", "notes"), query="coffee", limit=2)]}

    graph = StateGraph(Notes, context_schema=Who)
    graph.add_node("save", save)
    graph.add_node("recall", recall)
    graph.add_conditional_edges(START, fan_out, ["save"])
    graph.add_edge("save", "recall")
    store = TieredMemoryStore(memory, fields=["text"])
    app = graph.compile(store=store, checkpointer=InMemorySaver())
    out = app.invoke({"messages": []}, {"configurable": {"thread_id": "t1"}}, context=Who("u1"))
    assert sorted(out["found"]) == ["coffee", "espresso"]
    saved = store.search(("u1", "notes"), limit=100)
    assert sorted(h.value["text"] for h in saved) == sorted(notes)
    assert store.list_namespaces() == [("u1", "notes")]
