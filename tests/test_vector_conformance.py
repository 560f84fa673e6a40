"""Vector index conformance: every vector index passes the same tests.

A new vector backend proves itself by subclassing :class:`VectorIndexConformance` and
providing one fixture, ``index``, that opens it (record stores: ``test_conformance.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiered_memory.vector.base import VectorIndex, VectorItem

DIM = 16


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


def item(mid: str, seed: int, *, user: str = "u1", layer: str = "turn", session: str = "s1") -> VectorItem:
    return VectorItem(id=mid, vector=unit(seed), user_id=user, layer=layer, session_id=session, timestamp=1.0)


class VectorIndexConformance:
    """Subclasses provide ``index``: an open, empty index (closed by the fixture)."""

    def test_nearest_first_with_cosine_similarity(self, index: VectorIndex) -> None:
        index.upsert([item(f"v{i}", i) for i in range(10)])
        res = index.query(unit(3)[None, :], user_id="u1", k=3)[0]
        assert res[0][0] == "v3" and res[0][1] == pytest.approx(1.0, abs=1e-4)
        assert len(res) == 3
        assert [s for _, s in res] == sorted((s for _, s in res), reverse=True)

    def test_one_result_list_per_query_row(self, index: VectorIndex) -> None:
        index.upsert([item(f"v{i}", i) for i in range(5)])
        res = index.query(np.stack([unit(1), unit(4)]), user_id="u1", k=1)
        assert [r[0][0] for r in res] == ["v1", "v4"]

    def test_users_never_see_each_other(self, index: VectorIndex) -> None:
        index.upsert([item("mine", 1), item("theirs", 1, user="u2")])
        assert [i for i, _ in index.query(unit(1)[None, :], user_id="u1", k=5)[0]] == ["mine"]
        assert [i for i, _ in index.query(unit(1)[None, :], user_id="u2", k=5)[0]] == ["theirs"]
        assert index.query(unit(1)[None, :], user_id="nobody", k=5) == [[]]

    def test_layer_and_session_filters(self, index: VectorIndex) -> None:
        index.upsert([item("t1", 1), item("f1", 2, layer="fact"), item("t2", 3, session="s2")])
        q = unit(2)[None, :]
        assert {i for i, _ in index.query(q, user_id="u1", k=5, layers=["turn"])[0]} == {"t1", "t2"}
        assert {i for i, _ in index.query(q, user_id="u1", k=5, layers=["fact", "episode"])[0]} == {"f1"}
        assert {i for i, _ in index.query(q, user_id="u1", k=5, session_id="s2")[0]} == {"t2"}

    def test_query_among_searches_only_those_ids(self, index: VectorIndex) -> None:
        index.upsert([item(f"v{i}", i) for i in range(8)])
        got = index.query(unit(2)[None, :], user_id="u1", k=3, among=["v1", "v2", "v5", "v6"])[0]
        assert got[0][0] == "v2" and got[0][1] == pytest.approx(1.0, abs=1e-4)
        assert len(got) == 3 and {i for i, _ in got} <= {"v1", "v2", "v5", "v6"}
        assert [i for i, _ in index.query(unit(3)[None, :], user_id="u1", k=5, among=["v3"])[0]] == ["v3"]
        assert index.query(unit(2)[None, :], user_id="u1", k=3, among=[]) == [[]]

    def test_upsert_replaces_by_id(self, index: VectorIndex) -> None:
        index.upsert([item("a", 1), item("b", 2)])
        index.upsert([item("a", 7)])
        assert index.count() == 2
        assert index.query(unit(7)[None, :], user_id="u1", k=1)[0][0][0] == "a"

    def test_ids_count_and_deletes(self, index: VectorIndex) -> None:
        index.upsert([item("a", 1), item("b", 2), item("fact:c", 3, layer="fact"), item("d", 4, user="u2")])
        assert index.ids() == {"a", "b", "fact:c", "d"} and index.count() == 4
        assert index.ids("u1") == {"a", "b", "fact:c"} and index.count("u2") == 1
        index.delete(["a", "never-existed"])
        assert index.ids("u1") == {"b", "fact:c"}
        index.delete_user("u1")
        assert index.ids() == {"d"} and index.count("u1") == 0

    def test_reset_empties_and_stays_usable(self, index: VectorIndex) -> None:
        index.upsert([item("a", 1)])
        index.reset()
        assert index.count() == 0 and index.ids() == set()
        index.upsert([item("b", 2)])
        assert index.ids() == {"b"}


class TestChromaEmbedded(VectorIndexConformance):
    @pytest.fixture
    def index(self, tmp_path: Path) -> Any:
        from tiered_memory.vector.chroma import ChromaVectorIndex

        ix = ChromaVectorIndex(str(tmp_path / "chroma"))
        yield ix
        ix.close()


@pytest.mark.servers
class TestChromaServer(VectorIndexConformance):
    @pytest.fixture
    def index(self, chroma_url: str, chroma_collection: str) -> Any:
        from tiered_memory.vector.chroma import ChromaVectorIndex

        ix = ChromaVectorIndex.from_url(chroma_url, collection=chroma_collection)
        yield ix
        ix.close()


class TestQdrantLocal(VectorIndexConformance):
    @pytest.fixture
    def index(self, tmp_path: Path) -> Any:
        from tiered_memory.vector.qdrant import QdrantVectorIndex

        ix = QdrantVectorIndex(str(tmp_path / "qdrant"))
        yield ix
        ix.close()
