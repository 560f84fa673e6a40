"""Vector index conformance: every vector index passes the same tests.

A new vector backend proves itself by subclassing :class:`VectorIndexConformance` and
providing one fixture, ``index``, that opens it (record stores: ``test_conformance.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiered_memory.errors import VectorIndexError
from tiered_memory.vector.base import VectorIndex, VectorItem
from tiered_memory.vector.exact import best_among

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

    def test_an_id_upserted_again_for_another_user_leaves_the_first(self, index: VectorIndex) -> None:
        index.upsert([item("a", 1), item("b", 2)])
        index.query(unit(1)[None, :], user_id="u1", k=1)  # an index holding users in memory loads u1 here
        getattr(index, "scans_exactly", lambda user, wait: False)("u1", wait=True)
        index.upsert([item("a", 1, user="u2", layer="fact")])
        assert [i for i, _ in index.query(unit(1)[None, :], user_id="u1", k=5)[0]] == ["b"]
        assert [i for i, _ in index.query(unit(1)[None, :], user_id="u2", k=5, layers=["fact"])[0]] == ["a"]
        assert index.ids("u1") == {"b"} and index.count() == 2

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

    def test_answers_what_an_exact_scan_answers(self, index: VectorIndex) -> None:
        """A table over filters and k (past the user's size too): the same ids, in the same
        order, with the same cosines as numpy's exact scan of the matching vectors."""
        rng = np.random.default_rng(7)
        stored = [item(f"m{i}", 100 + i, user=("u1", "u2")[i % 2], layer=("turn", "fact")[i % 3 == 0],
                       session=f"s{i % 4}") for i in range(24)]
        index.upsert(stored)
        q = unit(int(rng.integers(1000)))[None, :]
        for user, layers, session, among, k in [
            ("u1", None, None, None, 3), ("u1", None, None, None, 50), ("u2", ["fact"], None, None, 4),
            ("u1", ["turn"], "s1", None, 10), ("u2", None, "s3", None, 2), ("u1", None, None, ["m0", "m2", "m4"], 5),
            ("u1", ["fact", "episode"], None, None, 7), ("u1", None, "no-such-session", None, 3),
            ("u2", None, None, None, 0),
        ]:
            keep = [v for v in stored if v.user_id == user and (layers is None or v.layer in layers)
                    and (session is None or v.session_id == session) and (among is None or v.id in among)]
            want = best_among([v.id for v in keep], [v.vector for v in keep], q, k)[0]
            got = index.query(q, user_id=user, k=k, layers=layers, session_id=session, among=among)[0]
            case = (user, layers, session, among, k)
            assert [i for i, _ in got] == [i for i, _ in want], case
            assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4), case

    def test_a_query_among_ids_the_index_lacks_finds_nothing(self, index: VectorIndex) -> None:
        index.upsert([item("a", 1), item("b", 2)])
        assert index.query(unit(1)[None, :], user_id="u1", k=3, among=["not-indexed-yet"]) == [[]]
        assert [i for i, _ in index.query(unit(1)[None, :], user_id="u1", k=3, among=["b", "gone"])[0]] == ["b"]

    def test_a_query_among_another_users_or_layers_ids_finds_none_of_them(self, index: VectorIndex) -> None:
        """The ids are the caller's scoping, not a way past the index's own: a caller that passes
        another user's ids (a bug, a forged id) gets none of that user's vectors."""
        index.upsert([item("mine", 1), item("theirs", 1, user="u2"), item("fact", 1, layer="fact")])
        for among in (["theirs"], ["mine", "theirs"], [f"x{n}" for n in range(100)] + ["theirs", "mine"]):
            assert [i for i, _ in index.query(unit(1)[None, :], user_id="u1", k=3, among=among)[0]] == \
                (["mine"] if "mine" in among else []), among
        assert [i for i, _ in index.query(unit(1)[None, :], user_id="u1", k=3, layers=["turn"],
                                          among=["fact", "mine"])[0]] == ["mine"]

    def test_an_empty_index_answers_nothing_and_deletes_nothing(self, index: VectorIndex) -> None:
        assert index.query(unit(1)[None, :], user_id="u1", k=5) == [[]]
        assert index.ids() == set() and index.ids("u1") == set() and index.count("u1") == 0
        index.delete(["missing"])
        index.delete_user("u1")
        index.upsert([item("a", 1)])
        index.delete(["missing", "also-missing"])
        assert index.ids() == {"a"}

    @pytest.mark.parametrize("user", ["o'brien\"; DROP TABLE vectors; --", "Zoë \u00e9\U0001F600 ユーザー",
                                      "u" * 4000])
    def test_an_unusual_user_id_is_one_user_like_any_other(self, index: VectorIndex, user: str) -> None:
        index.upsert([item("theirs", 1, user=user), item("mine", 1), item("other", 2, user=user + "x")])
        assert [i for i, _ in index.query(unit(1)[None, :], user_id=user, k=5)[0]] == ["theirs"]
        assert index.ids(user) == {"theirs"} and index.count(user) == 1
        index.delete_user(user)
        assert index.ids() == {"mine", "other"}

    def test_a_vector_of_another_width_is_a_typed_error_and_writes_nothing(self, index: VectorIndex) -> None:
        index.upsert([item("a", 1)])
        index.query(unit(1)[None, :], user_id="u1", k=1)  # an index holding users in memory loads u1 here
        wide = VectorItem(id="wide", vector=np.ones(DIM + 1, dtype=np.float32) / np.sqrt(DIM + 1), user_id="u1")
        with pytest.raises(VectorIndexError):
            index.upsert([item("b", 2), wide])
        with pytest.raises(VectorIndexError):
            index.query(np.asarray(wide.vector)[None, :], user_id="u1", k=1)
        assert index.ids() == {"a"}

    @pytest.mark.parametrize("bad", [np.nan, np.inf])
    def test_a_vector_that_is_not_finite_is_refused_and_nothing_is_written(self, index: VectorIndex,
                                                                         bad: float) -> None:
        vector = unit(3).copy()
        vector[0] = bad
        with pytest.raises(VectorIndexError, match="finite"):
            index.upsert([item("ok", 2), VectorItem(id="bad", vector=vector, user_id="u1")])
        assert index.ids() == set()
        index.upsert([item("ok", 2)])
        assert [i for i, _ in index.query(unit(2)[None, :], user_id="u1", k=5)[0]] == ["ok"]


    def test_a_query_vector_that_is_not_finite_is_refused(self, index: VectorIndex) -> None:
        """A broken query embedding is an error on every engine, never a silent empty answer
        (Chroma and Qdrant matched nothing; pgvector refused it)."""
        index.upsert([item("a", 1)])
        query = unit(1)[None, :].copy()
        query[0, 0] = np.nan
        with pytest.raises(VectorIndexError, match="finite"):
            index.query(query, user_id="u1", k=3)
        assert index.query(unit(1)[None, :], user_id="u1", k=3)[0][0][0] == "a"

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
