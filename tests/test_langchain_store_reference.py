"""TieredMemoryStore beside LangGraph's own ``InMemoryStore``: the same operations on both, the
same answers.

Users swap the store in for ``InMemoryStore`` (or ``PostgresStore``), so each test runs one
script of operations on both stores (``InMemoryStore`` embedding with the memory's own embedder,
through ``TieredMemoryEmbeddings``) and compares what they return. Where the two differ on
purpose (``docs/langgraph_store.md``, "The differences that remain"), the test names the
difference and checks our side of it, so a change of either side fails here.
"""

from __future__ import annotations

import asyncio
import types
from collections import OrderedDict
from typing import Any, Callable

import pytest
from langgraph.store.base import BaseStore, GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from langchain_tiered_memory import TieredMemoryEmbeddings, TieredMemoryStore
from tiered_memory import Embedder, TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

Stores = tuple[TieredMemoryStore, InMemoryStore]

NOTES = [  # distinct texts: no two items tie on a query, so both stores rank them alike
    (("u1", "prefs"), "drink", {"text": "Drinks green tea every morning", "stars": 5, "lang": "en",
                                "meta": {"source": "chat", "n": 1}, "tags": ["tea", "morning"]}),
    (("u1", "prefs"), "music", {"text": "Listens to jazz records while coding", "stars": 3, "lang": "fr",
                                "meta": {"source": "form", "n": 2}, "tags": ["jazz"]}),
    (("u1", "work", "projects"), "atlas", {"text": "Leads the Atlas mapping project at work", "stars": 4,
                                           "lang": "en", "meta": {"source": "chat", "n": 3}, "tags": []}),
    (("u1", "work"), "commute", {"text": "Cycles to the office on a red bicycle", "stars": 2, "lang": "de",
                                 "meta": {"source": "chat", "n": 4}, "tags": ["bike", "red"]}),
    (("u1", "pets"), "cat", {"text": "Has a grey cat called Miso", "stars": 1, "lang": "en",
                             "meta": {"source": "form", "n": 5}, "tags": ["cat"]}),
]


@pytest.fixture
def stores(memory: TieredMemory, embedder: Embedder) -> Stores:
    embed = TieredMemoryEmbeddings(embedder)
    reference = InMemoryStore(index={"dims": len(embed.embed_query("dims")), "embed": embed, "fields": ["text"]})
    return TieredMemoryStore(memory, fields=["text"]), reference


def fill(stores: Stores, notes: list[tuple[tuple[str, ...], str, dict[str, Any]]] = NOTES) -> None:
    for store in stores:
        for namespace, key, value in notes:
            store.put(namespace, key, value)


def both(stores: Stores, read: Callable[[BaseStore], Any]) -> tuple[Any, Any]:
    return read(stores[0]), read(stores[1])


def ranked(hits: list[Any]) -> list[tuple[tuple[str, ...], str, float | None]]:
    return [(h.namespace, h.key, h.score) for h in hits]


def close(ours: Any, theirs: Any) -> bool:
    """Equal, but for scores, within 1e-4 (ours come from float32 vectors, InMemoryStore's are float64)."""
    if isinstance(ours, float) and isinstance(theirs, float):
        return abs(ours - theirs) < 1e-4
    if isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)):
        return len(ours) == len(theirs) and all(close(o, t) for o, t in zip(ours, theirs))
    return bool(ours == theirs)


def keys(hits: list[Any]) -> list[str]:
    return [h.key for h in hits]


