"""Bad input to the adapters is one of the library's typed errors, with nothing stored.

The adapters that are pydantic models, as their frameworks' classes are, refuse a bad
constructor argument with an ``InvalidArgumentsError``: the library's ``InvalidInputError``
and pydantic's ``ValidationError`` at once, so ``except ValidationError`` (LangChain's and
LlamaIndex's habit around such a constructor) and ``except TieredMemoryError`` both catch it.
A LangChain message whose own fields no JSON can hold, a chain's inputs that are no mapping,
a retriever's ``search_kwargs`` that is no mapping, and a store's bad options are
``InvalidInputError`` too, where a bare ``TypeError``, ``ValueError``, ``RecursionError`` or
``UnicodeEncodeError`` escaped before. So are pydantic's own entry points (``model_validate``...),
a flag that is no bool (a truthy ``"no"`` meant yes), a chain key that is no str, and a bad
namespace on every method of the LangGraph store (``NamespaceLabelError``, LangGraph's error
too). Real LangChain, LangGraph and LlamaIndex objects.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import numpy as np
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableLambda
from langgraph.store.base import GetOp
from llama_index.core.llms import ChatMessage
from pydantic import ValidationError

from langchain_tiered_memory.storable import REPAIRED_KEY
from langchain_tiered_memory import (NamespaceLabelError, TieredChatMessageHistory, TieredConversationMemory,
                                     TieredMemoryMiddleware, TieredMemoryRetriever, TieredMemoryStore, from_stored,
                                     history_factory, with_tiered_memory)
from llamaindex_tiered_memory import TieredMemoryBlock, TieredMemoryEmbedding, WriteThroughMemory, offline_tokenizer
from tiered_memory import InvalidArgumentsError, InvalidInputError, TieredMemory, TieredMemoryError


def _cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    inner = value
    for _ in range(levels):
        inner["a"] = {}
        inner = inner["a"]
    return value


@pytest.fixture
def memory(reused_memory: TieredMemory) -> TieredMemory:
    """The module's one memory (conftest's ``reused_memory``, user ``"u"`` forgotten after each
    test): these tests are about what the adapters refuse, not about a memory's contents or its
    model, and a memory opened for each of them was most of the module's time."""
    return reused_memory


# (what, build the adapter from the memory and the bad arguments, the bad arguments, the field named)
CONSTRUCTORS: list[tuple[str, Callable[..., Any], dict[str, Any], str]] = [
    ("classic empty user", TieredConversationMemory, {"user_id": "", "session_id": "s"}, "user_id"),
    ("classic user not a str", TieredConversationMemory, {"user_id": 5, "session_id": "s"}, "user_id"),
    ("classic no session", TieredConversationMemory, {"user_id": "u"}, "session_id"),
    ("classic max_tokens 0", TieredConversationMemory, {"user_id": "u", "session_id": "s", "max_tokens": 0},
     "max_tokens"),
    ("classic misspelt option", TieredConversationMemory, {"user_id": "u", "session_id": "s", "retrun_messages": 1},
     "retrun_messages"),
    ("retriever empty user", TieredMemoryRetriever, {"user_id": ""}, "user_id"),
    ("retriever blank session", TieredMemoryRetriever, {"user_id": "u", "session_id": " "}, "session_id"),
    ("retriever k 0", TieredMemoryRetriever, {"user_id": "u", "k": 0}, "k"),
    ("retriever k -1", TieredMemoryRetriever, {"user_id": "u", "k": -1}, "k"),
    ("retriever mmr", TieredMemoryRetriever, {"user_id": "u", "search_type": "mmr"}, "mmr"),
    ("retriever misspelt option", TieredMemoryRetriever, {"user_id": "u", "fliters": {}}, "fliters"),
    ("block empty user", TieredMemoryBlock, {"user_id": ""}, "user_id"),
    ("block max_tokens 0", TieredMemoryBlock, {"user_id": "u", "max_tokens": 0}, "max_tokens"),
    ("block max_tokens -1", TieredMemoryBlock, {"user_id": "u", "max_tokens": -1}, "max_tokens"),
    ("block misspelt option", TieredMemoryBlock, {"user_id": "u", "every_tunr": True}, "every_tunr"),
]


