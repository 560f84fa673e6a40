"""LangChainLLM without an LLM server: LangChain's own fake chat models, and a real
``ChatOpenAI`` talking to a tiny recording HTTP endpoint to check what goes on the wire."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel, ParrotFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langchain_openai import ChatOpenAI

from http_support import chat_completion, json_server

from langchain_tiered_memory.llm import LangChainLLM, call_options, is_openai_chat_model, to_langchain_messages
from tiered_memory import TieredMemory
from tiered_memory.errors import InvalidInputError, LLMError
from tiered_memory.llm.adapters import resolve_llm
from tiered_memory.llm.base import LLM


def fake(*replies: Any) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage(content=r) for r in replies]))


def openai_model(base_url: str = "http://127.0.0.1:9/v1", **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=base_url, api_key="not-needed", model="qwen", **{"max_retries": 0, "timeout": 5, **kw})


# ---- pure parts ----------------------------------------------------------------
@pytest.mark.parametrize(("role", "cls"), [
    ("system", SystemMessage), ("user", HumanMessage), ("human", HumanMessage),
    ("assistant", AIMessage), ("ai", AIMessage), ("USER", HumanMessage),
])
def test_roles_map_to_langchain_message_classes(role: str, cls: type) -> None:
    [m] = to_langchain_messages([{"role": role, "content": "hello"}])
    assert type(m) is cls and m.content == "hello"


@pytest.mark.parametrize("bad", [
    {"role": "tool", "content": "x"}, {"content": "x"}, {"role": "user", "content": 3},
    {"role": "user"},
])
def test_bad_messages_are_rejected_with_a_usage_error(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        to_langchain_messages([bad])


@pytest.mark.parametrize(("json_mode", "max_tokens", "model_extra", "expected"), [
    (False, None, None, {}),
    (True, None, None, {"response_format": {"type": "json_object"}}),
    (False, 64, None, {"extra_body": {"max_tokens": 64}}),
    (True, 64, {"top_k": 5}, {"response_format": {"type": "json_object"},
                              "extra_body": {"top_k": 5, "max_tokens": 64}}),
    (False, 32, {"max_tokens": 512}, {"extra_body": {"max_tokens": 32}}),
])
def test_call_options_for_openai_models(json_mode: bool, max_tokens: int | None,
                                        model_extra: dict[str, Any] | None,
                                        expected: dict[str, Any]) -> None:
    model = openai_model(extra_body=model_extra)
    assert call_options(model, json_mode=json_mode, max_tokens=max_tokens) == expected
    assert model.extra_body == model_extra  # the model's own options are not touched


@pytest.mark.parametrize(("json_mode", "max_tokens"), [(False, None), (True, 100)])
def test_generic_models_get_no_provider_specific_options(json_mode: bool, max_tokens: int | None) -> None:
    model = fake("x")
    assert not is_openai_chat_model(model)
    assert call_options(model, json_mode=json_mode, max_tokens=max_tokens) == {}


# ---- through fake chat models ---------------------------------------------------------
async def test_complete_returns_the_model_reply_text() -> None:
    llm = LangChainLLM(fake("first", "second"))
    assert isinstance(llm, LLM)
    assert await llm.complete([{"role": "user", "content": "hi"}]) == "first"
    assert await llm.complete([{"role": "user", "content": "again"}], json_mode=True, max_tokens=10) == "second"


async def test_text_content_blocks_are_joined() -> None:
    model = GenericFakeChatModel(messages=iter([AIMessage(content=[
        {"type": "text", "text": '{"a": '}, {"type": "text", "text": "1}"}])]))
    assert json.loads(await LangChainLLM(model).complete([{"role": "user", "content": "json"}])) == {"a": 1}


async def test_conversation_reaches_the_model_in_order_and_inputs_are_not_mutated() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ping"},
                {"role": "assistant", "content": "pong"}, {"role": "user", "content": "last words"}]
    snapshot = json.dumps(messages)
    # the parrot answers with the last message it received
    assert await LangChainLLM(ParrotFakeChatModel()).complete(messages) == "last words"
    assert json.dumps(messages) == snapshot


def test_only_chat_models_and_runnables_are_accepted() -> None:
    with pytest.raises(InvalidInputError, match="BaseChatModel"):
        LangChainLLM("gpt-4")  # type: ignore[arg-type]


# ---- a chat model wrapped by with_retry() / bind() -----------------------------------------
async def test_a_model_wrapped_by_with_retry_or_bind_powers_the_layers() -> None:
    """``model.with_retry()`` and ``model.bind(...)`` are a ``RunnableRetry`` / ``RunnableBinding``,
    no ``BaseChatModel``; LangChainLLM refused them, and ``TieredMemory(llm=model.with_retry())``
    said the llm was neither a chat model nor an LLM."""
    assert await LangChainLLM(fake("retried").with_retry()).complete([{"role": "user", "content": "hi"}]) == "retried"
    assert await LangChainLLM(fake("bound").bind(stop=["\n"])).complete([{"role": "user", "content": "hi"}]) == "bound"
    wrapped = fake("x").bind(stop=["\n"]).with_retry(stop_after_attempt=2)
    llm = resolve_llm(wrapped)
    assert isinstance(llm, LangChainLLM) and llm.model is wrapped


async def test_with_retry_retries_a_failing_call() -> None:
    calls: list[int] = []

    def flaky(messages: list[Any]) -> AIMessage:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("reset by peer")
        return AIMessage(content=f"answered {messages[-1].content}")

    model = RunnableLambda(flaky).with_retry(stop_after_attempt=2, wait_exponential_jitter=False)
    assert await LangChainLLM(model).complete([{"role": "user", "content": "ping"}]) == "answered ping"
    assert len(calls) == 2


@pytest.mark.parametrize("reply", [{"answer": 1}, 42, None])
async def test_a_runnable_that_answers_with_no_message_is_an_llm_error(reply: Any) -> None:
    # e.g. model.with_structured_output(...), which answers with a dict: a typed error, not str(dict)
    with pytest.raises(LLMError, match="message"):
        await LangChainLLM(RunnableLambda(lambda _: reply)).complete([{"role": "user", "content": "hi"}])


async def test_a_wrapped_chat_openai_still_gets_json_mode_max_tokens_and_its_bound_extra_body(
        recording_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, bodies = recording_server
    model = openai_model(url, extra_body={"top_k": 5}).bind(extra_body={"min_p": 0.1}, stop=["END"])
    llm = LangChainLLM(model.with_retry(stop_after_attempt=2))
    text = await llm.complete([{"role": "user", "content": "ok?"}], json_mode=True, max_tokens=77)
    assert json.loads(text) == {"ok": True}
    [body] = bodies
    assert body["response_format"] == {"type": "json_object"} and body["max_tokens"] == 77
    assert body["min_p"] == 0.1 and "top_k" not in body  # a bound extra_body replaces the model's, as in LangChain
    assert body["stop"] == ["END"]  # the user's own binding is kept
    assert repr(llm) == "LangChainLLM(ChatOpenAI)"


async def test_a_wrapped_models_failure_is_an_llm_error_naming_the_model() -> None:
    llm = LangChainLLM(openai_model("http://127.0.0.1:9/v1").with_retry(stop_after_attempt=1))
    with pytest.raises(LLMError, match="ChatOpenAI failed") as info:
        await llm.complete([{"role": "user", "content": "hi"}])
    assert info.value.__cause__ is not None


def test_core_resolves_a_langchain_chat_model_to_the_adapter() -> None:
    model = fake("x")
    llm = resolve_llm(model)
    assert isinstance(llm, LangChainLLM) and llm.model is model


# ---- a real ChatOpenAI on the wire ----------------------------------------------------------
@pytest.fixture
def recording_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with json_server(chat_completion(), delay=getattr(request, "param", 0.0)) as served:
        yield served


async def test_chat_openai_request_carries_json_mode_and_a_max_tokens_the_server_reads(
        recording_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, bodies = recording_server
    llm = LangChainLLM(openai_model(url, temperature=0, extra_body={"top_k": 5}))
    text = await llm.complete([{"role": "system", "content": "Reply in JSON."},
                               {"role": "user", "content": "ok?"}], json_mode=True, max_tokens=77)
    assert json.loads(text) == {"ok": True}
    [body] = bodies
    assert body["path"] == "/v1/chat/completions"
    assert body["response_format"] == {"type": "json_object"}
    # llama.cpp's server reads "max_tokens"; extra_body fields land at the top level
    assert body["max_tokens"] == 77 and body["top_k"] == 5
    assert "max_completion_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


async def test_chat_openai_plain_call_sends_no_json_mode(
        recording_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, bodies = recording_server
    await LangChainLLM(openai_model(url)).complete([{"role": "user", "content": "hi"}])
    [body] = bodies
    assert "response_format" not in body and "max_tokens" not in body


async def test_provider_errors_become_llm_errors_with_the_cause_kept() -> None:
    llm = LangChainLLM(openai_model("http://127.0.0.1:9/v1"))  # nothing listens on port 9
    with pytest.raises(LLMError, match="ChatOpenAI failed") as info:
        await llm.complete([{"role": "user", "content": "hi"}])
    assert info.value.__cause__ is not None


def test_calls_from_a_new_event_loop_each_time_all_succeed(
        recording_server: tuple[str, list[dict[str, Any]]]) -> None:
    # the core's sync methods run each LLM call in a fresh asyncio.run loop; async HTTP
    # clients keep connections bound to the loop that opened them (every other call
    # used to fail with "Connection error")
    url, bodies = recording_server
    llm = LangChainLLM(openai_model(url))
    replies = [asyncio.run(llm.complete([{"role": "user", "content": f"call {i}"}])) for i in range(4)]
    assert replies == ['{"ok": true}'] * 4 and len(bodies) == 4


@pytest.mark.parametrize("recording_server", [3.0], indirect=True)
def test_a_caller_timeout_returns_without_waiting_for_the_model(
        recording_server: tuple[str, list[dict[str, Any]]]) -> None:
    url, bodies = recording_server
    llm = LangChainLLM(openai_model(url))

    async def call() -> str:
        return await asyncio.wait_for(llm.complete([{"role": "user", "content": "slow"}]), 0.3)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(call())
    assert bodies == []  # the server records a request when it answers, 3 s after: none answered yet


_EXIT_SCRIPT = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from http_support import chat_completion, json_server
from test_langchain_llm_adapter import openai_model
from langchain_tiered_memory.llm import LangChainLLM
with json_server(chat_completion(), delay=3600.0) as (url, _):
    llm = LangChainLLM(openai_model(url, timeout=3600))
    try:
        asyncio.run(asyncio.wait_for(llm.complete([{"role": "user", "content": "slow"}]), 0.5))
    except asyncio.TimeoutError:
        print("timed out", flush=True)
"""


