"""TieredMemoryStore through LangGraph's BaseStore API."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp

from langchain_tiered_memory import TieredMemoryStore
from langchain_tiered_memory.store import item_text
from tiered_memory import TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _fill(store: TieredMemoryStore) -> None:
    store.put(("u1", "prefs"), "drink", {"text": "Drinks green tea every morning", "stars": 5})
    store.put(("u1", "prefs"), "music", {"text": "Listens to jazz while coding", "stars": 3})
    store.put(("u1", "work", "projects"), "atlas", {"text": "Leads the Atlas mapping project", "stars": 4})
    store.put(("u2", "prefs"), "drink", {"text": "Drinks espresso", "stars": 2})


def test_put_get_search_delete(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory, fields=["text"])
    _fill(store)
    item = store.get(("u1", "prefs"), "drink")
    assert item is not None and item.value["stars"] == 5 and item.namespace == ("u1", "prefs")
    assert item.created_at.tzinfo is not None
    hits = store.search(("u1",), query="what does she drink in the morning?", limit=2)
    assert hits[0].key == "drink" and hits[0].value["text"].startswith("Drinks green tea")
    assert hits[0].score is not None and len(hits) == 2
    assert all(h.namespace[0] == "u1" for h in store.search(("u1",), query="espresso coffee", limit=10))
    # filters, with LangGraph's operators
    assert [h.key for h in store.search(("u1",), filter={"stars": {"$gte": 4}}, limit=10)] == ["atlas", "drink"]
    assert [h.key for h in store.search(("u1", "prefs"), query="tea", filter={"stars": 3})] == ["music"]
    # pagination without a query: newest first
    assert [h.key for h in store.search(("u1",), limit=2, offset=1)] == ["music", "drink"]
    store.delete(("u1", "prefs"), "drink")
    assert store.get(("u1", "prefs"), "drink") is None
    assert "drink" not in [h.key for h in store.search(("u1",), query="green tea", limit=5)]


def test_list_namespaces(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory)
    _fill(store)
    assert store.list_namespaces() == [("u1", "prefs"), ("u1", "work", "projects"), ("u2", "prefs")]
    assert store.list_namespaces(prefix=("u1",)) == [("u1", "prefs"), ("u1", "work", "projects")]
    assert store.list_namespaces(suffix=("prefs",)) == [("u1", "prefs"), ("u2", "prefs")]
    # issue 17: at the user's position "*" is a user id, never a wildcard across users (this
    # listed u1's and u2's before); elsewhere, and in suffixes, it is LangGraph's wildcard
    assert store.list_namespaces(prefix=("*", "prefs")) == []
    assert store.list_namespaces(prefix=("u1", "*")) == [("u1", "prefs"), ("u1", "work", "projects")]
    assert store.list_namespaces(suffix=("*", "projects")) == [("u1", "work", "projects")]
    assert store.list_namespaces(max_depth=1) == [("u1",), ("u2",)]
    assert store.list_namespaces(limit=1, offset=1) == [("u1", "work", "projects")]


async def test_batch_reads_see_the_state_before_its_writes_as_in_langgraph(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u1", "notes"), "a", {"text": "Allergic to cats"})
    results = store.batch([
        PutOp(("u1", "notes"), "b", {"text": "Owns a bicycle"}),
        GetOp(("u1", "notes"), "a"),
        PutOp(("u1", "notes"), "a", None),  # delete: applied after the batch's reads
        GetOp(("u1", "notes"), "b"),  # not there yet: reads see the state before the batch
        SearchOp(("u1",), query="cats", limit=1),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("u1",)),)),
        PutOp(("u1", "notes"), "c", {"text": "first"}),
        PutOp(("u1", "notes"), "c", {"text": "Runs marathons"}),  # the last write per key wins
    ])
    assert results[0] is None and results[1].value == {"text": "Allergic to cats"}  # type: ignore[union-attr]
    assert results[3] is None
    assert [h.key for h in results[4]] == ["a"]  # type: ignore[union-attr]
    assert results[5] == [("u1", "notes")]
    assert store.get(("u1", "notes"), "a") is None  # the writes did happen, after the reads
    assert store.get(("u1", "notes"), "c").value == {"text": "Runs marathons"}  # type: ignore[union-attr]
    got = await store.abatch([GetOp(("u1", "notes"), "b"), SearchOp(("u1",), query="bicycle")])
    assert got[0].key == "b" and got[1][0].key == "b"  # type: ignore[union-attr,index]
    await store.aput(("u1", "notes"), "d", {"text": "Plays the cello"})  # awaited: the next call reads it
    assert (await store.asearch(("u1",), query="cello music", limit=1))[0].key == "d"


def test_index_false_and_per_item_fields(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u1", "n"), "secret", {"text": "The vault code is 1234"}, index=False)
    store.put(("u1", "n"), "pet", {"text": "irrelevant", "about": {"pet": "A parrot named Kiwi"}},
              index=["about.pet"])
    hits = store.search(("u1",), query="vault code", limit=2)
    assert hits[0].score is not None and hits[-1].score is None  # ranked items come first
    assert [h.score for h in hits if h.key == "secret"] == [None]  # unindexed: listed, never ranked
    assert store.search(("u1",), query="bird called Kiwi", limit=1)[0].key == "pet"


@pytest.mark.parametrize(("value", "fields", "expected"), [
    ({"text": "hi"}, ["text"], "hi"),
    ({"a": {"b": "x"}, "c": "y"}, ["a.b", "c"], "x\ny"),
    ({"notes": [{"t": "one"}, {"t": "two"}]}, ["notes[*].t"], "one\ntwo"),
    ({"text": "  "}, ["text"], None),
    ({"other": 1}, ["text"], None),
    ({"b": 1, "a": "z"}, ["$"], '{"a": "z", "b": 1}'),
])
def test_item_text_table(value: dict[str, object], fields: list[str], expected: str | None) -> None:
    assert item_text(value, fields) == expected


def test_user_position_forget_user_and_restart(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("store")
    store = TieredMemoryStore(memory, user_position=1)
    store.put(("memories", "u1"), "k", {"text": "Speaks Basque"})
    store.put(("memories", "u2"), "k", {"text": "Speaks Welsh"})
    # a namespace without a user label holds shared items (issue 17: this used to be refused);
    # a semantic search whose prefix names no user sees only those, never u1's or u2's
    store.put(("memories",), "k", {"text": "whose?"})
    assert [(h.namespace, h.value) for h in store.search(("memories",), query="languages")] == [
        (("memories",), {"text": "whose?"})]
    memory.close()
    reopened = make_memory("store")
    store = TieredMemoryStore(reopened, user_position=1)
    assert store.search(("memories", "u1"), query="which language")[0].value == {"text": "Speaks Basque"}
    reopened.forget_user("u1")
    assert store.get(("memories", "u1"), "k") is None
    assert store.get(("memories", "u2"), "k") is not None


def test_list_prefixes_and_the_index_config_view(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u1", "notes"), "k", {"text": "Collects vinyl records"})
    assert [h.key for h in store.search(["u1"])] == ["k"]  # type: ignore[arg-type]  # as LangGraph's SQL stores
    assert [h.key for h in store.search(["u1"], query="music collection")] == ["k"]  # type: ignore[arg-type]
    config = store.index_config
    assert config["fields"] == ["text"] and config["embed"] is store.embeddings is memory.embedder
    assert config["dims"] == len(memory.embedder.embed_query("probe"))


def test_a_narrow_search_ranks_its_own_items_when_the_user_has_better_matches_elsewhere(
        memory: TieredMemory) -> None:
    # more of the user's items match the query better than any under the prefix than one
    # candidate pool holds: the prefix's (and the filter's) items are still ranked and scored
    store = TieredMemoryStore(memory, fields=["text"])
    store.batch([PutOp(("u1", "big"), f"b{n}", {"text": f"green tea variety number {n}", "kind": "big"})
                 for n in range(memory.config.retrieval.candidates + 50)])
    store.put(("u1", "small"), "best", {"text": "Enjoys matcha and oolong tea", "kind": "small"})
    for n in range(6):  # newer than "best": a listing by age would put them first
        store.put(("u1", "small"), f"s{n}", {"text": f"Owns {n} red bicycles", "kind": "small"})
    store.put(("u1", "small"), "blank", {"note": "no text", "kind": "small"}, index=False)
    for prefix, filt in [(("u1", "small"), None), (("u1",), {"kind": "small"})]:
        hits = store.search(prefix, query="green tea", filter=filt, limit=8)
        assert hits[0].key == "best", (prefix, [h.key for h in hits])
        assert [h.score is not None for h in hits] == [True] * 7 + [False], (prefix, [(h.key, h.score) for h in hits])
        assert hits[-1].key == "blank"
        scores = [h.score for h in hits[:7]]
        assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
        assert {h.namespace for h in hits} == {("u1", "small")}


@pytest.mark.parametrize("limit, offset", [(sys.maxsize, 0), (2**40, 2**40), (3, sys.maxsize)])
def test_a_search_takes_any_limit_and_offset_a_listing_takes(memory: TieredMemory, limit: int, offset: int) -> None:
    # limit=sys.maxsize is the "every match" idiom LangGraph's InMemoryStore takes, with a query
    # or without; a query's candidate count was derived from it unbounded and overflowed the
    # record store's integers (OverflowError from SQLite, out of range in PostgreSQL)
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u1", "notes"), "tea", {"text": "Drinks green tea"})
    store.put(("u1", "notes"), "bike", {"text": "Rides a red bicycle"})
    store.put(("u1", "notes"), "blank", {"note": "no text"}, index=False)
    listed = store.search(("u1",), limit=limit, offset=offset)
    ranked = store.search(("u1",), query="green tea", limit=limit, offset=offset)
    assert len(ranked) == len(listed) == (3 if offset == 0 else 0)
    if ranked:
        assert [h.key for h in ranked] == ["tea", "bike", "blank"]
        assert ranked[0].score is not None and ranked[-1].score is None


def test_a_store_over_a_closed_memory_says_so(make_memory: Callable[..., TieredMemory]) -> None:
    from tiered_memory import UsageError

    memory = make_memory("closing")
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u1", "notes"), "a", {"text": "hello"})
    memory.close()
    for call in (lambda: store.get(("u1", "notes"), "a"), lambda: store.put(("u1", "notes"), "b", {"text": "x"}),
                 lambda: store.search(("u1",), query="hello"), lambda: store.list_namespaces()):
        with pytest.raises(UsageError, match="closed"):
            call()


@pytest.mark.parametrize("bad", [("notes.archive",), ("u1", ""), ("u1", 7)])
async def test_a_batch_with_a_label_langgraph_refuses_fails_whole_and_writes_nothing(
        memory: TieredMemory, bad: tuple[object, ...]) -> None:
    # LangGraph's SQL stores check every operation handed to batch()/abatch() with its
    # label rules (no ".", no empty label, only str), not only those made by put()/get()
    from langgraph.store.base import InvalidNamespaceError

    store = TieredMemoryStore(memory)
    store.put(("notes", "archive"), "k", {"kept": True})
    ns: tuple[str, ...] = bad  # type: ignore[assignment]
    for op in (GetOp(ns, "k"), PutOp(ns, "k", {"kept": False}), PutOp(ns, "k", None), SearchOp(ns),
               ListNamespacesOp((MatchCondition("prefix", ns),)), ListNamespacesOp((MatchCondition("suffix", ns),))):
        with pytest.raises(InvalidNamespaceError):
            store.batch([PutOp(("fresh",), "k", {"new": 1}), op])
        with pytest.raises(InvalidNamespaceError):
            await store.abatch([PutOp(("fresh",), "k", {"new": 1}), op])
    got = store.get(("notes", "archive"), "k")
    assert got is not None and got.value == {"kept": True}
    assert store.get(("fresh",), "k") is None and store.list_namespaces() == [("notes", "archive")]
    # the wildcard of a pattern and an empty search prefix stay valid
    assert store.batch([SearchOp(()), ListNamespacesOp((MatchCondition("prefix", ("notes", "*")),))]) == [
        [store.search(("notes",))[0]], [("notes", "archive")]]


@pytest.mark.parametrize("value", [{"tags": {"a", "b"}}, {"blob": b"\x00\x01"}, {"score": float("nan")},
                                   {"when": __import__("datetime").date(2026, 1, 2)}, ["not", "a", "dict"],
                                   # JSON turns these keys into strings: {1: "a", "1": "b"} came back as {"1": "b"}
                                   {1: "int key"}, {"a": {2: "nested"}}, {1: "a", "1": "b"}, {"l": [{None: 0}]}])
async def test_a_value_that_is_no_json_object_is_a_type_error_as_in_langgraph_and_nothing_is_written(
        memory: TieredMemory, value: object) -> None:
    # LangGraph's SQL stores fail on such values with their JSON encoder's TypeError: code
    # catching that catches ours, which is also the library's InvalidInputError
    from tiered_memory.errors import InvalidInputError

    store = TieredMemoryStore(memory)
    for put in (lambda: store.put(("u1", "n"), "bad", value),  # type: ignore[arg-type]
                lambda: store.batch([PutOp(("u1", "n"), "good", {"a": 1}), PutOp(("u1", "n"), "bad", value)])):  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="dict|JSON") as raised:
            put()
        assert isinstance(raised.value, InvalidInputError)
    with pytest.raises(TypeError):
        await store.aput(("u1", "n"), "bad", value)  # type: ignore[arg-type]
    assert store.search(("u1",)) == [] and memory.item_store().count() == 0


@pytest.mark.parametrize("index", ["text", True, ["text", 5], [""]])
async def test_an_index_that_is_no_list_of_paths_is_refused_and_nothing_is_written(memory: TieredMemory,
                                                                                   index: object) -> None:
    # index="text" was read as the paths "t", "e", "x", "t" (the item was stored, unsearchable by
    # its text); index=True raised a bare TypeError after the batch's reads had run
    from tiered_memory.errors import InvalidInputError

    store = TieredMemoryStore(memory)
    for put in (lambda: store.put(("u1", "n"), "bad", {"text": "green tea"}, index=index),  # type: ignore[arg-type]
                lambda: store.batch([PutOp(("u1", "n"), "good", {"a": 1}),
                                     PutOp(("u1", "n"), "bad", {"text": "green tea"}, index=index)])):  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="index"):
            put()
    with pytest.raises(InvalidInputError, match="index"):
        await store.aput(("u1", "n"), "bad", {"text": "green tea"}, index=index)  # type: ignore[arg-type]
    assert memory.item_store().count() == 0


@pytest.mark.parametrize("given", ["./memory", None, object()])
def test_a_store_over_what_is_no_memory_is_refused_when_built(given: object) -> None:
    """Every other LangChain adapter refuses what is no TieredMemory when it is built; the store
    took it, and its first call raised ``AttributeError: 'str' object has no attribute
    'item_store'`` (``TieredMemoryStore("./memory")``, a path where the memory goes), an untyped
    error the Guarantees' Bad input section rules out."""
    from tiered_memory.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="memory must be a TieredMemory"):
        TieredMemoryStore(given)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", ["text", [5], [""]])