def test_get_put_update_and_delete_answer_as_in_memory_store(stores: Stores) -> None:
    fill(stores)
    for namespace, key, value in NOTES:
        ours, theirs = both(stores, lambda s: s.get(namespace, key))
        assert (ours.namespace, ours.key, ours.value) == (theirs.namespace, theirs.key, theirs.value) == (
            namespace, key, value)
        assert ours.created_at.tzinfo is not None and ours.updated_at >= ours.created_at
    assert both(stores, lambda s: s.get(("u1", "prefs"), "nothing")) == (None, None)
    assert both(stores, lambda s: s.get(("u9", "never", "written"), "drink")) == (None, None)
    for store in stores:
        store.put(("u1", "prefs"), "music", {"text": "Listens to blues", "stars": 4})
        store.delete(("u1", "pets"), "cat")
        store.delete(("u1", "pets"), "never-there")  # deleting what is not there is no error
    ours, theirs = both(stores, lambda s: s.get(("u1", "prefs"), "music"))
    assert ours.value == theirs.value == {"text": "Listens to blues", "stars": 4}
    assert ours.updated_at > ours.created_at  # an update keeps created_at, as PostgresStore (InMemoryStore resets it)
    assert both(stores, lambda s: s.get(("u1", "pets"), "cat")) == (None, None)
    # a value is the caller's no more once put, and a read hands out a copy
    for store in stores:
        value = {"text": "Owns a kayak", "list": [1]}
        store.put(("u1", "boats"), "kayak", value)
        value["list"].append(2)
    # (InMemoryStore keeps dict(value), whose list is still the caller's: it reads [1, 2])
    assert stores[0].get(("u1", "boats"), "kayak").value == {"text": "Owns a kayak", "list": [1]}  # type: ignore[union-attr]


def test_a_mapping_that_is_no_dict_is_stored_as_in_memory_store(stores: Stores) -> None:
    # put() takes any Mapping (BaseStore's signature; InMemoryStore and SqliteStore store dict(value)).
    # A MappingProxyType was refused here with ItemValueError ("Object of type mappingproxy is not JSON
    # serializable") after the check had let it through as a Mapping
    for store in stores:
        store.put(("u1", "m"), "proxy", types.MappingProxyType({"text": "Reads poetry", "n": 1}))
        store.put(("u1", "m"), "ordered", OrderedDict(text="Writes haiku", n=2))
        store.batch([PutOp(("u1", "m"), "batched", types.MappingProxyType({"text": "Paints", "n": 3}))])
    for key, value in [("proxy", {"text": "Reads poetry", "n": 1}), ("ordered", {"text": "Writes haiku", "n": 2}),
                       ("batched", {"text": "Paints", "n": 3})]:
        ours, theirs = both(stores, lambda s: s.get(("u1", "m"), key))
        assert ours.value == theirs.value == value and type(ours.value) is dict
    assert both(stores, lambda s: sorted(keys(s.search(("u1", "m"), filter={"n": {"$gte": 2}})))) == (
        ["batched", "ordered"],) * 2


@pytest.mark.parametrize("query", ["what does she drink in the morning?", "music while programming",
                                   "bicycle", "pets at home", "the map project"])
def test_a_semantic_search_ranks_and_scores_as_in_memory_store(stores: Stores, query: str) -> None:
    fill(stores)
    ours, theirs = both(stores, lambda s: s.search(("u1",), query=query, limit=10))
    assert close(ranked(ours), ranked(theirs)) and len(ours) == len(NOTES)  # cosine similarities, both
    for prefix in [("u1", "work"), ("u1", "prefs")]:  # a deeper prefix, its items only
        deeper = both(stores, lambda s: ranked(s.search(prefix, query=query)))
        assert close(*deeper) and {n[:2] for n, _, _ in deeper[0]} == {prefix}
    for limit, offset in [(2, 0), (2, 2), (3, 4), (1, 5), (0, 0)]:  # pages of the same ranking
        page = both(stores, lambda s: ranked(s.search(("u1",), query=query, limit=limit, offset=offset)))
        assert close(*page), (limit, offset)


