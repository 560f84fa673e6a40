"""The core item table (tiered_memory.items): pure decisions and the SQL/vector shell, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tiered_memory import ConfigurationError, InvalidInputError, StaticEmbedder, TieredMemory
from tiered_memory.backends import open_layer_store
from tiered_memory.layers.items import (
    ItemStore,
    ItemWrite,
    check_namespace,
    match_filter,
    match_namespace,
    truncate_namespaces,
)
from tiered_memory.layers.item_rules import page_of

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


@pytest.mark.parametrize(("value", "flt", "expected"), [
    ({"a": 1}, None, True),
    ({"a": 1}, {}, True),
    ({"a": 1}, {"a": 1}, True),
    ({"a": 1}, {"a": 2}, False),
    ({"a": 1}, {"b": 1}, False),
    ({"a": 5}, {"a": {"$gt": 4.99}}, True),
    ({"a": 5}, {"a": {"$gt": 5}}, False),
    ({"a": 5}, {"a": {"$gte": 5, "$lt": 6}}, True),
    ({"a": 5}, {"a": {"$lte": 4}}, False),
    ({"a": 5}, {"a": {"$lte": 5}}, True),
    ({"a": "x"}, {"a": {"$ne": "y"}}, True),
    ({"a": "x"}, {"a": {"$eq": "x"}}, True),
    ({"a": "x"}, {"a": {"$gt": 1}}, False),  # not a number: no match, no crash
    ({"a": None}, {"a": {"$lt": 1}}, False),
    ({"a": {"b": {"c": 1}, "d": 2}}, {"a": {"b": {"c": 1}}}, True),
    ({"a": {"b": 2}}, {"a": {"b": 1}}, False),
    ({"a": "scalar"}, {"a": {"b": 1}}, False),
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    ({"a": [1, 2]}, {"a": [1]}, False),
    ({"a": 1, "b": 2}, {"a": 1, "b": {"$ne": 2}}, False),
])
def test_match_filter_table(value: dict[str, Any], flt: dict[str, Any] | None, expected: bool) -> None:
    assert match_filter(value, flt) is expected


def test_match_filter_rejects_unknown_operators() -> None:
    with pytest.raises(InvalidInputError, match=r"\$regex"):
        match_filter({"a": 1}, {"a": {"$regex": "x"}})


@pytest.mark.parametrize(("ns", "pattern", "kind", "expected"), [
    (("u1", "memories"), ("u1",), "prefix", True),
    (("u1", "memories"), ("*", "memories"), "prefix", True),
    (("u1", "memories"), ("u2",), "prefix", False),
    (("u1", "memories"), ("memories",), "suffix", True),
    (("u1", "memories"), ("u1", "*"), "suffix", True),
    (("u1",), ("u1", "memories"), "prefix", False),
    (("u1", "memories"), (), "prefix", True),
])
def test_match_namespace_table(ns: tuple[str, ...], pattern: tuple[str, ...], kind: str, expected: bool) -> None:
    assert match_namespace(ns, pattern, kind) is expected


def test_truncate_namespaces_and_checks() -> None:
    assert truncate_namespaces([("a", "b", "c"), ("a", "b", "d"), ("a", "x")], 2) == [("a", "b"), ("a", "x")]
    assert truncate_namespaces([("b",), ("a",)], None) == [("a",), ("b",)]
    for bad in [(), ("",), ("a\x00b",), "not-a-tuple", (1,)]:
        with pytest.raises(InvalidInputError):
            check_namespace(bad)
    assert check_namespace((), allow_empty=True) == ()


def _put(items: ItemStore, user: str, ns: tuple[str, ...], key: str, value: dict[str, Any],
         text: str | None = None) -> None:
    items.write_many([ItemWrite(namespace=ns, key=key, user_id=user, value=value, text=text)])


def test_item_store_crud_search_and_forget_user(memory: TieredMemory) -> None:
    items = memory.item_store()
    value = {"text": "Prefers green tea in the morning", "tags": ["drink"]}
    _put(items, "u1", ("u1", "prefs"), "tea", value, text=value["text"])
    _put(items, "u1", ("u1", "prefs"), "editor", {"text": "Uses vim"}, text="Uses vim")
    _put(items, "u2", ("u2", "prefs"), "tea", {"text": "Prefers black tea"}, text="Prefers black tea")
    got = items.get(("u1", "prefs"), "tea")
    assert got is not None and got.value == value and got.user_id == "u1"
    hits = items.search(("u1",), query="what does the user drink?", user_id="u1", limit=5)
    assert hits[0].item.key == "tea" and hits[0].score is not None
    assert all(h.item.user_id == "u1" for h in hits)
    # items are not turns: conversation recall never sees them
    assert memory.search("green tea", user_id="u1") == []
    # overwrite keeps created_at and moves updated_at; delete removes the vector too
    _put(items, "u1", ("u1", "prefs"), "tea", {"text": "Switched to coffee"}, text="Switched to coffee")
    again = items.get(("u1", "prefs"), "tea")
    assert again is not None and again.created_at == got.created_at and again.updated_at >= got.updated_at
    assert items.search(("u1",), query="coffee", user_id="u1", limit=1)[0].item.value["text"] == "Switched to coffee"
    items.write_many([ItemWrite(namespace=("u1", "prefs"), key="editor", user_id="u1", value=None)])
    assert items.get(("u1", "prefs"), "editor") is None
    n_vectors_u1 = len([i for i in memory.index.ids("u1") if i.startswith("item:")])
    assert n_vectors_u1 == 1
    memory.forget_user("u1")
    assert items.count("u1") == 0 and items.count("u2") == 1
    assert not [i for i in memory.index.ids("u1") if i.startswith("item:")]


def test_item_store_bulk_write_is_validated_first(memory: TieredMemory) -> None:
    items = memory.item_store()
    with pytest.raises(InvalidInputError):
        items.write_many([
            ItemWrite(namespace=("u", "n"), key="ok", user_id="u", value={"a": 1}),
            ItemWrite(namespace=("u", "n"), key="bad", user_id="u", value={"a": float("nan")}),
        ])
    assert items.count() == 0
    with pytest.raises(InvalidInputError, match="NUL"):  # text PostgreSQL cannot hold is refused up front
        items.write_many([ItemWrite(namespace=("u", "n"), key="k", user_id="u", value={"a": 1}, text="a\x00b")])
    assert items.count() == 0
    with pytest.raises(InvalidInputError, match="needs the user"):
        items.search(("u",), query="x")


def test_item_vectors_come_back_after_rebuild_index(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("items-rebuild")
    items = memory.item_store()
    _put(items, "u", ("u", "n"), "k", {"t": "The office is in Porto"}, text="The office is in Porto")
    assert memory.rebuild_index()["items"] == 1  # rebuilt with the rest, not left to the next repair
    assert [i for i in memory.index.ids() if i.startswith("item:")]
    assert items.repair() == 0
    hits = items.search(("u",), query="where is the workplace", user_id="u")
    assert hits[0].score is not None and hits[0].item.key == "k"
    assert items.repair() == 0


def test_item_store_needs_a_sql_record_store() -> None:
    class NotSQL:
        store = object()

    with pytest.raises(ConfigurationError, match="SQLite or PostgreSQL"):
        open_layer_store(NotSQL().store)


@pytest.mark.parametrize(("value", "flt", "expected"), [
    # LangGraph's operators beyond comparison
    ({"a": "x"}, {"a": {"$in": ["x", "y"]}}, True),
    ({"a": "z"}, {"a": {"$in": ["x", "y"]}}, False),
    ({}, {"a": {"$in": ["x"]}}, False),
    ({"a": "z"}, {"a": {"$nin": ["x", "y"]}}, True),
    ({"a": "x"}, {"a": {"$nin": ["x", "y"]}}, False),
    ({}, {"a": {"$nin": ["x"]}}, True),
    ({"a": None}, {"a": {"$exists": True}}, True),
    ({}, {"a": {"$exists": True}}, False),
    ({}, {"a": {"$exists": False}}, True),
    # dotted keys walk into nested objects; a literal dotted key wins
    ({"a": {"b": {"c": 3}}}, {"a.b.c": 3}, True),
    ({"a": {"b": {"c": 3}}}, {"a.b.c": {"$gte": 3, "$lt": 4}}, True),
    ({"a": {"b": 1}}, {"a.c": {"$exists": True}}, False),
    ({"a.b": 1, "a": {"b": 2}}, {"a.b": 1}, True),
    # strings order as strings, numbers as numbers; bools are not numbers
    ({"d": "2024-05-01"}, {"d": {"$gt": "2024-01-01"}}, True),
    ({"n": 2}, {"n": {"$gt": "1"}}, False),
    ({"n": True}, {"n": 1}, False),
    ({"n": True}, {"n": {"$gt": 0}}, False),  # nor ordered as one, on either side
    ({"n": 1}, {"n": {"$gte": False}}, False),
    ({"n": 1.0}, {"n": 1}, True),
    # absent is NULL, as in the SQL stores
    ({}, {"a": None}, True),
    ({}, {"a": {"$eq": None}}, True),
    ({}, {"a": {"$ne": "x"}}, False),
    ({}, {"a": {"$gt": 0}}, False),
    # numbers compare exactly, as PostgreSQL's numeric does: an int past a float's range or
    # precision neither raises nor rounds
    ({"n": 10**400}, {"n": {"$gt": 1}}, True),
    ({"n": 5}, {"n": {"$lt": 10**400}}, True),
    ({"n": 10**400}, {"n": {"$gte": 1e308}}, True),
    ({"n": 2**70 + 1}, {"n": {"$gt": 2**70}}, True),
])
def test_match_filter_langgraph_operators_and_paths(value: dict[str, Any], flt: dict[str, Any],
                                                     expected: bool) -> None:
    assert match_filter(value, flt) is expected


@pytest.mark.parametrize("key", ["a b", "a'b", "a;--", "", "a..b", ".a", "a.", "a$"])
def test_an_invalid_filter_key_raises_like_langgraphs_sql_stores(key: str) -> None:
    with pytest.raises(InvalidInputError, match="Invalid filter key") as info:
        match_filter({"a": 1}, {key: 1})
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("flt", [{"a": {"$in": "x"}}, {"a": {"$exists": 1}}, {"a": {"$eq": 1, "b": 2}}])
def test_malformed_operators_raise(flt: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        match_filter({"a": 1}, flt)


def test_labels_take_any_character_but_nul_and_stay_apart(memory: TieredMemory) -> None:
    items = memory.item_store()
    odd = [("a\x1fb",), ("a", "b"), ("a\x1e2b",), ("*",), ("u.1",), ("tab\there", "\x7f")]
    items.write_many([ItemWrite(namespace=ns, key="k", user_id="u", value={"n": n}) for n, ns in enumerate(odd)])
    for n, ns in enumerate(odd):
        got = items.get(ns, "k")
        assert got is not None and got.value == {"n": n} and got.namespace == ns
    # a label holding the separator is one label: the ("a",) prefix does not reach it
    assert sorted(h.item.value["n"] for h in items.search(("a",))) == [1]
    assert [h.item.value["n"] for h in items.search(("*",))] == [3]  # "*" is literal in a prefix
    assert [h.item.value["n"] for h in items.search(("u",))] == []  # "u.1" is not under "u"
    assert set(items.namespaces()) == set(odd)


def test_search_scores_are_cosine_similarities(memory: TieredMemory) -> None:
    items = memory.item_store()
    items.write_many([
        ItemWrite(namespace=("u", "n"), key="tea", user_id="u", value={}, text="I prefer green tea in the morning"),
        ItemWrite(namespace=("u", "n"), key="car", user_id="u", value={}, text="My car is a red hatchback"),
    ])
    hits = items.search(("u",), query="which drink do I like?", user_id="u")
    assert [h.item.key for h in hits] == ["tea", "car"]
    scores = [h.score for h in hits]
    assert all(s is not None and -1.0 <= s <= 1.0 for s in scores)
    assert scores[0] is not None and scores[1] is not None and scores[0] - scores[1] > 0.1
    same = items.search(("u",), query="I prefer green tea in the morning", user_id="u")
    assert same[0].score is not None and same[0].score > 0.99  # identical text: similarity ~1


@pytest.mark.parametrize(("ns", "pattern", "kind", "exact_at", "expected"), [
    (("u1", "m"), ("*", "m"), "prefix", None, True),
    (("u1", "m"), ("*", "m"), "prefix", 0, False),  # "*" on the user's label is a user id
    (("*", "m"), ("*", "m"), "prefix", 0, True),
    (("u1", "m"), ("u1", "*"), "prefix", 0, True),
    (("u1", "x", "m"), ("*", "m"), "suffix", 0, True),  # the "*" falls on position 1
    (("u1", "m"), ("*", "m"), "suffix", 0, False),
])
def test_match_namespace_exact_user_label(ns: tuple[str, ...], pattern: tuple[str, ...], kind: str,
                                          exact_at: int | None, expected: bool) -> None:
    assert match_namespace(ns, pattern, kind, exact_at) is expected


def test_text_parts_and_best_parts() -> None:
    from tiered_memory.layers.items import FIELD_SEP, MAX_PARTS, best_parts, item_of_vector, text_parts, vector_id

    assert text_parts("one text\nwith lines") == ["one text\nwith lines"]  # written before per-field vectors
    assert text_parts(f"a{FIELD_SEP}b{FIELD_SEP} ") == ["a", "b"]
    many = text_parts(FIELD_SEP.join(str(n) for n in range(MAX_PARTS + 3)))
    assert len(many) == MAX_PARTS and many[-1] == "\n".join(str(n) for n in range(MAX_PARTS - 1, MAX_PARTS + 3))
    assert [vector_id("x", 0), vector_id("x", 2)] == ["item:x", "item:x#2"]
    assert item_of_vector("item:x#2") == item_of_vector("item:x") == "x"
    assert best_parts([("item:a#1", 0.2), ("item:b", 0.5), ("item:a", 0.7), ("item:b#3", 0.1)]) == [
        ("a", 0.7), ("b", 0.5)]


def test_a_huge_number_in_one_item_breaks_no_filtered_search(memory: TieredMemory) -> None:
    """A stored int past a float's range (valid JSON) once made every range filter over that
    field raise OverflowError, for the whole prefix."""
    items = memory.item_store()
    _put(items, "u", ("u", "n"), "huge", {"n": 10**400}, text=None)
    _put(items, "u", ("u", "n"), "small", {"n": 5}, text=None)
    assert sorted(h.item.key for h in items.search(("u",), filter={"n": {"$gt": 1}})) == ["huge", "small"]
    assert [h.item.key for h in items.search(("u",), filter={"n": {"$lt": 10**399}})] == ["small"]


def test_an_item_value_with_a_key_json_would_rewrite_is_refused(memory: TieredMemory) -> None:
    """JSON turns an int key into a string: {1: "a", "1": "b"} was stored as {"1": "b"}."""
    items = memory.item_store()
    for value in ({1: "a", "1": "b"}, {"l": [{None: 0}]}):
        with pytest.raises(InvalidInputError, match="keys must be strings"):
            _put(items, "u", ("u", "n"), "k", value)  # type: ignore[arg-type]
    assert items.get(("u", "n"), "k") is None


def test_an_item_value_nested_past_the_limit_is_refused(memory) -> None:  # type: ignore[no-untyped-def]
    items = memory.item_store()
    deep: dict = {}
    for _ in range(99):  # 100 dicts
        deep = {"a": deep}
    with pytest.raises(InvalidInputError, match="more than 100 levels"):
        items.write_many([ItemWrite(namespace=("u", "n"), key="k", user_id="u", value={"d": deep})])
    assert items.get(("u", "n"), "k") is None
    items.write_many([ItemWrite(namespace=("u", "n"), key="k", user_id="u", value=deep)])  # 100 levels
    assert items.get(("u", "n"), "k") is not None


@pytest.mark.parametrize("key", ["", "a\x00b", "half \ud800 pair", 7, None])
def test_a_key_no_store_can_hold_is_refused_alike_everywhere(make_memory: Callable[..., TieredMemory],
                                                            key: Any) -> None:
    """The core's item store checks keys itself (not only the LangGraph adapter): on SQLite and
    PostgreSQL alike, a typed error and nothing written."""
    items = make_memory("items-keys").item_store()
    with pytest.raises(InvalidInputError, match="item key"):
        _put(items, "u", ("u", "n"), key, {"v": 1}, text="some text")
    assert items.db.item_rows(None) == []


def test_a_keyword_match_among_many_identical_vectors_is_found(make_memory: Callable[..., TieredMemory]) -> None:
    # Chroma's HNSW graph can leave one vector unreachable beside many identical ones: the
    # engine then misses it even when asked for that id alone. The first search of a user
    # in a process is answered by the engine (the exact scan loads meanwhile), so the one
    # item that matches the query, by keyword too, must still be scored and come first.
    memory = make_memory(embedder=StaticEmbedder())
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("u", "trips"), key="trip", user_id="u", value={}, text="Zanzibar")])
    items.write_many([ItemWrite(namespace=("u", "acks"), key=f"ack{i}", user_id="u", value={}, text="ok")
                      for i in range(200)])
    hits = items.search(("u",), query="Zanzibar", user_id="u", limit=3)
    assert hits[0].item.key == "trip"
    assert hits[0].score is not None and hits[0].score > 0.99


def test_items_asked_by_more_ids_than_one_query_may_hold(memory: TieredMemory) -> None:
    """A search's vector hits come back as ids; with a large ``limit`` they pass SQLite's
    32,766 and PostgreSQL's 65,535 bound parameters, which one ``IN`` list had hit."""
    items = memory.item_store()
    _put(items, "u", ("u", "n"), "a", {"text": "bees"})
    _put(items, "u", ("u", "n"), "b", {"text": "wasps"})
    held = {i.key: i.id for i in open_layer_store(memory.store).items_under(("u",))}
    asked = [f"missing-{n}" for n in range(70_000)] + [held["a"]]
    assert [i.key for i in open_layer_store(memory.store).items_under(("u",), asked)] == ["a"]