def test_fields_that_are_no_list_of_paths_are_refused(memory: TieredMemory, fields: object) -> None:
    from tiered_memory.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="fields"):
        TieredMemoryStore(memory, fields=fields)  # type: ignore[arg-type]
    store = TieredMemoryStore(memory, fields=("text",))  # a tuple of paths is a list of paths
    store.put(("u1", "n"), "tea", {"text": "green tea", "other": "zzz"})
    assert [h.key for h in store.search(("u1",), query="green tea")] == ["tea"]


@pytest.mark.parametrize("max_depth", [0, -1, "2", 2.5, True])
async def test_a_max_depth_that_is_no_depth_is_refused_not_guessed(memory: TieredMemory, max_depth: object) -> None:
    # max_depth=-1 listed every namespace less its last label and the root (), as ("u1",) and ();
    # 0 listed (), which holds no item; "2" raised a bare TypeError; True was read as 1
    from tiered_memory.errors import InvalidInputError

    store = TieredMemoryStore(memory)
    store.put(("u1", "prefs", "food"), "k", {"a": 1})
    store.put(("u1", "work"), "k", {"a": 1})
    for listing in (lambda: store.list_namespaces(max_depth=max_depth),  # type: ignore[arg-type]
                    lambda: store.batch([PutOp(("u2",), "k", {"a": 1}), ListNamespacesOp(max_depth=max_depth)])):  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="max_depth"):
            listing()
    with pytest.raises(InvalidInputError, match="max_depth"):
        await store.alist_namespaces(max_depth=max_depth)  # type: ignore[arg-type]
    assert store.get(("u2",), "k") is None  # the batch it was in wrote nothing
    assert store.list_namespaces(max_depth=1) == [("u1",)]
    assert store.list_namespaces(max_depth=2) == [("u1", "prefs"), ("u1", "work")]