def test_index_fields_and_index_false_as_in_memory_store(stores: Stores) -> None:
    for store in stores:
        store.put(("u1", "n"), "pet", {"text": "irrelevant words", "about": {"pet": "A parrot named Kiwi"}},
                  index=["about.pet"])
        store.put(("u1", "n"), "tags", {"text": "x", "tags": ["sails a dinghy", "grows tomatoes"]}, index=["tags[*]"])
        store.put(("u1", "n"), "vault", {"text": "The vault code is 1234"}, index=False)
        store.put(("u1", "n"), "none", {"other": "no text field at all"})
    for query in ["a bird called Kiwi", "gardening vegetables", "boats and sailing"]:
        ours, theirs = both(stores, lambda s: s.search(("u1",), query=query, limit=10))
        # the ranked items first, in the same order and with the same score (an item scores as its
        # best field: tags[*] gives one vector per tag); then those without a vector, score None
        assert close(ranked(ours[:2]), ranked(theirs[:2]))
        assert {h.key for h in ours[2:]} == {h.key for h in theirs[2:]} == {"vault", "none"}
        assert [h.score for h in ours[2:]] == [None, None]
    # re-put with index=False (difference 12): InMemoryStore keeps the old vector (the item is still
    # ranked by the text it had); here the item has no vector any more, as its put asked
    for store in stores:
        store.put(("u1", "n"), "pet", {"text": "irrelevant words", "about": {"pet": "A parrot named Kiwi"}},
                  index=False)
    ours, theirs = both(stores, lambda s: {h.key: h.score for h in s.search(("u1",), query="parrot Kiwi")})
    assert ours["pet"] is None and theirs["pet"] is not None


FILTERS: list[dict[str, Any]] = [
    {"stars": 5}, {"stars": 5.0}, {"lang": "en"}, {"stars": {"$gt": 3}}, {"stars": {"$gte": 3, "$lt": 5}},
    {"stars": {"$lte": 2}}, {"stars": {"$ne": 3}}, {"lang": {"$eq": "fr"}}, {"lang": {"$ne": "en"}},
    {"meta": {"source": "chat"}}, {"meta": {"source": "chat", "n": 3}}, {"tags": ["tea", "morning"]}, {"tags": []},
    {"lang": "en", "stars": {"$gte": 4}}, {"lang": "xx"},
]


@pytest.mark.parametrize("filter", FILTERS, ids=[str(f) for f in FILTERS])
def test_filters_select_what_in_memory_store_selects(stores: Stores, filter: dict[str, Any]) -> None:
    fill(stores)
    listed = both(stores, lambda s: sorted(keys(s.search(("u1",), filter=filter))))
    assert listed[0] == listed[1]
    found = both(stores, lambda s: ranked(s.search(("u1",), query="morning drinks", filter=filter)))
    assert close(*found)


def test_filters_differ_from_in_memory_store_where_documented(stores: Stores) -> None:
    # docs/langgraph_store.md, difference 8: filters follow LangGraph's SQL stores
    for store in stores:
        store.put(("u1",), "with", {"y": 3, "flag": True, "a": {"b": 1}})
        store.put(("u1",), "without", {"flag": 1})
    ours, theirs = both(stores, lambda s: keys(s.search(("u1",), filter={"y": {"$ne": 2}})))
    assert ours == ["with"] and sorted(theirs) == ["with", "without"]  # an absent key is SQL NULL
    ours, theirs = both(stores, lambda s: keys(s.search(("u1",), filter={"flag": True})))
    assert ours == ["with"] and sorted(theirs) == ["with", "without"]  # a boolean is no number
    ours, theirs = both(stores, lambda s: keys(s.search(("u1",), filter={"a.b": 1})))
    assert ours == ["with"] and theirs == []  # a dotted key walks into the value, as SqliteStore does
    with pytest.raises(TypeError):  # InMemoryStore cannot order an absent key; here it is left out
        stores[1].search(("u1",), filter={"y": {"$gt": 1}})
    assert keys(stores[0].search(("u1",), filter={"y": {"$gt": 1}})) == ["with"]


def test_a_listing_pages_as_in_memory_store_newest_first(stores: Stores) -> None:
    fill(stores)
    for store in stores:
        store.put(("u1", "prefs"), "drink", {"text": "Drinks rooibos now", "stars": 5})  # updated: newest
    ours, theirs = both(stores, lambda s: s.search(("u1",), limit=100))
    assert sorted(keys(ours)) == sorted(keys(theirs)) and all(h.score is None for h in ours + theirs)
    # the order differs: newest update first here (PostgresStore's ORDER BY updated_at DESC), first
    # put first in InMemoryStore (docs/langgraph_store.md, difference 11)
    assert keys(ours) == ["drink", "cat", "commute", "atlas", "music"]
    assert keys(theirs) == ["drink", "music", "atlas", "commute", "cat"]
    pages = [keys(stores[0].search(("u1",), limit=2, offset=o)) for o in range(0, 6, 2)]
    assert sum(pages, []) == keys(ours)