@pytest.mark.parametrize("make, arguments, field", [c[1:] for c in CONSTRUCTORS], ids=[c[0] for c in CONSTRUCTORS])
def test_a_pydantic_adapter_refuses_a_bad_argument_with_both_typed_errors(
        memory: TieredMemory, make: Callable[..., Any], arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInputError, match=field) as caught:
        make(memory=memory, **arguments)
    assert isinstance(caught.value, InvalidArgumentsError)
    assert isinstance(caught.value, ValidationError)  # what LangChain and LlamaIndex code catches
    assert caught.value.errors(), "pydantic's details are there too"


@pytest.mark.parametrize("make, arguments, field", [c[1:] for c in CONSTRUCTORS], ids=[c[0] for c in CONSTRUCTORS])
def test_model_validate_refuses_a_bad_argument_with_the_constructors_typed_error(
        memory: TieredMemory, make: Any, arguments: dict[str, Any], field: str) -> None:
    # pydantic's own entry points raised its plain ValidationError, which except InvalidInputError missed
    with pytest.raises(InvalidArgumentsError, match=field) as caught:
        make.model_validate({"memory": memory, **arguments})
    assert isinstance(caught.value, ValidationError) and caught.value.errors()
    for validate in (make.model_validate_json, make.model_validate_strings):  # no memory in JSON or strings
        text = json.dumps(arguments)
        with pytest.raises(InvalidArgumentsError) as caught:
            validate(text if validate == make.model_validate_json else json.loads(text))
        assert isinstance(caught.value, ValidationError) and caught.value.errors()


def test_model_validate_of_write_through_memory_is_the_typed_error_and_good_arguments_still_validate(
        memory: TieredMemory) -> None:
    block = TieredMemoryBlock(memory=memory, user_id="u")
    with pytest.raises(InvalidArgumentsError, match="every_turn=True"):
        WriteThroughMemory.model_validate({"session_id": "s", "memory_blocks": [block],
                                           "tokenizer_fn": offline_tokenizer(), "token_limit": 3000})
    assert TieredMemoryBlock.model_validate({"memory": memory, "user_id": "u", "max_tokens": 9}).max_tokens == 9
    assert TieredMemoryRetriever.model_validate({"memory": memory, "user_id": "u", "k": 2}).k == 2
    assert TieredConversationMemory.model_validate({"memory": memory, "user_id": "u", "session_id": "s"}).user_id == "u"
    eager = TieredMemoryBlock(memory=memory, user_id="u", every_turn=True)
    chat = WriteThroughMemory.model_validate({"session_id": "s", "memory_blocks": [eager],
                                              "tokenizer_fn": offline_tokenizer(), "token_limit": 3000})
    assert chat.memory_blocks == [eager]


@pytest.mark.parametrize("arguments, field", [({"embed_batch_size": 0}, "embed_batch_size"),
                                              ({"model_name": 5}, "model_name")], ids=["batch size 0", "name 5"])
def test_the_llamaindex_embedding_refuses_a_bad_argument_with_the_typed_error(arguments: dict[str, Any],
                                                                            field: str) -> None:
    # a LlamaIndex BaseEmbedding, a pydantic model too: its refusals were pydantic's plain ValidationError
    for make in (TieredMemoryEmbedding, TieredMemoryEmbedding.model_validate):
        with pytest.raises(InvalidArgumentsError, match=field) as caught:
            make(**arguments) if make is TieredMemoryEmbedding else make(arguments)
        assert isinstance(caught.value, ValidationError)


@pytest.mark.parametrize("make", [TieredConversationMemory, TieredMemoryRetriever, TieredMemoryBlock])
def test_a_pydantic_adapter_given_no_memory_is_a_typed_error(make: Callable[..., Any]) -> None:
    with pytest.raises(InvalidArgumentsError, match="memory") as caught:
        make(memory="/tmp/a-folder", user_id="u", session_id="s")
    assert isinstance(caught.value, ValidationError)