async def test_an_empty_namespace_for_an_item_fails_as_langgraph_refuses_it_and_nothing_runs(
        make_memory: Callable[..., TieredMemory]) -> None:
    # get((), k), delete((), k) and a GetOp/PutOp of () raised the core's plain InvalidInputError
    # (no InvalidNamespaceError, which code written against LangGraph's stores catches) and only
    # when the batch ran: a get's TTL refresh earlier in the same batch had been written by then
    from langgraph.store.base import InvalidNamespaceError

    class Clock:
        t = 1_800_000_000.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    store = TieredMemoryStore(make_memory(clock=clock), ttl={"default_ttl": 10, "refresh_on_read": True})
    store.put(("u1",), "k", {"a": 1})
    clock.t += 6 * 60
    for call in (lambda: store.get((), "k"), lambda: store.delete((), "k"), lambda: store.put((), "k", {"a": 2}),
                 lambda: store.batch([GetOp(("u1",), "k"), PutOp((), "k", {"a": 2})]),
                 lambda: store.batch([GetOp(("u1",), "k"), GetOp((), "k")])):
        with pytest.raises(InvalidNamespaceError, match="empty"):
            call()
    with pytest.raises(InvalidNamespaceError, match="empty"):
        await store.abatch([GetOp(("u1",), "k"), PutOp((), "k", None)])
    with pytest.raises(InvalidNamespaceError, match="empty"):
        await store.aget((), "k")
    with pytest.raises(InvalidNamespaceError, match="empty"):
        await store.adelete((), "k")
    clock.t += 6 * 60  # 12 minutes after the put: no get in a refused batch restarted its clock
    assert store.get(("u1",), "k", refresh_ttl=False) is None
    assert store.memory.item_store().count() == 1  # that item, expired, not swept


