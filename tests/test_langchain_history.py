"""TieredChatMessageHistory over a real store (its chains: test_langchain_history_chains.py)."""

from __future__ import annotations

import asyncio
import copy
import sys
from typing import Any, Callable

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_tiered_memory import (
    TieredChatMessageHistory,
    from_stored,
    history_factory,
    to_core,
)
from tiered_memory import BufferConfig, InvalidInputError, MemoryConfig, TieredMemory
from tiered_memory.embedding import Embedder
from tiered_memory.testing import HeldEmbedder


def _varied_messages() -> list[BaseMessage]:
    return [
        SystemMessage(content="You are terse.", id="sys-1"),
        HumanMessage(content="What's the weather in Lisbon?", name="alice", id="h-1",
                     additional_kwargs={"client": {"lang": "pt"}}),
        AIMessage(content="", id="a-1", name="bot",
                  tool_calls=[{"name": "weather", "args": {"city": "Lisbon"}, "id": "call-1",
                               "type": "tool_call"}],
                  response_metadata={"model_name": "fake"}),
        ToolMessage(content="22C and sunny", tool_call_id="call-1", name="weather", id="t-1",
                    artifact={"raw": [22, "C"]}),
        AIMessage(content=[{"type": "text", "text": "It is 22C and sunny."}], id="a-2"),
        FunctionMessage(content="42", name="answer", id="f-1"),
        ChatMessage(content="Looks right to me.", role="critic", id="c-1"),
        HumanMessage(content="thanks"),  # no id
    ]


def test_round_trip_preserves_types_names_tool_calls_and_ids(memory: TieredMemory) -> None:
    history = TieredChatMessageHistory(memory, session_id="s1", user_id="u1")
    sent = _varied_messages()
    before = copy.deepcopy(sent)
    history.add_messages(sent)
    assert sent == before  # caller inputs are not mutated
    back = history.messages
    # user, assistant and answered tool messages come back as they were sent ...
    assert [type(m) for m in back] == [HumanMessage, HumanMessage, AIMessage, ToolMessage, AIMessage,
                                       HumanMessage, AIMessage, HumanMessage]
    assert back[2:5] == sent[2:5]
    # ... but additional_kwargs: partner packages forward what they hold, so a replay restores none
    assert back[1] == sent[1].model_copy(update={"additional_kwargs": {}})
    # ... stored memory never replays as an instruction: the system prompt and the function
    # result (no tool call answers it) are quoted user-side data; another speaker is the assistant
    assert back[0].text == '[stored system message] "You are terse."' and back[0].id == "sys-1"
    assert back[5].text == '[stored tool result] "42"'
    assert back[6].text == "Looks right to me." and back[6].id == "c-1"
    assert back[2].tool_calls[0]["args"] == {"city": "Lisbon"}  # type: ignore[attr-defined]
    assert back[3].tool_call_id == "call-1"  # type: ignore[attr-defined]
    assert back[-1] == HumanMessage(content="thanks")  # sent without an id, read back without one
    stored = memory.get_messages("s1", user_id="u1")
    assert [m.role for m in stored] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                        "assistant", "user"]
    assert stored[1].metadata["langchain"]["data"]["additional_kwargs"] == {"client": {"lang": "pt"}}  # stored as sent
    # the text that is indexed: tool calls are described when a message has no text
    assert stored[2].content == '[tool calls] weather({"city": "Lisbon"})'
    assert stored[4].content == "It is 22C and sunny."
    assert memory.search("weather tool call Lisbon", user_id="u1", k=3)


def test_messages_stored_through_the_core_read_back_by_role(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "hello"},
                     {"role": "assistant", "content": "hi"},
                     {"role": "tool", "content": "out", "metadata": {"tool_call_id": "x"}},
                     {"role": "system", "content": "be terse"}],
                    session_id="s", user_id="u")
    got = TieredChatMessageHistory(memory, session_id="s", user_id="u").messages
    # no assistant message called tool "x", and a stored system turn is data: both are quoted
    assert [type(m).__name__ for m in got] == ["HumanMessage", "AIMessage", "HumanMessage", "HumanMessage"]
    assert [m.text for m in got[2:]] == ['[stored tool result] "out"', '[stored system message] "be terse"']
    assert all(m.id for m in got)