def test_write_through_memory_with_a_block_not_every_turn_is_a_typed_error(memory: TieredMemory) -> None:
    block = TieredMemoryBlock(memory=memory, user_id="u")
    with pytest.raises(InvalidArgumentsError, match="every_turn=True") as caught:
        WriteThroughMemory.from_defaults(session_id="s", memory_blocks=[block], tokenizer_fn=offline_tokenizer())
    assert isinstance(caught.value, ValidationError)


def test_the_typed_constructor_error_pickles(memory: TieredMemory) -> None:
    import pickle

    with pytest.raises(InvalidArgumentsError) as caught:
        TieredMemoryRetriever(memory=memory, user_id="")
    again = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(again, InvalidArgumentsError) and str(again) == str(caught.value)


@pytest.mark.parametrize("search_kwargs", ["k=2", 5, ["k"]])
def test_retriever_search_kwargs_that_is_no_mapping_is_a_typed_error(memory: TieredMemory,
                                                                     search_kwargs: Any) -> None:
    with pytest.raises(InvalidInputError, match="search_kwargs"):
        TieredMemoryRetriever(memory=memory, user_id="u", search_kwargs=search_kwargs)
    retriever = TieredMemoryRetriever(memory=memory, user_id="u")
    retriever.search_kwargs = search_kwargs  # as on VectorStoreRetriever, read at each call
    with pytest.raises(InvalidInputError, match="search_kwargs"):
        retriever.invoke("tea")


# additional_kwargs LangChain keeps as given, which no JSON can hold
UNSTORABLE_FIELDS = {
    "a key that is a tuple": {("a", 1): "x"},
    "a value that holds itself": _cyclic(),
    "nesting deeper than the stack": _deep(5000),
    "a lone surrogate": {"note": "a\ud800b"},
}


@pytest.mark.parametrize("fields", list(UNSTORABLE_FIELDS.values()), ids=list(UNSTORABLE_FIELDS))
def test_a_message_whose_fields_no_json_can_hold_is_refused_and_nothing_is_stored(
        memory: TieredMemory, fields: dict[Any, Any]) -> None:
    history = TieredChatMessageHistory(memory, "s", user_id="u")
    history.add_messages([HumanMessage("kept"), AIMessage("kept too")])
    with pytest.raises(InvalidInputError, match="message 1"):
        history.add_messages([HumanMessage("fine"), HumanMessage("hello", additional_kwargs=fields)])
    assert [m.content for m in history.messages] == ["kept", "kept too"]
    # a chain records the turn after it answered: there the message is stored without those fields
    # and marked, not refused (langchain_tiered_memory/storable.py, tests/test_langchain_chain_storable.py)
    chain = with_tiered_memory(RunnableLambda(lambda _: "answer"), memory)
    assert chain.invoke({"input": HumanMessage("hello", additional_kwargs=fields)},
                        {"configurable": {"user_id": "u", "session_id": "s"}}) == "answer"
    stored = memory.get_messages("s", user_id="u")
    assert [m.content for m in stored] == ["kept", "kept too", "hello", "answer"]
    assert REPAIRED_KEY in stored[2].metadata and REPAIRED_KEY not in stored[3].metadata


@pytest.mark.parametrize("inputs, outputs", [
    (None, {"output": "hi"}), ("hello", {"output": "hi"}), ({"input": "hello"}, None),
    ({"input": "hello"}, "hi"), ({"input": "hello"}, ["hi"]),
], ids=["inputs None", "inputs a str", "outputs None", "outputs a str", "outputs a list"])
def test_classic_memory_given_inputs_or_outputs_that_are_no_mapping_is_a_typed_error(
        memory: TieredMemory, inputs: Any, outputs: Any) -> None:
    classic = TieredConversationMemory(memory=memory, user_id="u", session_id="s")
    with pytest.raises(InvalidInputError, match="inputs" if not isinstance(inputs, dict) else "outputs"):
        classic.save_context(inputs, outputs)
    if not isinstance(inputs, dict):
        with pytest.raises(InvalidInputError, match="inputs"):
            classic.load_memory_variables(inputs)
    assert memory.get_messages("s", user_id="u") == []


