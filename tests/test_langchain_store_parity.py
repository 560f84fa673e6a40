"""TieredMemoryStore run through the scenarios of LangGraph's own store tests
(libs/checkpoint/tests/test_store.py, libs/checkpoint-sqlite/tests/test_store.py,
libs/checkpoint-postgres/tests/test_store.py): what those tests assert of InMemoryStore,
SqliteStore and PostgresStore, asserted of ours. The behaviours test_langchain_store_reference.py
already compares side by side are not repeated. Where ours differs on purpose (users are isolated:
``docs/langgraph_store.md``), the test says so and checks our side.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, cast

import pytest
from langgraph.store.base import GetOp, Item, ListNamespacesOp, MatchCondition, Op, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from langchain_tiered_memory import TieredMemoryEmbeddings, TieredMemoryStore
from tiered_memory import StaticEmbedder, TieredMemory

#: the torch-free embedder: these scenarios need any embedder, and a fast one keeps them fast
EMBEDDER = StaticEmbedder()


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    return make_memory("parity", embedder=EMBEDDER)


@pytest.fixture
def shared(memory: TieredMemory) -> TieredMemoryStore:
    """Every namespace shared (no user label), so ``*`` is LangGraph's wildcard at every position."""
    return TieredMemoryStore(memory, user_namespace=lambda namespace, key: None, fields=["text"])


def _namespaces(store: Any, prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
    return {i.namespace for i in store.search(prefix, limit=100)}


def test_a_search_prefix_stops_at_label_boundaries_and_is_literal_and_case_sensitive(shared: TieredMemoryStore) -> None:
    # SqliteStore: test_search_namespace_segment_boundary, _wildcard_chars_are_literal, _is_case_sensitive,
    # test_search_empty_prefix_is_unconstrained
    spaces = [("foo",), ("foo", "child"), ("foo", "child", "deep"), ("foobar",), ("foobar", "baz"), ("foo2",),
              ("user_1",), ("user_1", "child"), ("userX1",), ("a%b",), ("axxb",), ("star*",), ("starX",),
              ("Foo",), ("a\x1fb",), ("a", "b")]
    for ns in spaces:
        shared.put(ns, "k", {"v": 1})
    assert _namespaces(shared, ("foo",)) == {("foo",), ("foo", "child"), ("foo", "child", "deep")}
    assert _namespaces(shared, ("foobar",)) == {("foobar",), ("foobar", "baz")}
    assert _namespaces(shared, ("foo2",)) == {("foo2",)}
    assert _namespaces(shared, ("fo",)) == set()
    assert _namespaces(shared, ("user_1",)) == {("user_1",), ("user_1", "child")}
    assert _namespaces(shared, ("a%b",)) == {("a%b",)}
    assert _namespaces(shared, ("star*",)) == {("star*",)}
    assert _namespaces(shared, ("Foo",)) == {("Foo",)}
    assert _namespaces(shared, ("a",)) == {("a", "b")}  # not ("a\x1fb",): the separator is escaped
    assert _namespaces(shared, ("a\x1fb",)) == {("a\x1fb",)}
    assert _namespaces(shared, ()) == set(spaces)


LISTED = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f"),
          ("b", "a", "f"), ("users", "123"), ("users", "456", "settings"), ("admin", "users", "789"),
          ("uid", "users", "alice"), ("uid", "users", "malice"), ("uid", "a", "b", "alice"), ("users", "alice\n"),
          ("q?m",), ("qXm",), ("br[ack]et",), ("brXacXket",), ("br[ack]et", "child"), ("plus+",), ("plusX",)]

LISTINGS: list[dict[str, Any]] = [
    {}, {"prefix": ("a", "b")}, {"suffix": ("f",)}, {"prefix": ("a",), "suffix": ("f",)},
    {"prefix": ("a", "b"), "max_depth": 3}, {"prefix": ("a", "b"), "limit": 2}, {"prefix": ("a", "b"), "offset": 2},
    {"prefix": ("a", "*", "f")}, {"suffix": ("*", "f")}, {"prefix": ("nonexistent",)}, {"prefix": ("users", "123")},
    {"prefix": ("users", "*")}, {"prefix": ("*", "users"), "suffix": ("*", "settings")}, {"max_depth": 2},
    {"suffix": ("alice",)}, {"prefix": ("uid", "*", "alice")}, {"prefix": ("uid",)}, {"prefix": ("users", "alice")},
    {"prefix": ("q?m",)}, {"prefix": ("br[ack]et",)}, {"prefix": ("br[ack]et", "child")}, {"prefix": ("plus+",)},
    {"prefix": ("a",), "max_depth": 1}, {"limit": 5, "offset": 15}, {"suffix": ("*",), "max_depth": 2},
]