def test_an_abandoned_call_does_not_hold_up_interpreter_exit() -> None:
    # the server answers after an hour and the client waits as long: an exit that waited for the
    # abandoned call would outlive subprocess.run's timeout, which fails the test
    out = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "timed out", out.stderr


class _ChatStarts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.starts = 0

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.starts += 1


def test_the_model_calls_of_end_session_inside_a_run_get_the_runs_callbacks(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A chat model called inside a LangChain run is a child of that run (its callbacks, its
    trace), as LangChain carries the run in context variables; the summarising calls of an
    ``end_session`` made inside a run lost them: the model ran on a thread started without
    the caller's context, so a tracer saw nothing of them."""
    model = fake(json.dumps({"facts": []}), json.dumps({"summary": "Lives in Lisbon", "key_points": ["Lisbon"],
                                                        "topics": ["home"]}),
                 json.dumps({"facts": []}), json.dumps({"summary": "Moved to Porto", "key_points": ["Porto"],
                                                        "topics": ["home"]}))
    memory = make_memory("traced", llm=model)
    memory.add("user", "I live in Lisbon", session_id="s1", user_id="u")
    memory.add("user", "I moved to Porto", session_id="s2", user_id="u")
    sync, asynchronous = _ChatStarts(), _ChatStarts()
    episode = RunnableLambda(lambda _: memory.end_session("s1", user_id="u")).invoke(
        None, config={"callbacks": [sync]})
    assert episode.metadata["method"] == "llm" and sync.starts == 2

    async def end(_: Any) -> Any:
        return await memory.aend_session("s2", user_id="u")

    episode = asyncio.run(RunnableLambda(end).ainvoke(None, config={"callbacks": [asynchronous]}))
    assert episode.metadata["method"] == "llm" and asynchronous.starts == 2


def test_a_memory_given_a_model_with_retry_summarises_with_it(make_memory: Callable[..., TieredMemory]) -> None:
    model = fake(json.dumps({"facts": []}), json.dumps({"summary": "Lives in Lisbon", "key_points": ["Lisbon"],
                                                        "topics": ["home"]})).with_retry(stop_after_attempt=2)
    memory = make_memory("retrying", llm=model)
    memory.add("user", "I live in Lisbon", session_id="s1", user_id="u")
    episode = memory.end_session("s1", user_id="u")
    assert episode.metadata["method"] == "llm" and episode.summary == "Lives in Lisbon"


@pytest.mark.parametrize(("wrap", "expected"), [
    (lambda m: m, {"top_k": 5}),
    (lambda m: m.with_retry(), {"top_k": 5}),
    (lambda m: m.bind(extra_body={"min_p": 0.1}), {"min_p": 0.1}),
    (lambda m: m.bind(extra_body={"min_p": 0.1}).bind(extra_body={"seed": 1}).with_retry(), {"seed": 1}),
    (lambda m: m.bind(stop=["x"]).with_config(tags=["t"]), {"top_k": 5}),
])
def test_unwrap_finds_the_model_and_the_extra_body_that_reaches_it(wrap: Callable[[Any], Any],
                                                                    expected: dict[str, Any]) -> None:
    from langchain_tiered_memory.llm import unwrap

    model = openai_model(extra_body={"top_k": 5})
    inner, extra_body = unwrap(wrap(model))
    assert inner is model and extra_body == expected
    assert call_options(wrap(model), json_mode=False, max_tokens=9) == {"extra_body": {**expected, "max_tokens": 9}}


def test_a_runnable_that_is_no_model_is_refused_when_the_memory_is_built(
        make_memory: Callable[..., TieredMemory]) -> None:
    """Any Runnable is taken as a model, but a retriever, tool, prompt or parser given as ``llm=``
    by mistake would fail every call, and the layers fall back to rules on a failing model with a
    log line only: refused up front instead."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.tools import tool

    from langchain_tiered_memory import TieredMemoryRetriever

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    memory = make_memory("plain")
    for wrong in (TieredMemoryRetriever(memory=memory, user_id="u"), lookup,
                  ChatPromptTemplate.from_messages([("human", "{q}")]), StrOutputParser().with_retry()):
        with pytest.raises(InvalidInputError, match="not a chat model"):
            LangChainLLM(wrong)
        with pytest.raises(InvalidInputError, match="not a chat model"):
            make_memory(f"wrong-{type(wrong).__name__}", llm=wrong)
