"""The user's size picks the query shape on PostgreSQL, and users stay apart on every shape.

Keyword search starts from a small user's rows (the b-tree on ``user_id``) and from the GIN
index for a large one; the pgvector index scans a small user exactly and walks HNSW for a
large one. Each test runs the same data under both shapes (thresholds set so that a user
falls on one side or the other) and checks that results are the same and never another
user's. The server is PostgreSQL 18 + pgvector from ``tests/servers.py``.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import numpy as np
import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.store.postgres import PostgresRecordStore
from tiered_memory.store.postgres_db import PostgresDatabase
from tiered_memory.store.postgres_layers import PostgresLayerStore
from tiered_memory.store.text_search import scan_user_rows
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.pgvector import PgVectorIndex, exact_limit, exact_scan

pytestmark = pytest.mark.servers

# below the threshold: start from the user's rows / scan exactly; at or above: the index
DECISIONS = [(0, 1, True), (99, 100, True), (100, 100, False), (101, 100, False), (19_999, 20_000, True),
             (20_000, 20_000, False)]


@pytest.mark.parametrize("rows, threshold, small", DECISIONS)
def test_the_user_size_decides_the_shape(rows: int, threshold: int, small: bool) -> None:
    assert scan_user_rows(rows, threshold) is small
    assert exact_scan(rows, threshold) is small


# (vectors in the table, ef_search, the user size from which HNSW is walked)
LIMITS = [(1_000_000, 100, 11_402), (200_000, 100, 5_100), (0, 100, 1), (-1, 100, 1), (64, 100, 92),
          (1_000_000, 400, 22_804)]


@pytest.mark.parametrize("total, ef, limit", LIMITS)
def test_hnsw_takes_over_at_the_square_root_of_the_table(total: int, ef: int, limit: int) -> None:
    assert exact_limit(total, ef) == limit
    assert exact_scan(10_000, exact_limit(1_000_000, 100))  # measured: exact wins at 1,000,000
    assert not exact_scan(10_000, exact_limit(200_000, 100))  # measured: HNSW wins at 200,000


@pytest.fixture(scope="module")
def database(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("make_pgvector_url")())


@pytest.fixture
def schema() -> str:
    return "u_" + uuid.uuid4().hex[:12]


# big: 40 rows, small: 3 rows, other: 3 rows; all share the words searched for
SHAPES = {"both through GIN": 1, "big through GIN, small from its rows": 10, "both from their rows": 10_000}


def fill(database: str, schema: str) -> dict[str, set[str]]:
    memory = TieredMemory(record_store=PostgresRecordStore(database, schema=schema), vector_store="pgvector",
                          embedder=StaticEmbedder())
    try:
        owned: dict[str, set[str]] = {}
        for user, n in (("big", 40), ("small", 3), ("other", 3)):
            ids = memory.add_many([{"role": "user", "content": f"{user} note {i} about tomatoes and the garden"}
                                   for i in range(n)], user_id=user, session_id=f"s-{user}")
            owned[user] = set(ids)
        return owned
    finally:
        memory.close()


def test_keyword_search_keeps_users_apart_and_agrees_on_every_shape(database: str, schema: str) -> None:
    owned = fill(database, schema)
    seen: dict[str, list[Any]] = {}
    for shape, cap in SHAPES.items():
        store = PostgresRecordStore(database, schema=schema, user_scan_rows=cap)
        try:
            for user in owned:
                found = store.keyword_search(user, ["tomatoes", "garden"], k=50)
                records, kw = store.candidates(user, [], ["tomatoes"], k=50)
                in_session = store.keyword_search(user, ["tomatoes"], k=50, session_id=f"s-{user}")
                elsewhere = store.keyword_search(user, ["tomatoes"], k=50, session_id="s-other")
                assert {i for i, _ in found} == owned[user], shape
                assert set(records) == {i for i, _ in kw} == owned[user], shape
                assert all(r.user_id == user for r in records.values())
                assert {i for i, _ in in_session} == owned[user]
                assert elsewhere == [] or user == "other"
                seen.setdefault(user, []).append([i for i, _ in found])
        finally:
            store.close()
    for user, lists in seen.items():  # same ranking whichever shape ran
        assert all(lst == lists[0] for lst in lists), user


def test_fact_search_keeps_users_apart_on_every_shape(database: str, schema: str) -> None:
    memory = TieredMemory(record_store=PostgresRecordStore(database, schema=schema), vector_store="pgvector",
                          embedder=StaticEmbedder())
    try:
        mine = {memory.add_fact(f"big keeps bees number {i} near the orchard", user_id="big").id for i in range(12)}
        theirs = {memory.add_fact("small keeps bees near the orchard", user_id="small").id}
    finally:
        memory.close()
    for cap in (1, 5, 10_000):
        store = PostgresRecordStore(database, schema=schema, user_scan_rows=cap)
        try:
            layers = PostgresLayerStore(store)
            assert {i for i, _ in layers.keyword_facts("big", ["bees", "orchard"], 50)} == mine
            assert {i for i, _ in layers.keyword_facts("small", ["bees", "orchard"], 50)} == theirs
            assert layers.keyword_points("small", ["bees"], 50) == []
        finally:
            store.close()


@pytest.fixture
def vectors(database: str, schema: str) -> Iterator[tuple[PostgresDatabase, dict[str, np.ndarray]]]:
    db = PostgresDatabase(database, schema=schema, max_size=1)  # one connection: settings would show
    rng = np.random.default_rng(3)
    data = {user: rng.standard_normal((n, 32)) for user, n in (("big", 60), ("small", 4))}
    items = [VectorItem(id=f"{user}-{i}", vector=(v / np.linalg.norm(v)).tolist(), user_id=user)
             for user, rows in data.items() for i, v in enumerate(rows)]
    PgVectorIndex(db).upsert(items)
    yield db, data
    db.close()


@pytest.mark.parametrize("exact_below", [1, 10, 1_000, None])
def test_vector_queries_keep_users_apart_on_either_path(
        vectors: tuple[PostgresDatabase, dict[str, np.ndarray]], exact_below: int | None) -> None:
    db, data = vectors
    index = PgVectorIndex(db, exact_below=exact_below)
    q = np.asarray([data["small"][0] / np.linalg.norm(data["small"][0])])
    small = index.query(q, user_id="small", k=10)[0]
    big = index.query(q, user_id="big", k=5)[0]
    assert {i for i, _ in small} == {f"small-{i}" for i in range(4)}
    assert small[0][0] == "small-0"
    assert len(big) == 5 and all(i.startswith("big-") for i, _ in big)
    if exact_scan(60, exact_limit(64, 100) if exact_below is None else exact_below):  # the exact path is the true top 5
        unit = data["big"] / np.linalg.norm(data["big"], axis=1, keepdims=True)
        truth = [f"big-{i}" for i in np.argsort(-(unit @ q[0]))[:5]]
        assert [i for i, _ in big] == truth
    # the exact path turns index scans off for its query only: the pooled connection is as before
    assert db.query("SHOW enable_indexscan") == [("on",)]