@pytest.mark.parametrize("user_namespace", [5, ("memories.v2", "{user_id}"), ("", "{user_id}")],
                         ids=["not labels", "a label with a period", "an empty label"])
def test_a_store_user_namespace_no_namespace_can_match_is_refused(memory: TieredMemory, user_namespace: Any) -> None:
    with pytest.raises(InvalidInputError, match="user_namespace"):
        TieredMemoryStore(memory, user_namespace=user_namespace)


@pytest.mark.parametrize("interval", ["5", -1, 0.0, float("nan")])
def test_a_bad_sweep_interval_is_a_typed_error_that_names_it(memory: TieredMemory, interval: Any) -> None:
    store = TieredMemoryStore(memory, ttl={"default_ttl": 5})
    with pytest.raises(InvalidInputError, match="sweep_interval_minutes"):
        store.start_ttl_sweeper(interval)
    assert store.stop_ttl_sweeper()


def test_from_stored_given_no_stored_message_is_a_typed_error() -> None:
    with pytest.raises(InvalidInputError, match="StoredMessage"):
        from_stored(HumanMessage("hi"))  # type: ignore[arg-type]


def test_the_middleware_refuses_an_unknown_option_as_python_does(memory: TieredMemory) -> None:
    # a plain class: a misspelt keyword is Python's TypeError, as for every function (kept)
    with pytest.raises(TypeError):
        TieredMemoryMiddleware(memory, include_recnet=True)  # type: ignore[call-arg]


def test_every_error_above_is_one_of_the_librarys(memory: TieredMemory) -> None:
    """The sweep of this module's inputs in one place: no bare exception escapes."""
    calls: list[Callable[[], Any]] = [
        lambda: TieredMemoryBlock(memory=memory, user_id=""),
        lambda: TieredMemoryRetriever(memory=memory, user_id="u", search_kwargs="k"),
        lambda: TieredChatMessageHistory(memory, "s", user_id="u").add_messages(
            [HumanMessage("x", additional_kwargs={(1,): 2})]),
        lambda: TieredConversationMemory(memory=memory, user_id="u", session_id="s").save_context(None, None),
        lambda: TieredMemoryStore(memory, user_namespace=5),
        lambda: asyncio.run(TieredMemoryBlock(memory=memory, user_id="u").aput([ChatMessage(role="user", content="x")],
                                                                              session_id="")),
    ]
    for call in calls:
        with pytest.raises(TieredMemoryError):
            call()


@pytest.mark.parametrize("namespace", [(), ("langgraph", "u")], ids=["empty", "langgraph's root"])
def test_a_namespace_langgraph_refuses_to_put_is_its_error_and_ours(memory: TieredMemory,
                                                                    namespace: tuple[str, ...]) -> None:
    from langgraph.store.base import InvalidNamespaceError

    store = TieredMemoryStore(memory)
    puts: list[Callable[[], Any]] = [lambda: store.put(namespace, "k", {"a": 1}),
                                     lambda: asyncio.run(store.aput(namespace, "k", {"a": 1}))]
    for put in puts:
        with pytest.raises(InvalidNamespaceError) as caught:  # LangGraph's contract for put, kept
            put()
        assert isinstance(caught.value, InvalidInputError)
    assert store.list_namespaces() == []