def _listing_reads(rows: list[str]) -> Callable[[Any, int], list[tuple[Any, Any]]]:
    """A ``read`` for :func:`page_of` over ``rows`` (the cursor is a position), logging each read's size."""
    def read(after: Any, n: int) -> list[tuple[Any, Any]]:
        asked.append(n)
        start = 0 if after is None else after + 1
        return [(r, start + k) for k, r in enumerate(rows[start:start + n])]
    asked: list[int] = []
    read.asked = asked  # type: ignore[attr-defined]
    return read


@pytest.mark.record_stores("sqlite")
@pytest.mark.parametrize(("size", "keep_every", "limit", "offset", "page", "reads"), [
    (100, 1, 5, 0, list(range(5)), [10]),  # every row kept: one read of at least PAGE_MIN rows
    (100, 1, 10, 20, list(range(20, 30)), [30]),  # offset + limit rows, in one read
    (100, 3, 5, 2, [6, 9, 12, 15, 18], [10, 20]),  # a filter that keeps a third: a second, larger read
    (25, 1, 10, 20, list(range(20, 25)), [30]),  # a short read is the end
    (3000, 2000, 2, 0, [0, 2000], [10, 20, 40, 80, 160, 320, 640, 1000]),  # doubling, up to PAGE_MAX
    (100, 1, 0, 0, [], []),  # limit 0 reads nothing
    (0, 1, 10, 0, [], [10]),
])
def test_page_of_reads_bounded_pages_until_the_page_is_full(size: int, keep_every: int, limit: int, offset: int,
                                                            page: list[int], reads: list[int]) -> None:
    read = _listing_reads(list(range(size)))  # type: ignore[arg-type]
    assert page_of(read, lambda r: r % keep_every == 0, limit=limit, offset=offset) == page  # type: ignore[arg-type,operator]
    assert read.asked == reads  # type: ignore[attr-defined]