def test_list_namespaces_answers_as_langgraphs_stores(shared: TieredMemoryStore) -> None:
    # test_store.py: test_list_namespaces_basic, _with_wildcards, _pagination, _max_depth; SqliteStore:
    # test_list_namespaces_segment_boundary, _metacharacter_labels, test_namespace_labels_with_trailing_newline
    reference = InMemoryStore()
    for store in (shared, reference):
        for n, ns in enumerate(LISTED):
            store.put(ns, f"id_{n}", {"data": n})
    for kwargs in LISTINGS:
        assert shared.list_namespaces(**kwargs) == reference.list_namespaces(**kwargs), kwargs


def test_list_namespaces_keeps_the_user_label_literal_unlike_langgraph(memory: TieredMemory) -> None:
    # docs/langgraph_store.md: users are isolated, so "*" at the user's position is that user, not a wildcard
    store = TieredMemoryStore(memory)
    for ns in [("u1", "a"), ("u2", "a"), ("*", "a")]:
        store.put(ns, "k", {"v": 1})
    assert store.list_namespaces(prefix=("*",)) == [("*", "a")]
    assert store.list_namespaces(suffix=("a",)) == [("*", "a"), ("u1", "a"), ("u2", "a")]


def test_filters_as_langgraphs_sql_stores(shared: TieredMemoryStore) -> None:
    # SqliteStore: test_filter_keys_with_hyphens_and_digits, test_numeric_filter_safety,
    # test_boolean_filter_safety, test_sql_injection_filter_values, test_sql_injection_vulnerability
    shared.put(("docs",), "hyphen", {"access-level": "public", "user": {"access-level": "nested"}})
    shared.put(("docs",), "digit", {"123abc": "ok", "user": {"123abc": "ok2"}})
    shared.put(("docs",), "quote", {"title": "O'Brien's Document", "access": "public"})
    for n, (price, active) in enumerate([(10, True), (20, False), (30, True), (-10, True)]):
        shared.put(("items",), f"item{n}", {"price": price, "active": active})

    def keys(prefix: tuple[str, ...], flt: dict[str, Any]) -> list[str]:
        return sorted(i.key for i in shared.search(prefix, filter=flt))

    assert keys(("docs",), {"access-level": "public"}) == ["hyphen"]
    assert keys(("docs",), {"user.access-level": "nested"}) == ["hyphen"]
    assert keys(("docs",), {"123abc": "ok"}) == ["digit"]
    assert keys(("docs",), {"user.123abc": "ok2"}) == ["digit"]
    assert keys(("docs",), {"title": "O'Brien's Document"}) == ["quote"]
    for injected in ["public' OR '1'='1", "public'; --", "public' UNION SELECT * FROM items --",
                     "public\x00' OR '1'='1", "''''", "public' OR 'א'='א"]:
        assert keys(("docs",), {"access": injected}) == []
    with pytest.raises(ValueError, match="Invalid filter key"):
        shared.search(("docs",), filter={"access') = 'public' OR '1'='1' OR json_extract(value, '$.": "x"})
    assert keys(("items",), {"price": {"$gt": 15}}) == ["item1", "item2"]
    assert keys(("items",), {"price": {"$lt": float("inf")}}) == ["item0", "item1", "item2", "item3"]
    assert keys(("items",), {"price": {"$gt": float("-inf")}}) == ["item0", "item1", "item2", "item3"]
    assert keys(("items",), {"price": {"$eq": float("nan")}}) == []
    assert keys(("items",), {"price": {"$lt": 10 ** 100}}) == ["item0", "item1", "item2", "item3"]
    assert keys(("items",), {"price": {"$lt": 0}}) == ["item3"]
    assert keys(("items",), {"active": True}) == ["item0", "item2", "item3"]
    assert keys(("items",), {"active": False}) == ["item1"]


def test_a_ranked_search_pages_with_offset_and_an_empty_query_lists(shared: TieredMemoryStore) -> None:
    # test_vector_search_pagination, test_vector_search_edge_cases
    for n in range(5):
        shared.put(("test",), f"doc{n}", {"text": f"test document number {n}"})
    first = shared.search(("test",), query="test", limit=2)
    second = shared.search(("test",), query="test", limit=2, offset=2)
    every = shared.search(("test",), query="test", limit=10)
    assert [h.key for h in every] == [h.key for h in first + second] + [every[4].key] and len(every) == 5
    scores = [h.score for h in every]
    assert None not in scores and scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    for query in ["", None, "test " * 100, "test!@#$%^&*()"]:
        assert len(shared.search(("test",), query=query)) == 5, query
    assert all(h.score is None for h in shared.search(("test",), query=""))


