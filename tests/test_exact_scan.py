"""The exact per-user scan (vector/exact.py): the pure top-k, the held users, and Chroma
answering from it exactly as its own engine would."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex
from tiered_memory.vector.exact import ExactScan, UserVectors, top_k


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


M = np.stack([unit(1, 0), unit(0, 1), unit(1, 1), unit(-1, 0)])


@pytest.mark.parametrize("alive, allowed, k, expected", [
    ([1, 1, 1, 1], None, 2, [0, 2]),            # best first
    ([0, 1, 1, 1], None, 2, [2, 1]),            # a deleted row is never returned
    ([1, 1, 1, 1], [0, 1, 0, 1], 2, [1, 3]),     # only the allowed rows ("among")
    ([1, 1, 1, 1], None, 10, [0, 2, 1, 3]),     # k above the rows: all of them
    ([0, 0, 0, 0], None, 3, []),                # nothing live
    ([1, 1, 0, 0], [0, 0, 1, 1], 3, []),        # allowed but deleted
])
def test_top_k(alive, allowed, k, expected):
    found = top_k(M, np.asarray(alive, bool), unit(1, 0.1)[None, :], k,
                  None if allowed is None else np.asarray(allowed, bool))[0]
    assert [r for r, _ in found] == expected
    assert all(-1.0 <= s <= 1.0 for _, s in found)


def test_top_k_over_many_blocks_matches_a_full_sort():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((5000, 16)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    q = m[4321] + 0.05
    found = top_k(m, np.ones(5000, bool), q[None, :], 5)[0]
    assert [r for r, _ in found] == list(np.argsort(-(m @ q))[:5])


def test_user_vectors_grow_replace_and_delete():
    held = UserVectors(2, capacity=1)
    held.add(["a", "b", "c"], np.stack([unit(1, 0), unit(0, 1), unit(1, 1)]), ["turn", "turn", "fact"], ["s", "t", ""])
    held.add(["a"], unit(-1, 0)[None, :], ["turn"], ["s"])  # the same id again replaces its vector
    held.delete(["b"])
    assert held.size == 3
    assert [i for i, _ in held.query(unit(-1, 0)[None, :], 3, None)[0]] == ["a", "c"]
    assert [i for i, _ in held.query(unit(1, 1)[None, :], 3, ["a", "zzz"])[0]] == ["a"]
    assert [i for i, _ in held.query(unit(1, 1)[None, :], 3, None, ["fact"])[0]] == ["c"]
    assert [i for i, _ in held.query(unit(1, 1)[None, :], 3, None, ["turn"], "s")[0]] == ["a"]
    assert held.query(unit(1, 1)[None, :], 3, None, ["episode"]) == [[]]
    assert held.query(unit(1, 1)[None, :], 3, None, None, "no such session") == [[]]


@pytest.mark.parametrize("session", [None, "s1", "no such session"])
def test_one_scan_for_several_layers_is_a_query_per_layer(session):
    """query_layers (one product) gives what query gives for each layer: same ids, same order,
    ties included (rounded vectors make equal cosines)."""
    rng = np.random.default_rng(7)
    n = 3000
    v = np.round(rng.standard_normal((n, 8)), 1).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    held = UserVectors(8)
    layers = ["turn" if i % 3 else "chunk" for i in range(n)]
    held.add([f"m{i}" for i in range(n)], v, layers, [f"s{i % 4}" for i in range(n)])
    held.delete([f"m{i}" for i in range(0, n, 7)])
    q = v[11] + 0.01
    ks = {"turn": 150, "chunk": 40, "episode": 5, "fact": 0}
    got = held.query_layers(q, ks, session)
    for layer, k in ks.items():
        assert got[layer] == held.query(q[None, :], k, None, [layer], session)[0]
    assert got["turn"] if session != "no such session" else not any(got.values())


@pytest.mark.parametrize("picked", [300, 1500])  # under 1/FEW of the rows: those alone; over: a mask of all
@pytest.mark.parametrize("layers, session", [(None, None), (["turn"], None), (["turn"], "s1"), (["chunk"], "s9")])
def test_a_query_among_a_few_ids_scans_those_and_finds_what_the_whole_scan_finds(layers, session, picked):
    """Among fewer than 1/FEW of the user's rows (a scoped search's duplicates' originals), the
    query reads those rows alone, else masks every row (one scope helper for both): the same ids
    and order (ties included) and cosines as a mask built here over every row, deleted rows,
    layers, sessions and unknown ids left out alike."""
    rng = np.random.default_rng(3)
    n = 4000
    v = np.round(rng.standard_normal((n, 8)), 1).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    held = UserVectors(8)
    ids = [f"m{i}" for i in range(n)]
    layer_of = ["turn" if i % 3 else "chunk" for i in range(n)]
    held.add(ids, v, layer_of, [f"s{i % 4}" for i in range(n)])
    held.delete(ids[::7])
    among = [ids[i] for i in rng.choice(n, picked, replace=False)] + ["unknown", ids[5]]
    allowed = np.zeros(n, bool)
    allowed[[held.row[i] for i in among if i in held.row]] = True
    if layers is not None:
        allowed &= np.isin(np.asarray(layer_of), layers)
    if session is not None:
        allowed &= np.asarray([f"s{i % 4}" == session for i in range(n)])
    q = v[:2] + 0.01
    whole = [[(ids[r], s) for r, s in hits] for hits in top_k(held.matrix[:n], held.alive[:n], q, 40, allowed)]
    got = held.query(q, 40, among, layers, session)
    assert [[i for i, _ in hits] for hits in got] == [[i for i, _ in hits] for hits in whole]
    # the same cosines, to the last bit or so: a product of other blocks rounds otherwise
    assert [[s for _, s in hits] for hits in got] == [pytest.approx([s for _, s in hits], abs=1e-6) for hits in whole]
    assert whole[0] if session != "s9" else whole == [[], []]


def loader_of(data: dict[str, tuple[list[str], np.ndarray]], gate: threading.Event | None = None):
    def load(user: str, limit: int):
        if gate is not None:
            gate.wait()
        ids, vectors = data.get(user, ([], np.zeros((0, 2), np.float32)))
        return None if len(ids) > limit else (ids, vectors, ["turn"] * len(ids), [""] * len(ids))
    return load


def test_a_user_is_served_once_loaded_and_writes_made_while_loading_are_replayed():
    gate = threading.Event()
    scan = ExactScan(loader_of({"u": (["a", "b"], np.stack([unit(1, 0), unit(0, 1)]))}, gate))
    assert scan.query("u", unit(1, 0)[None, :], 2, None) is None  # not held yet: the engine answers
    assert scan.ready("u") is False                                 # the load starts, and waits on the gate
    scan.add("u", (["c"], unit(1, 0.1)[None, :], ["turn"], [""]))     # written meanwhile
    gate.set()
    assert scan.ready("u", wait=True)
    assert [i for i, _ in scan.query("u", unit(1, 0)[None, :], 5, None)[0]] == ["a", "c", "b"]


def test_a_delete_during_a_load_discards_it_and_the_next_query_reloads():
    """A delete can shift an engine's pages under a paged read, so what was read is not
    trusted; the engine answers until a clean reload."""
    gate = threading.Event()
    data = {"u": (["a", "b"], np.stack([unit(1, 0), unit(0, 1)]))}
    scan = ExactScan(loader_of(data, gate))
    assert scan.ready("u") is False
    scan.delete(["a"])
    data["u"] = (["b"], unit(0, 1)[None, :])  # the engine without it
    gate.set()
    assert scan.ready("u", wait=True) is False  # that load was discarded; this call started another
    assert scan.ready("u", wait=True) is True
    assert [i for i, _ in scan.query("u", unit(1, 0)[None, :], 5, None)[0]] == ["b"]


def test_users_are_kept_apart_and_forgotten():
    scan = ExactScan(loader_of({"u": (["a"], unit(1, 0)[None, :]), "v": (["b"], unit(1, 0)[None, :])}))
    assert scan.ready("u", wait=True) and scan.ready("v", wait=True)
    assert [i for i, _ in scan.query("u", unit(1, 0)[None, :], 5, None)[0]] == ["a"]
    scan.drop("u")
    assert scan.query("u", unit(1, 0)[None, :], 5, None) is None
    assert [i for i, _ in scan.query("v", unit(1, 0)[None, :], 5, None)[0]] == ["b"]


def test_the_budget_evicts_the_least_recent_user_and_never_holds_a_user_above_it():
    data = {"u": (["a", "b"], np.stack([unit(1, 0), unit(0, 1)])), "v": (["c", "d"], np.stack([unit(1, 0), unit(0, 1)])),
            "big": (["e", "f", "g"], np.stack([unit(1, 0), unit(0, 1), unit(1, 1)]))}
    scan = ExactScan(loader_of(data), budget_rows=2)
    assert scan.ready("u", wait=True)
    assert scan.ready("v", wait=True)  # u is evicted to make room
    assert scan.query("u", unit(1, 0)[None, :], 1, None) is None
    assert scan.ready("big", wait=True) is False  # 3 > 2: the engine keeps serving this user
    assert scan.ready("big") is False


def test_a_failing_loader_leaves_the_engine_in_charge():
    def broken(user: str, limit: int):
        raise RuntimeError("engine down")
    scan = ExactScan(broken)
    assert scan.ready("u", wait=True) is False
    assert scan.query("u", unit(1, 0)[None, :], 1, None) is None


def items(user: str, n: int, seed: int) -> list[VectorItem]:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, 8)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return [VectorItem(id=f"{user}-{i}", vector=v[i].tolist(), user_id=user, session_id=f"s{i % 3}",
                       layer="turn" if i % 4 else "fact") for i in range(n)]


@pytest.fixture(params=["chroma", "qdrant"])
def chroma(request, tmp_path):
    """An embedded index of each engine (Chroma's PersistentClient, Qdrant's local mode)."""
    if request.param == "chroma":
        index = ChromaVectorIndex(str(tmp_path / "chroma"))
    else:
        from tiered_memory.vector.qdrant import QdrantVectorIndex

        index = QdrantVectorIndex(str(tmp_path / "qdrant"))
    yield index
    index.close()


def test_chroma_answers_a_held_user_as_its_engine_does(chroma, tmp_path):
    """The engine's answers come from a second index of the same vectors that never holds a
    user: the first query of ``chroma`` starts its background load, which may finish before
    any later query (then the scan would be compared with itself) or not (then with the engine)."""
    engine = type(chroma)(str(tmp_path / "engine"), exact_rows=0)
    try:
        for index in (chroma, engine):
            for user, seed in (("u", 1), ("v", 2)):
                index.upsert(items(user, 60, seed))
        assert not engine.scans_exactly("u", wait=True)
        queries = np.asarray([i.vector for i in items("q", 5, 3)], dtype=np.float32)
        turns = [f"u-{i}" for i in range(0, 60, 2) if i % 4]  # as a caller scopes among: the user's turns
        shapes = [dict(layers=["turn"]), dict(layers=["fact"]), dict(layers=None), dict(layers=["turn"], session_id="s1"),
                  dict(layers=["turn"], among=turns)]
        expected = [engine.query(queries, user_id="u", k=7, **shape) for shape in shapes]
        assert chroma.scans_exactly("u", wait=True)
        exact = [chroma.query(queries, user_id="u", k=7, **shape) for shape in shapes]
        for e, x in zip(expected, exact):
            assert [[i for i, _ in row] for row in x] == [[i for i, _ in row] for row in e]
            assert np.allclose([[s for _, s in row] for row in x], [[s for _, s in row] for row in e], atol=1e-4)
        # held, ids of another user or layer in among are dropped (the engine trusts the caller's scope)
        assert chroma.query(queries, user_id="u", k=7, layers=["turn"], among=turns + ["v-1", "u-0"]) == exact[-1]
        assert all(i.startswith("u-") for x in exact for row in x for i, _ in row)  # never another user's
    finally:
        engine.close()


def test_an_index_answers_several_layers_from_one_scan_of_a_held_user(chroma):
    chroma.upsert(items("u", 60, 1) + items("v", 60, 2))
    q = np.asarray(items("q", 1, 3)[0].vector, dtype=np.float32)
    ks = {"turn": 7, "fact": 3}
    if not chroma.scans_exactly("u", wait=True):
        pytest.fail("an embedded index holds a small user")
    got = chroma.query_held(q, user_id="u", ks=ks, session_id="s1")
    assert got is not None
    for layer, k in ks.items():
        assert got[layer] == chroma.query(q[None, :], user_id="u", k=k, layers=[layer], session_id="s1")[0]
        assert got[layer] and all(i.startswith("u-") for i, _ in got[layer])
    chroma.delete_user("u")
    assert chroma.query_held(q, user_id="u", ks=ks) in (None, {"turn": [], "fact": []})


def test_chroma_keeps_a_held_user_current_through_writes_and_forgets(chroma):
    chroma.upsert(items("u", 10, 1))
    assert chroma.scans_exactly("u", wait=True)
    new = items("u", 12, 9)[10:]
    chroma.upsert([VectorItem(id=f"new-{i.id}", vector=i.vector, user_id="u") for i in new])
    q = np.asarray([new[0].vector], dtype=np.float32)
    assert chroma.query(q, user_id="u", k=1, layers=["turn"])[0][0][0] == "new-u-10"
    chroma.delete(["new-u-10"])
    assert chroma.query(q, user_id="u", k=1, layers=["turn"])[0][0][0] != "new-u-10"
    chroma.delete_user("u")
    assert chroma.query(q, user_id="u", k=5, layers=["turn"]) == [[]]


def test_k_above_what_the_user_holds_and_a_user_with_nothing(chroma):
    chroma.upsert(items("u", 4, 1))
    q = np.asarray([items("q", 1, 3)[0].vector], dtype=np.float32)
    assert len(chroma.query(q, user_id="u", k=2**31 - 1, layers=["turn"])[0]) == 3  # one of the 4 is a fact
    assert chroma.scans_exactly("u", wait=True)
    assert len(chroma.query(q, user_id="u", k=2**31 - 1, layers=["turn"])[0]) == 3  # one of the 4 is a fact
    assert chroma.scans_exactly("nobody", wait=True)
    assert chroma.query(q, user_id="nobody", k=10, layers=["turn"]) == [[]]


def test_an_index_on_a_server_client_holds_nothing(tmp_path):
    import chromadb
    from chromadb.config import Settings

    client = chromadb.PersistentClient(path=str(tmp_path / "shared"), settings=Settings(anonymized_telemetry=False))
    index = ChromaVectorIndex(client=client)  # a client given by the caller may have other writers
    index.upsert(items("u", 3, 1))
    assert index.scans_exactly("u", wait=True) is False


class LoadsBeforeDeleting:
    """The engine's own object (Chroma's collection, Qdrant's client), whose deletes first
    let a query of ``user`` load the user's vectors: a search arriving while a ``forget`` or
    ``forget_user`` is under way, after the held vectors were dropped and before the engine's."""

    def __init__(self, engine, index, user):
        self._engine, self._index, self._user = engine, index, user

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def delete(self, *args, **kwargs):
        assert self._index.scans_exactly(self._user, wait=True)  # read from the engine, not yet deleted
        return self._engine.delete(*args, **kwargs)


def test_a_load_that_reads_the_engine_during_a_delete_holds_nothing_deleted(chroma):
    chroma.upsert(items("u", 10, 1))
    gone = np.asarray([items("u", 2, 1)[1].vector], dtype=np.float32)  # u-1, a turn
    name = "collection" if isinstance(chroma, ChromaVectorIndex) else "client"
    engine = getattr(chroma, name)
    setattr(chroma, name, LoadsBeforeDeleting(engine, chroma, "u"))
    try:
        chroma.delete(["u-1"])
        assert chroma.held_rows("u") == 10  # held: the load came during the delete
        assert "u-1" not in [i for i, _ in chroma.query(gone, user_id="u", k=10, layers=["turn"])[0]]
        chroma.delete_user("u")
        assert chroma.held_rows("u") == 0 and chroma.query(gone, user_id="u", k=10, layers=["turn"]) == [[]]
    finally:
        setattr(chroma, name, engine)
