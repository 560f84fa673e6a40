"""Tool-call ids across a replayed prompt: each sent once.

Anthropic refuses a request whose ``tool_use`` ids repeat anywhere in its messages ("tool_use ids
must be unique"), and OpenAI pairs a result with its call by id. Kimi's and DeepSeek's servers number
the calls of each turn (``functions.get_weather:0``), so a stored session holds one id in many turns.
A replay (the history's ``messages``, ``include_memory``, the middleware's ``include_recent``) keeps
the newest call of an id as it is (the one a caller may still answer, and the live turn's calls the
agent sends beside the replay) and gives each older one a new id, on the call and on the result
that answers it alike. A message with two calls of one id is stored as the model returned it, and
its replay quotes the second (``tests/test_replay_tool_calls.py``). Real LangChain messages, what
langchain-openai sends, a real SQLite memory.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai.chat_models.base import _convert_message_to_dict

from langchain_tiered_memory import TieredChatMessageHistory, TieredConversationMemory, TieredMemoryMiddleware
from langchain_tiered_memory import history_factory, with_tiered_memory
from langchain_tiered_memory.messages import from_stored_many
from langchain_tiered_memory.testing import ScriptedToolModel
from lc_support import PromptRecorder
from tiered_memory import TieredMemory
from tiered_memory.quoting import quote
from tiered_memory.tool_calls import is_tool_call_id

KIMI = "functions.weather:0"  # Kimi's id of a turn's first call, in every turn


def _call(call_id: str, city: str) -> dict[str, Any]:
    return {"name": "weather", "args": {"city": city}, "id": call_id, "type": "tool_call"}


def _turn(n: int, city: str, call_id: str = KIMI) -> list[BaseMessage]:
    """A user's question, the model's call, the tool's result and the answer."""
    return [HumanMessage(f"weather in {city}?", id=f"h{n}"),
            AIMessage("", tool_calls=[_call(call_id, city)], id=f"a{n}"),
            ToolMessage(f"{20 + n}C", tool_call_id=call_id, id=f"t{n}"), AIMessage(f"{20 + n}C in {city}.", id=f"r{n}")]