NAMESPACES = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
              ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"), ("admin", "users", "789"),
              ("tenant", "a_%"), ("tenant", "abc"), ("FOO",), ("foo",), ("foobar",)]


@pytest.mark.parametrize("kwargs", [
    {}, {"prefix": ("a", "b")}, {"suffix": ("f",)}, {"prefix": ("a",), "suffix": ("f",)},
    {"prefix": ("a", "b"), "max_depth": 3}, {"max_depth": 1}, {"max_depth": 2, "limit": 3, "offset": 1},
    {"prefix": ("a", "b"), "limit": 2}, {"prefix": ("a", "b"), "offset": 2}, {"suffix": ("*", "f")},
    {"prefix": ("users", "*")}, {"prefix": ("tenant", "a_%")}, {"prefix": ("foo",)}, {"prefix": ("nothing",)},
    {"prefix": ("a", "b", "c", "d")}, {"suffix": ("a", "b", "c")}, {"prefix": ("a", "*", "f"), "suffix": ("*",)},
], ids=str)
def test_list_namespaces_as_in_memory_store(stores: Stores, kwargs: dict[str, Any]) -> None:
    # at user_position 0 a "*" in a pattern's first label is literal (difference 4): no pattern here has one
    fill(stores, [(ns, f"k{n}", {"n": n}) for n, ns in enumerate(NAMESPACES)])
    ours, theirs = both(stores, lambda s: s.list_namespaces(**kwargs))
    assert ours == theirs


def test_a_namespace_without_items_is_not_listed_as_in_sql_stores(stores: Stores) -> None:
    # difference 12: InMemoryStore lists a namespace emptied by deletes, or only read
    fill(stores)
    for store in stores:
        store.delete(("u1", "pets"), "cat")  # its namespace's only item
        store.get(("u2", "ghost"), "k")  # a read of a namespace never written
    ours, theirs = both(stores, lambda s: s.list_namespaces(prefix=("u1",)))
    assert ("u1", "pets") not in ours and ("u1", "pets") in theirs  # InMemoryStore keeps the emptied dict
    assert set(ours) == set(theirs) - {("u1", "pets")}
    assert both(stores, lambda s: ("u2", "ghost") in s.list_namespaces()) == (False, True)


def test_a_batch_reads_before_its_writes_and_answers_in_order_as_in_memory_store(stores: Stores) -> None:
    fill(stores)
    ops = [
        PutOp(("u1", "notes"), "new", {"text": "Bakes sourdough bread"}),
        # (listed before the get of ("u1", "notes"): InMemoryStore's get makes that namespace listed)
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("u1",)),), max_depth=2),
        GetOp(("u1", "notes"), "new"),  # not there yet
        GetOp(("u1", "prefs"), "drink"),
        PutOp(("u1", "prefs"), "drink", None),  # deleted after the reads
        SearchOp(("u1", "prefs"), filter={"stars": {"$gte": 3}}),
        SearchOp(("u1",), query="baking bread", limit=2),
        PutOp(("u1", "notes"), "twice", {"text": "first"}),
        PutOp(("u1", "notes"), "twice", {"text": "Plays chess on Sundays"}),  # the last write wins
        GetOp(("u1", "prefs"), "drink"),  # a read repeated in the batch: the same answer
    ]

    def shape(results: list[Any]) -> list[Any]:
        out: list[Any] = []
        for r in results:
            if r is None or isinstance(r, list) and (not r or isinstance(r[0], tuple)):
                out.append(r)
            elif isinstance(r, list):
                out.append(ranked(r) if r[0].score is not None else sorted(keys(r)))
            else:
                out.append((r.namespace, r.key, r.value))
        return out

    ours, theirs = both(stores, lambda s: shape(s.batch(ops)))
    assert [n for n, (o, t) in enumerate(zip(ours, theirs)) if not close(o, t)] == [], (ours, theirs)
    assert ours[2] is None and ours[3][1] == "drink" and ours[9] == ours[3]
    assert ("u1", "notes") not in ours[1]
    after = both(stores, lambda s: (s.get(("u1", "prefs"), "drink"), s.get(("u1", "notes"), "twice").value,
                                    keys(s.search(("u1", "notes"), query="baking bread", limit=1))))
    assert after[0] == after[1] == (None, {"text": "Plays chess on Sundays"}, ["new"])