def test_to_core_rejects_what_cannot_be_a_chat_turn() -> None:
    from langchain_core.messages import RemoveMessage

    with pytest.raises(InvalidInputError, match="remove"):
        to_core(RemoveMessage(id="x"))
    with pytest.raises(InvalidInputError):
        to_core("not a message")  # type: ignore[arg-type]


def test_bulk_write_is_all_or_nothing(memory: TieredMemory) -> None:
    history = TieredChatMessageHistory(memory, session_id="s", user_id="u")
    too_big = HumanMessage(content="x" * (memory.config.max_content_chars + 1))
    with pytest.raises(InvalidInputError, match="message 1"):
        history.add_messages([HumanMessage(content="fine"), too_big])
    assert history.messages == []


def test_history_is_the_token_bounded_buffer(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(config=MemoryConfig(buffer=BufferConfig(max_messages=4, max_tokens=2000)))
    history = TieredChatMessageHistory(memory, session_id="s", user_id="u")
    for n in range(5):
        history.add_messages([HumanMessage(content=f"question {n}"), AIMessage(content=f"answer {n}")])
    assert [m.text for m in history.messages] == ["question 3", "answer 3", "question 4", "answer 4"]
    assert len(memory.get_messages("s", user_id="u")) == 10  # older turns are kept, not returned


def test_clear_only_clears_its_session(memory: TieredMemory) -> None:
    a = TieredChatMessageHistory(memory, session_id="a", user_id="u")
    b = TieredChatMessageHistory(memory, session_id="b", user_id="u")
    other = TieredChatMessageHistory(memory, session_id="a", user_id="someone-else")
    for h in (a, b, other):
        h.add_messages([HumanMessage(content="hi"), AIMessage(content="hello")])
    a.clear()
    assert a.messages == [] and len(b.messages) == 2 and len(other.messages) == 2


def test_include_memory_prepends_quoted_long_term_memory(memory: TieredMemory) -> None:
    old = TieredChatMessageHistory(memory, session_id="old", user_id="u1")
    old.add_messages([HumanMessage(content="My cat is called Ziggy."), AIMessage(content="Noted!")])
    TieredChatMessageHistory(memory, session_id="x", user_id="u2").add_messages(
        [HumanMessage(content="My cat is called Mittens.")])
    new = TieredChatMessageHistory(memory, session_id="new", user_id="u1", include_memory=True)
    assert new.messages == []  # nothing to recall for yet
    new.add_messages([HumanMessage(content="What is my cat called?"), AIMessage(content="Let me think.")])
    got = new.messages
    assert isinstance(got[0], SystemMessage)
    assert "Ziggy" in got[0].text and "Mittens" not in got[0].text
    assert "not instructions" in got[0].text  # quoted data, not a prompt
    assert [m.text for m in got[1:]] == ["What is my cat called?", "Let me think."]


def test_core_stays_framework_free() -> None:
    import importlib
    import subprocess

    code = ("import sys, tiered_memory; "
            "assert not [m for m in sys.modules if m.startswith(('langchain', 'langgraph'))]")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert importlib.import_module("tiered_memory")


def test_public_surface() -> None:
    import langchain_tiered_memory as lc

    assert lc.__all__ == sorted(lc.__all__)
    assert {"TieredChatMessageHistory", "TieredConversationMemory", "TieredMemoryRetriever",
            "TieredMemoryStore", "TieredMemoryMiddleware", "LangChainEmbedder",
            "TieredMemoryEmbeddings", "history_factory",
            "NamespaceLabelError", "ItemValueError"} <= set(lc.__all__)  # the store's errors the README names
    for name in lc.__all__:
        assert getattr(lc, name) is not None
    with pytest.raises(AttributeError):
        lc.NoSuchThing  # noqa: B018


def test_from_stored_tolerates_damaged_langchain_metadata(memory: TieredMemory) -> None:
    memory.add("user", "hello", session_id="s", user_id="u",
               metadata={"langchain": {"type": "nonsense", "data": {"x": 1}}})
    (m,) = memory.get_messages("s", user_id="u")
    assert isinstance(from_stored(m), HumanMessage) and from_stored(m).text == "hello"


def test_end_session_feeds_facts_and_episodes_into_the_next_session(memory: TieredMemory) -> None:
    old = TieredChatMessageHistory(memory, session_id="trip", user_id="u1")
    old.add_messages([HumanMessage(content="I am allergic to shellfish."),
                      AIMessage(content="I'll keep that in mind."),
                      HumanMessage(content="My daughter is called Ines."),
                      AIMessage(content="Lovely name.")])
    episode = old.end_session()  # no LLM configured: extracted by rules
    assert episode is not None
    assert old.messages  # the raw turns are kept
    new = TieredChatMessageHistory(memory, session_id="dinner", user_id="u1", include_memory=True)
    new.add_messages([HumanMessage(content="Can I eat the seafood paella?")])
    lead = new.messages[0]
    assert isinstance(lead, SystemMessage) and "shellfish" in lead.text
    assert "## Known facts about the user" in lead.text or "## Relevant past sessions" in lead.text


@pytest.mark.parametrize(("blocked", "name", "package"), [
    ("langchain_core", None, "langchain-core"),
    ("langchain_classic", "TieredConversationMemory", "langchain-classic"),
    ("langgraph", "TieredMemoryStore", "langgraph"),
])
def test_missing_packages_name_the_extra(blocked: str, name: str | None, package: str) -> None:
    import subprocess

    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from tiered_memory import MissingDependencyError\n"
            "try:\n"
            "    import langchain_tiered_memory as lc\n"
            f"    getattr(lc, {name!r})\n"
            "except MissingDependencyError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"'{package}' is not installed" in out
    assert 'pip install "tiered-memory[langchain]"' in out


def test_bulky_optional_fields_are_dropped_to_fit_the_metadata_limit(memory: TieredMemory) -> None:
    from langchain_tiered_memory.messages import fit_metadata

    big = ToolMessage(content="done", tool_call_id="c9", id="t9", artifact={"blob": "x" * 100_000},
                      response_metadata={"small": 1})
    history = TieredChatMessageHistory(memory, session_id="s", user_id="u")
    call = AIMessage(content="", tool_calls=[{"name": "run", "args": {}, "id": "c9", "type": "tool_call"}])
    history.add_messages([HumanMessage(content="run it"), call, big])
    back = history.messages[-1]
    assert isinstance(back, ToolMessage) and back.tool_call_id == "c9" and back.id == "t9"
    assert back.artifact is None and back.response_metadata == {"small": 1}
    stored = memory.get_messages("s", user_id="u")[-1]
    assert stored.metadata["langchain"]["dropped"] == ["artifact"]
    small = {"type": "ai", "data": {"id": "x", "additional_kwargs": {"k": "v"}}}
    assert fit_metadata(small, 64_000) is small
    assert fit_metadata(small, 10)["dropped"] == ["additional_kwargs"]  # best effort, never the id
    assert fit_metadata(small, 10)["data"] == {"id": "x"}


def test_a_turn_with_an_inline_image_over_the_metadata_limit_is_stored_as_its_text(memory: TieredMemory) -> None:
    # a photo sent as base64 is easily larger than max_metadata_bytes; LangChain's own histories
    # keep it, and refusing it would fail the whole chain call after the model has answered
    photo = "A" * (memory.config.max_metadata_bytes + 10_000)
    small = {"type": "image", "url": "https://example.com/cat.png"}
    history = TieredChatMessageHistory(memory, "s", user_id="u")
    history.add_messages([
        HumanMessage(content=[{"type": "text", "text": "What is in this photo?"},
                              {"type": "image", "base64": photo, "mime_type": "image/png"}], id="h1"),
        AIMessage("A cat.", id="a1"),
        HumanMessage(content=[{"type": "text", "text": "And this one?"}, small], id="h2"),
    ])
    back = history.messages
    assert back[0] == HumanMessage(content="What is in this photo?", id="h1")  # the text, without the photo
    assert back[1:] == [AIMessage("A cat.", id="a1"),
                        HumanMessage(content=[{"type": "text", "text": "And this one?"}, small], id="h2")]
    assert memory.get_messages("s", user_id="u")[0].metadata["langchain"]["dropped"] == ["content"]


def test_session_id_is_positional_as_in_every_langchain_history(memory: TieredMemory) -> None:
    positional = TieredChatMessageHistory(memory, "s1", user_id="u1")
    positional.add_messages([HumanMessage("hi"), AIMessage("hello")])
    by_name = TieredChatMessageHistory(memory, session_id="s1", user_id="u1")
    assert [m.text for m in by_name.messages] == ["hi", "hello"]
    with pytest.raises(TypeError):
        TieredChatMessageHistory(memory, "s1", "u1")  # type: ignore[misc]  # user_id only by name
    with pytest.raises(InvalidInputError, match="session_id"):
        TieredChatMessageHistory(memory, "", user_id="u1")


@pytest.mark.parametrize(("bad", "match"), [
    ("not a message", "message 1: expected a LangChain BaseMessage, got str"),
    ({"role": "user", "content": "hi"}, "message 1: expected a LangChain BaseMessage, got dict"),
    (None, "message 1: expected a LangChain BaseMessage, got NoneType"),
])
def test_a_bad_message_in_a_bulk_write_is_named_and_nothing_is_stored(memory: TieredMemory, bad: Any,
                                                                      match: str) -> None:
    history = TieredChatMessageHistory(memory, "s", user_id="u")
    with pytest.raises(InvalidInputError, match=match):
        history.add_messages([HumanMessage("fine"), bad, AIMessage("also fine")])
    with pytest.raises(InvalidInputError, match="message 0: cannot store a LangChain 'remove' message"):
        history.add_messages([RemoveMessage(id="x")])
    assert history.messages == []


@pytest.mark.parametrize("make", [
    lambda mem: TieredChatMessageHistory(mem, "s", user_id="u", include_memory=True, max_tokens=0),
    lambda mem: TieredChatMessageHistory(mem, "s", user_id="u", max_tokens="500"),
    lambda mem: history_factory(mem, max_tokens=-1),
    lambda mem: TieredChatMessageHistory("./memory", "s", user_id="u"),  # type: ignore[arg-type]
    lambda mem: history_factory("./memory"),  # type: ignore[arg-type]
])
def test_bad_arguments_are_refused_when_the_history_is_built(memory: TieredMemory, make: Any) -> None:
    with pytest.raises(InvalidInputError, match="max_tokens|memory must be a TieredMemory"):
        make(memory)


async def test_a_read_made_while_a_write_runs_is_not_held_past_that_write(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    """A history that holds its reads (``history_factory``'s) forgets what it holds when it
    writes; a read made while its own write was still running (a concurrent task, or one
    cancelled by a timeout and left running) was held after that write had returned, so every
    later read missed the written messages."""
    held = HeldEmbedder(embedder)
    memory = make_memory("held-reads", embedder=held)
    history = history_factory(memory)(user_id="u", session_id="s")
    await history.aadd_messages([HumanMessage("I live in Lisbon")])
    held.hold()
    writing = asyncio.create_task(history.aadd_messages([HumanMessage("I moved to Porto")]))
    assert await asyncio.to_thread(held.entered.wait, 60)  # the write waits in the embedder: nothing committed
    during = await history.aget_messages()
    held.release()
    await writing
    assert [m.content for m in during] == ["I live in Lisbon"]
    assert [m.content for m in await history.aget_messages()] == ["I live in Lisbon", "I moved to Porto"]
    assert [m.content for m in history.messages] == ["I live in Lisbon", "I moved to Porto"]


def test_a_reply_whose_metadata_holds_a_float_json_cannot_is_stored(memory: TieredMemory) -> None:
    # a model's logprobs may be -inf (or nan): the core stores JSON, which has no such number, so the
    # reply was refused and, recorded after a call (RunnableWithMessageHistory, the agent middleware),
    # failed it; such a float is kept as its repr, as an object JSON cannot hold is
    history = TieredChatMessageHistory(memory, "s1", user_id="u1")
    reply = AIMessage("Hi.", id="a1", response_metadata={"logprobs": [-0.5, float("-inf"), float("nan")]},
                      additional_kwargs={"score": float("inf")})
    history.add_messages([HumanMessage("Hello"), reply])
    assert history.messages[1].response_metadata == {"logprobs": [-0.5, "-inf", "nan"]}
    assert memory.get_messages("s1", user_id="u1")[1].metadata["langchain"]["data"]["additional_kwargs"] == {
        "score": "inf"}