def test_per_put_index_paths_and_index_false_as_langgraphs_stores(shared: TieredMemoryStore) -> None:
    # test_embed_with_path_operation_config: a path the value lacks is no error; index=False is listed
    shared.put(("test",), "doc3", {"key0": "red bicycle", "key1": "blue sea", "key2": "ccc"}, index=["key0", "key1"])
    shared.put(("test",), "doc4", {"key0": "green apple", "key1": "blue sea", "key3": "snowy mountain"},
               index=["key1", "key3", "missing[0].x"])
    shared.put(("test",), "doc5", {"key0": "red bicycle"}, index=False)
    assert shared.search(("test",), query="a red bicycle", limit=1)[0].key == "doc3"
    assert shared.search(("test",), query="snowy mountain", limit=1)[0].key == "doc4"
    ranked = {h.key: h.score for h in shared.search(("test",), query="a red bicycle")}
    assert set(ranked) == {"doc3", "doc4", "doc5"} and ranked["doc5"] is None
    assert sorted(i.key for i in shared.search(("test",))) == ["doc3", "doc4", "doc5"]


def test_batch_answers_in_the_order_of_its_operations(shared: TieredMemoryStore) -> None:
    # test_batch_order
    shared.put(("test", "foo"), "key1", {"data": "value1"})
    shared.put(("test", "bar"), "key2", {"data": "value2"})
    ops: list[Op] = [GetOp(("test", "foo"), "key1"), PutOp(("test", "bar"), "key2", {"data": "value2"}),
                     SearchOp(("test",), filter={"data": "value1"}, limit=10, offset=0),
                     ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
                     GetOp(("test",), "key3")]
    results = shared.batch(cast(Iterable[Op], ops))
    assert isinstance(results[0], Item) and results[0].value == {"data": "value1"} and results[1] is None
    assert [i.key for i in cast(list[Item], results[2])] == ["key1"]
    assert results[3] == [("test", "bar"), ("test", "foo")] and results[4] is None
    reordered = shared.batch([SearchOp(("test",), filter=None, limit=5, offset=0), GetOp(("test", "bar"), "key2"),
                              ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("foo",)),), limit=5),
                              PutOp(("test",), "key3", {"data": "value3"}), GetOp(("test", "foo"), "key1")])
    assert [i.key for i in cast(list[Item], reordered[0])] == ["key2", "key1"]  # the put above made key2 newest
    assert cast(Item, reordered[1]).key == "key2" and reordered[2] == [("test", "foo")] and reordered[3] is None
    assert cast(Item, reordered[4]).value == {"data": "value1"}
    assert cast(Item, shared.get(("test",), "key3")).value == {"data": "value3"}


def test_a_put_past_the_public_api_may_use_the_reserved_root_as_in_langgraph(shared: TieredMemoryStore) -> None:
    # test_cannot_put_empty_namespace: put() refuses the root "langgraph"; a batch's PutOp does not
    shared.batch([PutOp(("langgraph", "foo"), "bar", {"foo": "bar"})])
    assert cast(Item, shared.get(("langgraph", "foo"), "bar")).value == {"foo": "bar"}
    assert shared.search(("langgraph", "foo"))[0].value == {"foo": "bar"}
    shared.put(("foo", "langgraph", "foo"), "bar", {"foo": "bar"})
    assert cast(Item, shared.get(("foo", "langgraph", "foo"), "bar")).value == {"foo": "bar"}


def test_nested_field_paths_rank_and_score_as_in_memory_store(memory: TieredMemory) -> None:
    # test_embed_with_path and get_text_at_path's syntax: an index into a list (negative too), a
    # wildcard, several fields in braces, the whole value; an item scores as its best path's text
    embed = TieredMemoryEmbeddings(EMBEDDER)
    reference = InMemoryStore(index={"dims": len(embed.embed_query("dims")), "embed": embed, "fields": ["$"]})
    ours = TieredMemoryStore(memory, fields=["$"])
    puts: list[tuple[str, dict[str, Any], list[str] | None]] = [
        ("first", {"a": {"b": ["a red bicycle", "a blue car"]}}, ["a.b[0]"]),
        ("last", {"notes": [{"t": "green tea"}, {"t": "a snowy mountain"}]}, ["notes[-1].t"]),
        ("braces", {"title": "jazz records", "meta": {"y": "a grey cat"}, "z": "tax forms"}, ["{title,meta.y}"]),
        ("star", {"k1": "sailing boats", "k2": "fresh bread"}, ["*"]),
        ("whole", {"text": "piano lessons on Sunday", "n": 3}, None),
    ]
    for store in (ours, reference):
        for key, value, index in puts:
            store.put(("u1", "paths"), key, value, index=index)
    for query in ["bicycle", "a blue car", "mountains", "green tea", "a cat", "tax forms", "bread", "piano"]:
        mine = [(h.key, h.score) for h in ours.search(("u1",), query=query)]
        theirs = [(h.key, h.score) for h in reference.search(("u1",), query=query)]
        assert [k for k, _ in mine] == [k for k, _ in theirs], query
        assert all(abs(float(s or 0) - float(t or 0)) < 1e-4 for (_, s), (_, t) in zip(mine, theirs)), query