async def test_concurrent_async_calls_end_as_in_memory_store(stores: Stores) -> None:
    # LangGraph's test_async_batched_vector_search_concurrent: puts, deletes and puts of the same keys
    # gathered at once (coalesced into one batch here, the last write per key winning), then searches
    colors, things = ["red", "blue", "green", "yellow", "purple"], ["apple", "car", "house", "book", "phone"]
    docs = [(f"doc{i}", {"text": f"{colors[i % 5]} {things[i % 5]} number {i}", "color": colors[i % 5], "index": i})
            for i in range(30)]

    async def script(store: BaseStore) -> list[Any]:
        await asyncio.gather(*[store.aput(("test",), k, v) for k, v in docs],
                             *[store.adelete(("test",), k) for k, _ in docs],
                             *[store.aput(("test",), k, v) for k, v in docs])
        found = await asyncio.gather(
            store.asearch(("test",), query="apple", filter={"color": "red"}),
            store.asearch(("test",), query="house", filter={"index": {"$gt": 12}}, limit=3),
            store.asearch(("test",), limit=100), store.aget(("test",), "doc7"), store.aget(("test",), "doc7"))
        await asyncio.gather(store.aput(("test",), "k", {"v": 1}), store.aput(("test",), "k", {"v": 2}))
        return [ranked(found[0]), ranked(found[1]), sorted(keys(found[2])), found[3].value, found[4].value,
                (await store.aget(("test",), "k")).value]  # type: ignore[union-attr]

    ours, theirs = await script(stores[0]), await script(stores[1])
    assert close(ours, theirs), (ours, theirs)
    assert len(ours[2]) == 30 and ours[5] == {"v": 2}


def test_a_semantic_search_never_crosses_owners_unlike_in_memory_store(stores: Stores) -> None:
    # docs/langgraph_store.md, difference 1: a query sees the one owner its prefix maps to
    fill(stores)
    for store in stores:
        store.put(("u2", "prefs"), "drink", {"text": "Drinks black coffee"})
    ours, theirs = both(stores, lambda s: keys(s.search((), query="coffee or tea", limit=10)))
    assert ours == [] and len(theirs) == len(NOTES) + 1
    ours, theirs = both(stores, lambda s: sorted(keys(s.search((), limit=10))))  # a listing is not scoped
    assert ours == theirs
    ours, theirs = both(stores, lambda s: ranked(s.search(("u2",), query="coffee or tea")))
    assert close(ours, theirs) and len(ours) == 1


def test_a_field_text_holding_the_field_separator_is_still_one_field(memory: TieredMemory, embedder: Embedder) -> None:
    # the core keeps an item's field texts in one text, split at "\x1e" (FIELD_SEP) into one vector each,
    # at most 16. A field whose own text held "\x1e" was split too: 20 of them pushed the next field
    # into the shared last vector, and that field no longer scored as itself (InMemoryStore: 1.0)
    embed = TieredMemoryEmbeddings(embedder)
    reference = InMemoryStore(index={"dims": len(embed.embed_query("dims")), "embed": embed, "fields": ["a", "b"]})
    stores = (TieredMemoryStore(memory, fields=["a", "b"]), reference)
    value = {"a": "\x1e".join(f"part {n}" for n in range(20)), "b": "Drinks green tea every morning"}
    for store in stores:
        store.put(("u1", "n"), "k", value)
    ours, theirs = both(stores, lambda s: ranked(s.search(("u1",), query="Drinks green tea every morning")))
    assert close(ours, theirs) and theirs[0][2] == pytest.approx(1.0, abs=1e-4), (ours, theirs)
    assert stores[0].get(("u1", "n"), "k").value == value  # type: ignore[union-attr]  # the value as it was put