@pytest.fixture
def clocked(make_memory: Callable[..., TieredMemory]) -> tuple[TieredMemory, list[float]]:
    """A memory whose clock moves only when the test moves ``clock[0]``."""
    clock = [1_800_000_000.0]
    return make_memory(clock=lambda: clock[0]), clock


def test_a_listing_pages_as_the_unbounded_read_of_the_prefix(clocked: tuple[TieredMemory, list[float]]) -> None:
    """A search without a query read every item under the prefix and paged in Python. It now reads
    bounded pages in the database (keyset, newest first): every page is the one the whole read
    gave, with ties on updated_at (several writes at one clock time), the prefix itself and two
    depths below it, expired items, other prefixes, a filter and an ownership check in Python."""
    memory, clock = clocked
    items = memory.item_store()
    for batch in range(6):  # six clock times, twelve writes each: ties broken by the row written last
        items.write_many([ItemWrite(namespace=("u", "n", "2")[:1 + k % 3] if k % 5 else ("v",), key=f"{batch}-{k}",
                                    user_id="u" if k % 7 else "x", value={"b": batch, "k": k, "even": k % 2 == 0},
                                    ttl_minutes=1 if k == 4 else None) for k in range(12)])
        clock[0] += 30
    items.write_many([ItemWrite(namespace=("u", "n"), key="0-1", user_id="u", value={"b": 9, "k": 1,
                                                                                           "even": False})])  # moved up
    layers = open_layer_store(memory.store)
    everything = layers.items_under(("u",), live_at=clock[0])
    assert len(everything) == 49 and everything[0].key == "0-1"  # 5 expired, 18 elsewhere; the rewrite is newest

    def owned(i: Any) -> bool:
        return bool(i.user_id == "u")

    for flt, own in [(None, None), ({"even": True}, None), (None, owned), ({"b": {"$gte": 2}}, owned)]:
        whole = [i.key for i in everything if match_filter(i.value, flt) and (own is None or own(i))]
        for limit, offset in [(10, 0), (3, 4), (7, 30), (100, 0), (10, 45), (0, 0)]:
            page = items.search(("u",), filter=flt, limit=limit, offset=offset, owned=own)
            assert [h.item.key for h in page] == whole[offset:offset + limit], (flt, limit, offset)