def _sent(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """What langchain-openai sends for ``messages``, checked as Anthropic and OpenAI check it: each
    call's id a plain token sent once in the whole prompt, and each result answering a call of the
    assistant message just before its run of results."""
    sent = [_convert_message_to_dict(m) for m in messages]
    ids = [c["id"] for d in sent for c in d.get("tool_calls", [])]
    assert all(is_tool_call_id(i) for i in ids), ids
    assert len(ids) == len(set(ids)), f"tool-call ids repeat in one prompt: {ids}"
    open_calls: set[str] = set()
    for d in sent:
        if d["role"] == "tool":
            assert d["tool_call_id"] in open_calls, f"a tool result answers no call just before it: {d}"
            open_calls.discard(d["tool_call_id"])
        else:
            open_calls = {c["id"] for c in d.get("tool_calls", [])}
    return sent


def _answered_right_after(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    sent = _sent(messages)
    for n, d in enumerate(sent):
        run = itertools.takewhile(lambda e: e["role"] == "tool", sent[n + 1:])
        assert not {c["id"] for c in d.get("tool_calls", [])} - {e["tool_call_id"] for e in run}, d
    return sent


def _call_ids(messages: list[BaseMessage]) -> dict[str, str]:
    """The id each replayed call and result is sent with, by its message's id."""
    return {str(m.id): (m.tool_call_id if isinstance(m, ToolMessage) else m.tool_calls[0]["id"])
            for m in messages if isinstance(m, ToolMessage) or isinstance(m, AIMessage) and m.tool_calls}


def test_a_replay_sends_each_tool_call_id_once_and_keeps_the_newest(reused_memory: TieredMemory) -> None:
    """Three turns of Kimi's ids: the last keeps its id, each older call and its result share a new one."""
    history = TieredChatMessageHistory(reused_memory, "s", user_id="u")
    history.add_messages(_turn(1, "Porto") + _turn(2, "Lisbon") + _turn(3, "Faro"))
    rows = reused_memory.get_messages("s", user_id="u")
    classic = TieredConversationMemory(memory=reused_memory, user_id="u", session_id="s", return_messages=True)
    for got in (history.messages, from_stored_many(rows), from_stored_many(rows, before_new_turn=True),
                TieredChatMessageHistory(reused_memory, "s", user_id="u", include_memory=True).messages,
                history_factory(reused_memory, include_memory=True)("u", "s").messages,
                classic.load_memory_variables({"input": "and in Braga?"})["history"]):
        _answered_right_after(got)
        ids = _call_ids(got)
        assert ids["a3"] == ids["t3"] == KIMI  # the newest as it was
        assert ids["a1"] == ids["t1"] != ids["a2"] == ids["t2"] != KIMI
        # in Kimi's own shape, whose chat template shows a model the ids: it writes its next ones alike
        assert all(re.fullmatch(r"functions\.weather:[0-9]+", i) for i in ids.values())
        assert [type(m) for m in got if m.id in ids] == [AIMessage, ToolMessage] * 3
    stored = [r.metadata["langchain"]["data"] for r in reused_memory.get_messages("s", user_id="u")]
    assert [d.get("tool_call_id") or d["tool_calls"][0]["id"] for d in stored if "tool_call_id" in d
            or d.get("tool_calls")] == [KIMI] * 6  # what is stored is unchanged


def test_a_call_still_to_answer_keeps_its_id_and_its_result_pairs_with_it(reused_memory: TieredMemory) -> None:
    """The history's last call no result answers yet is the caller's to answer (an agent reads the
    history, runs the tool, adds the result): it keeps its id, and an older call of that id gets a new one."""
    history = TieredChatMessageHistory(reused_memory, "s", user_id="u")
    history.add_messages(_turn(1, "Porto") + _turn(2, "Lisbon")[:2])
    got = history.messages
    _sent(got)
    ids = _call_ids(got)
    assert ids["a2"] == KIMI and ids["a1"] == ids["t1"] != KIMI
    answer = ToolMessage("22C", tool_call_id=got[-1].tool_calls[0]["id"], id="t2")  # type: ignore[attr-defined]
    history.add_messages([answer])
    again = history.messages
    _answered_right_after(again)
    assert isinstance(again[-1], ToolMessage) and _call_ids(again) == {**ids, "t2": KIMI}


def test_a_new_id_is_no_id_the_prompt_holds(reused_memory: TieredMemory) -> None:
    """An id a replay makes is checked against every id the prompt sends: a stored call that already
    has it keeps it when newer, and is renamed in turn when older. Ids near the length limit stay in it."""
    long = "c" * 256
    history = TieredChatMessageHistory(reused_memory, "s", user_id="u")
    named = ["c1", "c1-2", "c1", "c1-2", long, long]  # each turn without its answer: the buffer holds all
    history.add_messages([m for n, i in enumerate(named, 1) for m in _turn(n, "Porto", i)[:3]])
    got = history.messages
    _answered_right_after(got)
    ids = _call_ids(got)
    assert ids["a3"] == "c1" and ids["a4"] == "c1-2" and ids["a6"] == long  # the newest as they were
    assert ids["a2"] == "c1-3" and ids["a1"] == "c2"  # the next number: "c1-2" is sent already
    assert ids["a5"] == "c" * 254 + "-2"


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return "19C"


def test_the_middleware_never_renames_the_live_turns_calls(reused_memory: TieredMemory) -> None:
    """``include_recent`` replays the session's turns before the agent's own messages, which hold the
    turn's calls under Kimi's ids too: the replayed call of that id is renamed, the live one the tool
    answers is not."""
    TieredChatMessageHistory(reused_memory, "s", user_id="u").add_messages(_turn(1, "Porto"))
    rec = PromptRecorder()
    model = ScriptedToolModel(responses=[AIMessage("", tool_calls=[_call(KIMI, "Lisbon")]), AIMessage("19C.")],
                              callbacks=[rec])
    agent = create_agent(model, [weather], middleware=[
        TieredMemoryMiddleware(reused_memory, user_id="u", session_id="s", include_recent=True)])
    out = agent.invoke({"messages": [HumanMessage("and in Lisbon?")]})
    assert out["messages"][-1].text == "19C."
    live = [m for m in out["messages"] if isinstance(m, (AIMessage, ToolMessage)) and m.id not in ("a1", "t1")]
    assert live[0].tool_calls[0]["id"] == live[1].tool_call_id == KIMI  # type: ignore[union-attr]
    last = [m for m in rec.last if not isinstance(m, SystemMessage)]
    _answered_right_after(last)
    ids = _call_ids(last)
    assert ids["a1"] == ids["t1"] != KIMI and list(ids.values()).count(KIMI) == 2  # the live call and result


def test_a_wrapped_model_never_renames_the_calls_of_its_input(reused_memory: TieredMemory) -> None:
    """``with_tiered_memory(model)`` sends the recent turns before the call's own messages: a tool loop
    passes its turn's call and result in, under Kimi's ids; the replayed call of that id is renamed."""
    TieredChatMessageHistory(reused_memory, "s", user_id="u").add_messages(_turn(1, "Porto"))
    rec = PromptRecorder()
    chain = with_tiered_memory(ScriptedToolModel(responses=[AIMessage("19C.")], callbacks=[rec]), reused_memory)
    turn = [HumanMessage("and in Lisbon?", id="h2"), AIMessage("", tool_calls=[_call(KIMI, "Lisbon")], id="a2"),
            ToolMessage("19C", tool_call_id=KIMI, id="t2")]
    assert chain.invoke(turn, {"configurable": {"user_id": "u", "session_id": "s"}}).text == "19C."
    last = [m for m in rec.last if not isinstance(m, SystemMessage)]
    _answered_right_after(last)
    assert [m.id for m in last] == ["h1", "a1", "t1", "r1", "h2", "a2", "t2"]
    ids = _call_ids(last)
    assert ids["a2"] == ids["t2"] == KIMI and ids["a1"] == ids["t1"] != KIMI


def test_a_message_with_two_calls_of_one_id_is_stored_as_the_model_returned_it(reused_memory: TieredMemory) -> None:
    """Not refused (the recording paths store a model's reply after the fact, the import reads older
    exports, and both ids are plain tokens): stored whole, and the replay quotes the second call."""
    reply = AIMessage("", tool_calls=[_call("c1", "Porto"), _call("c1", "Lisbon")], id="a1")
    history = TieredChatMessageHistory(reused_memory, "s", user_id="u")
    history.add_messages([HumanMessage("weather?", id="h1"), reply, ToolMessage("22C", tool_call_id="c1", id="t1")])
    [row] = [r for r in reused_memory.get_messages("s", user_id="u") if r.role == "assistant"]
    assert row.metadata["langchain"]["data"]["tool_calls"] == [_call("c1", "Porto"), _call("c1", "Lisbon")]
    got = history.messages
    _answered_right_after(got)
    assert isinstance(got[1], AIMessage) and got[1].tool_calls == [_call("c1", "Porto")]
    arguments = quote(json.dumps({'city': 'Lisbon'}))
    assert got[1].text == f"[stored tool call] {quote('weather')} with arguments {arguments}"