# ---- flags: True or False (numpy's too), never any truthy value ------------------------------
# (what, the call given the flag, the option named, whether None is the option's "not given")
FLAG_OPTIONS: list[tuple[str, Callable[[TieredMemory, Any], Any], str, bool]] = [
    ("history include_memory", lambda m, v: TieredChatMessageHistory(m, "s", user_id="u", include_memory=v),
     "include_memory", False),
    ("history hold_reads", lambda m, v: TieredChatMessageHistory(m, "s", user_id="u", hold_reads=v), "hold_reads", False),
    ("history_factory include_memory", lambda m, v: history_factory(m, include_memory=v), "include_memory", False),
    ("middleware include_recent", lambda m, v: TieredMemoryMiddleware(m, include_recent=v), "include_recent", False),
    ("middleware record", lambda m, v: TieredMemoryMiddleware(m, record=v), "record", False),
    ("middleware include_items", lambda m, v: TieredMemoryMiddleware(m, include_items=v), "include_items", False),
    ("runnable include_items", lambda m, v: with_tiered_memory(RunnableLambda(lambda _: "answer"), m, include_items=v),
     "include_items", False),
    ("store TTLConfig refresh_on_read", lambda m, v: TieredMemoryStore(m, ttl={"default_ttl": 5, "refresh_on_read": v}),
     "refresh_on_read", False),
    ("store TTLConfig omit_expired", lambda m, v: TieredMemoryStore(m, ttl={"default_ttl": 5, "omit_expired": v}),
     "omit_expired", False),
    ("store get refresh_ttl", lambda m, v: TieredMemoryStore(m).get(("u",), "k", refresh_ttl=v), "refresh_ttl", True),
    ("store search refresh_ttl", lambda m, v: TieredMemoryStore(m).search(("u",), refresh_ttl=v), "refresh_ttl", True),
    ("store aget refresh_ttl", lambda m, v: asyncio.run(TieredMemoryStore(m).aget(("u",), "k", refresh_ttl=v)),
     "refresh_ttl", True),
    ("store asearch refresh_ttl", lambda m, v: asyncio.run(TieredMemoryStore(m).asearch(("u",), refresh_ttl=v)),
     "refresh_ttl", True),
    ("store batch GetOp refresh_ttl", lambda m, v: TieredMemoryStore(m).batch([GetOp(("u",), "k", refresh_ttl=v)]),
     "refresh_ttl", False),
    ("block aput from_short_term_memory", lambda m, v: asyncio.run(TieredMemoryBlock(memory=m, user_id="u").aput(
        [ChatMessage(role="user", content="I live in Lisbon")], from_short_term_memory=v, session_id="s")),
     "from_short_term_memory", False),
]
# "no" and "False" are truthy: they meant yes. 0 and 1 are refused as the core refuses them
# (MemoryConfig, include_items): an int where a flag goes is likelier a count given to the wrong keyword
NOT_FLAGS = ["no", "False", "", 0.5, [True], 1, 0]


@pytest.mark.parametrize("call, option, optional", [f[1:] for f in FLAG_OPTIONS], ids=[f[0] for f in FLAG_OPTIONS])
def test_a_flag_that_is_no_bool_is_a_typed_error_naming_it_and_nothing_is_stored(
        memory: TieredMemory, call: Callable[[TieredMemory, Any], Any], option: str, optional: bool) -> None:
    for value in NOT_FLAGS + ([] if optional else [None]):
        with pytest.raises(InvalidInputError, match=option):
            call(memory, value)
    assert memory.get_messages("s", user_id="u") == []  # the block's refused put stored nothing
    for value in (True, False, np.True_, np.False_) + ((None,) if optional else ()):
        call(memory, value)


def test_a_flag_is_kept_as_a_python_bool(memory: TieredMemory) -> None:
    history = TieredChatMessageHistory(memory, "s", user_id="u", include_memory=np.True_, hold_reads=np.False_)
    middleware = TieredMemoryMiddleware(memory, include_recent=np.True_, record=np.False_, include_items=np.True_)
    runnable = with_tiered_memory(RunnableLambda(lambda _: "answer"), memory, include_items=np.True_)
    kept = [history.include_memory, history.hold_reads, middleware.include_recent, middleware.record,
            middleware.include_items, runnable.include_items]
    assert kept == [True, False, True, False, True, True] and all(type(k) is bool for k in kept)