def test_a_put_whose_vectors_the_engine_refuses_says_so_typed_and_the_next_call_ranks_it(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    # the rows commit before the vectors go in (two engines): a custom engine's error escaped the put
    # raw (RuntimeError), and the stored item stayed unranked (score None) for the life of the store
    # object, whose repair runs once, at its first call
    from tiered_memory.errors import VectorIndexError
    from tiered_memory.testing import FailingVectorIndex
    from tiered_memory.vector.chroma import ChromaVectorIndex

    index = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "v")), fail_on=[], times=1)
    store = TieredMemoryStore(make_memory("failing", vector_store=index), fields=["text"])
    store.put(("u1", "n"), "bike", {"text": "Rides a red bicycle"})
    index.fail_on = {"upsert"}
    with pytest.raises(VectorIndexError, match="1 store items were not indexed") as raised:
        store.put(("u1", "n"), "tea", {"text": "Drinks green tea"})
    assert "simulated vector engine failure" in str(raised.value)
    assert store.get(("u1", "n"), "tea").value == {"text": "Drinks green tea"}  # type: ignore[union-attr]
    hits = store.search(("u1",), query="green tea")
    assert [(h.key, h.score is not None) for h in hits] == [("tea", True), ("bike", True)]
    # the engine failing a search, or the deletion of an overwritten item's old vectors (before the rows
    # commit: nothing is written), is a VectorIndexError too, and the rows stay as they were
    for fails, call in [("query", lambda: store.search(("u1",), query="bicycle")),
                        ("delete", lambda: store.put(("u1", "n"), "bike", {"text": "Rides a blue bicycle"})),
                        ("delete", lambda: store.delete(("u1", "n"), "tea"))]:
        index.fail_on, index.failures = {fails}, 0
        with pytest.raises(VectorIndexError, match="simulated vector engine failure"):
            call()
        index.fail_on = set()
    assert store.get(("u1", "n"), "bike").value == {"text": "Rides a red bicycle"}  # type: ignore[union-attr]
    assert [h.key for h in store.search(("u1",), query="green tea")] == ["tea", "bike"]