def test_a_refused_refresh_ttl_restarts_no_clock(make_memory: Callable[..., TieredMemory]) -> None:
    # refresh_ttl="no" was truthy: a store configured not to refresh on read restarted the item's TTL
    class Clock:
        t = 1_800_000_000.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    store = TieredMemoryStore(make_memory(clock=clock), ttl={"default_ttl": 10, "refresh_on_read": False})
    store.put(("u1",), "k", {"a": 1})
    clock.t += 6 * 60
    for read in (lambda: store.get(("u1",), "k", refresh_ttl="no"),
                 lambda: store.search(("u1",), refresh_ttl="no"),
                 lambda: asyncio.run(store.aget(("u1",), "k", refresh_ttl="no"))):
        with pytest.raises(InvalidInputError, match="refresh_ttl"):
            read()
    clock.t += 6 * 60  # 12 minutes after the put: no refused read restarted its clock
    assert store.get(("u1",), "k") is None


# LangGraph's own store tests (libs/checkpoint/tests/test_store_namespace_validation.py) refuse
# these on get, delete, search and list_namespaces' prefix and suffix, sync and async
BAD_NAMESPACES = {
    "a label with a period": (("foo.bar",), "periods"),
    "an empty label": (("foo", ""), "empty"),
    "a label that is no str": (("foo", 123), "must be strings"),
    "a NUL": (("a\x00b",), "NUL"),
    "no tuple at all": (5, "tuple of strings"),
}


@pytest.mark.parametrize("namespace, says", list(BAD_NAMESPACES.values()), ids=list(BAD_NAMESPACES))
async def test_a_bad_namespace_is_our_error_and_langgraphs_on_every_method_and_nothing_runs(
        memory: TieredMemory, namespace: Any, says: str) -> None:
    # BaseStore's get, search, delete and list_namespaces check labels before batch() with
    # LangGraph's plain InvalidNamespaceError (a namespace of 5: iterating it, a TypeError)
    from langgraph.store.base import InvalidNamespaceError

    store = TieredMemoryStore(memory, ttl={"default_ttl": 5})
    store.put(("foo",), "k", {"a": 1})
    calls: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "get": (lambda: store.get(namespace, "k"), lambda: store.aget(namespace, "k")),
        "delete": (lambda: store.delete(namespace, "k"), lambda: store.adelete(namespace, "k")),
        "put": (lambda: store.put(namespace, "k", {"a": 2}), lambda: store.aput(namespace, "k", {"a": 2})),
        "search": (lambda: store.search(namespace, query="a"), lambda: store.asearch(namespace, query="a")),
        "prefix": (lambda: store.list_namespaces(prefix=namespace), lambda: store.alist_namespaces(prefix=namespace)),
        "suffix": (lambda: store.list_namespaces(suffix=namespace), lambda: store.alist_namespaces(suffix=namespace)),
    }
    for name, (call, acall) in calls.items():
        with pytest.raises(NamespaceLabelError, match=says) as caught:
            call()
        assert isinstance(caught.value, InvalidNamespaceError), name
        with pytest.raises(NamespaceLabelError, match=says):
            await acall()
    got = store.get(("foo",), "k")
    assert got is not None and got.value == {"a": 1} and store.list_namespaces() == [("foo",)]


@pytest.mark.parametrize("option, value", [("input_messages_key", ["input"]), ("input_messages_key", None),
                                           ("history_messages_key", ""), ("history_messages_key", 5),
                                           ("output_messages_key", ("output",)), ("output_messages_key", 5)])
def test_a_chain_key_that_is_no_str_is_refused_when_the_chain_is_wrapped(memory: TieredMemory, option: str,
                                                                          value: Any) -> None:
    # were taken, and failed at the first call, if at all: a list key as a bare TypeError
    # (unhashable), an empty history key as the prompt's missing variable, an output key 5 never
    answer = RunnableLambda(lambda _: {"output": "answer"})
    with pytest.raises(InvalidInputError, match=option):
        with_tiered_memory(answer, memory, **{option: value})
    assert with_tiered_memory(answer, memory, output_messages_key=None).invoke(
        {"input": "hi"}, {"configurable": {"user_id": "u", "session_id": "s"}}) == {"output": "answer"}
