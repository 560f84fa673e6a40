"""Many workers, one deployment: PostgreSQL record store + Chroma server, or PostgreSQL with
pgvector alone (records and vectors in one transaction).

Four OS processes write and search for overlapping users at the same time: turns,
facts, and at the end one session that all four close at once. Afterwards every
acknowledged write is stored and indexed exactly once, the shared session became
exactly one episode, and no search ever returned another user's memory.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tiered_memory import MemoryConfig, TieredMemory

pytestmark = pytest.mark.servers

WORKERS = 4
ROUNDS = 6
PER_ROUND = 3
USERS = ["alice", "bob", "carol"]
SHARED_USER, SHARED_SESSION = "alice", "shared"
PRELOAD = ["torch", "sentence_transformers", "chromadb", "psycopg", "psycopg_pool", "tiered_memory"]
TOPICS = [
    "planted tomatoes and basil on the balcony",
    "booked a train to Porto for the conference",
    "the dentist appointment moved to Thursday",
    "learning to play the cello in the evenings",
    "the cat knocked the coffee mug off the desk",
    "running a half marathon in October",
    "prefers green tea over espresso",
    "the car needs new winter tyres",
    "reading a novel about lighthouse keepers",
    "allergic to peanuts and shellfish",
    "moving the team standup to nine thirty",
    "the laptop battery drains too quickly",
]


def content(user: str, worker: int, rnd: int, i: int) -> str:
    return f"[{user}] w{worker} r{rnd} i{i}: {TOPICS[(worker * 5 + rnd * 3 + i) % len(TOPICS)]}"


def vector_store(spec: tuple[str, ...]) -> Any:
    """The ``vector_store`` argument for a deployment: ("chroma", url, collection) or ("pgvector",)."""
    if spec[0] == "pgvector":
        return "pgvector"
    from tiered_memory.vector.chroma import ChromaVectorIndex

    return ChromaVectorIndex.from_url(spec[1], collection=spec[2])


@pytest.fixture(params=["chroma", "pgvector"])
def deployment(request: pytest.FixtureRequest) -> tuple[str, tuple[str, ...]]:
    """(record store URL, vector spec) of a fresh deployment of each kind."""
    if request.param == "pgvector":
        return request.getfixturevalue("make_pgvector_url")(), ("pgvector",)
    return (request.getfixturevalue("make_postgres_url")(),
            ("chroma", request.getfixturevalue("chroma_url"), request.getfixturevalue("chroma_collection")))


def worker_main(worker: int, pg_url: str, spec: tuple[str, ...], barrier: Any, results: Any) -> None:
    """One app worker: its own process, pool, model and clients; reports acks and hits."""
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        torch.set_num_threads(1)  # four processes on a small machine: no oversubscribed threads
        # dedup off: the test counts every write; dedup is covered elsewhere
        from tiered_memory import SentenceTransformerEmbedder

        memory = TieredMemory(record_store=pg_url,  # the same model as the test's own checks
                              vector_store=vector_store(spec),
                              config=MemoryConfig(dedup_threshold=1.01), embedder=SentenceTransformerEmbedder())
        memory.embedder.embed_query("warm up")  # load the model before the race starts
        acked: list[tuple[str, str, str]] = []
        hits: list[tuple[str, str, str]] = []
        facts: list[tuple[str, str, str]] = []
        barrier.wait(timeout=300)
        for rnd in range(ROUNDS):
            user = USERS[(worker + rnd) % len(USERS)]
            texts = [content(user, worker, rnd, i) for i in range(PER_ROUND)]
            ids = memory.add_many([{"role": "user", "content": t} for t in texts],
                                  user_id=user, session_id=f"w{worker}")
            acked += [(user, mid, text) for mid, text in zip(ids, texts)]
            note = f"[{SHARED_USER}] w{worker} r{rnd}: shared session note"
            acked.append((SHARED_USER, memory.add("user", note, user_id=SHARED_USER, session_id=SHARED_SESSION), note))
            fact = memory.add_fact(f"[{user}] {TOPICS[(worker * 7 + rnd) % len(TOPICS)]}", user_id=user)
            facts.append((user, fact.id, fact.text))
            reader = USERS[(worker + rnd + 1) % len(USERS)]  # search a user others write to now
            for h in memory.search("what is planned for the week", user_id=reader, k=10):
                hits.append((reader, h.id, h.text))
            for f in memory.search_facts("what does the user like", user_id=reader, k=10):
                hits.append((reader, f.fact.id, f.fact.text))
        barrier.wait(timeout=300)  # every turn is in: all four close the shared session at once
        episode = memory.end_session(SHARED_SESSION, user_id=SHARED_USER)
        memory.close()
        results.put((worker, "ok", acked, hits, facts, episode.id))
    except BaseException:
        results.put((worker, "error", traceback.format_exc(), [], [], None))


def test_four_worker_processes_share_one_deployment(
    deployment: tuple[str, tuple[str, ...]], embedder: Any,
) -> None:
    pg_url, spec = deployment
    # Separate OS processes, forked from a server that imported torch & co. once (importing
    # them four times over is most of the cost on a small machine); each loads its own model.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=worker_main,
                         args=(w, pg_url, spec, barrier, results))
             for w in range(WORKERS)]
    for p in procs:
        p.start()
    reports = []
    try:
        for _ in procs:
            reports.append(results.get(timeout=400))
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {WORKERS} workers reported")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    errors = [r[2] for r in reports if r[1] != "ok"]
    assert errors == [], "\n".join(errors)

    acked = [a for r in reports for a in r[2]]
    hits = [h for r in reports for h in r[3]]
    facts = [f for r in reports for f in r[4]]
    owner = {mid: user for user, mid, _ in acked}
    assert len(acked) == WORKERS * ROUNDS * (PER_ROUND + 1) == len(owner)
    assert len({r[5] for r in reports}) == 1  # the four concurrent end_session calls agree on one episode
    owner.update({fid: user for user, fid, _ in facts})

    from tiered_memory.backends import open_pgvector
    from tiered_memory.store.postgres import PostgresRecordStore

    store = PostgresRecordStore(pg_url)
    index = open_pgvector(store) if spec[0] == "pgvector" else vector_store(spec)
    try:
        turns = {mid for _, mid, _ in acked}
        stored = [m.id for m in store.iter_messages()]
        assert Counter(stored) == Counter(turns)  # every acknowledged write, exactly once
        assert store.counts()["indexed"] == len(turns) and store.pending_index(1) == []
        turn_vectors = {i for i in index.ids() if ":" not in i}
        assert index.count() >= len(turns) and turn_vectors == turns
        for user in USERS:
            mine = {mid for mid, u in owner.items() if u == user and mid in turns}
            assert {m.id for m in store.iter_messages(user)} == mine
            assert {i for i in index.ids(user) if ":" not in i} == mine
        # every fact add_fact returned is stored under its user (a similar fact may have refined it)
        fact_owner = dict(store.query("SELECT id, user_id FROM facts"))
        assert {fid: fact_owner.get(fid) for _, fid, _ in facts} == {fid: u for u, fid, _ in facts}
        assert store.query("SELECT COUNT(*) FROM episodes WHERE session_id=%s",
                           (SHARED_SESSION,)) == [(1,)]
    finally:
        store.close()
        index.close()

    # no search, made while others were writing, returned another user's memory
    assert hits, "the concurrent searches found nothing at all"
    for reader, mid, text in hits:
        assert owner.get(mid) == reader and text.startswith(f"[{reader}]"), (reader, mid, text)

    # and each write is findable by its owner afterwards
    with TieredMemory(record_store=pg_url, vector_store=vector_store(spec), embedder=embedder) as memory:
        for user, mid, text in [a for a in acked if "shared session" not in a[2]][::5]:
            found = memory.search(text, user_id=user, k=3)
            assert found and found[0].id == mid, (text, [h.text for h in found])
            assert all(owner[h.id] == user for h in found)


def test_tiered_memory_by_configuration_alone(
    scale_env: dict[str, str], embedder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Environment variables alone move an app to the servers: no folder, no folder lock.
    (``scale_env``: a new database, and the default collection deleted, since another test's
    database may own it.)"""
    home = tmp_path / "home"
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(home))
    for name, value in scale_env.items():
        monkeypatch.setenv(name, value)
    user = "u-" + uuid.uuid4().hex  # the default collection is shared on the session's server
    with TieredMemory(embedder=embedder) as first, TieredMemory(embedder=embedder) as second:
        mid = first.add("user", "I keep bees on the roof in Lisbon", user_id=user, session_id="s")
        hits = second.search("where are the bees?", user_id=user)
        assert [h.id for h in hits] == [mid]
        assert second.stats().messages == 1
        assert second.forget_user(user) == 1
        assert first.search("bees", user_id=user) == []
    assert not home.exists()


def test_turns_a_failed_vector_write_left_pending_are_indexed_at_the_next_open(
        postgres_url: str, chroma_url: str, chroma_collection: str, embedder: Any, tmp_path: Path) -> None:
    """A shared store beside a vector server indexes, when a worker opens it, the turns a failed
    vector write left pending, as VectorIndexError promises ("indexed on the next open"); they
    were found by their words only until a rebuild_index() from one process."""
    from tiered_memory.errors import VectorIndexError
    from tiered_memory.testing import FailingVectorIndex
    from tiered_memory.vector.chroma import ChromaVectorIndex

    def server() -> Any:
        return ChromaVectorIndex.from_url(chroma_url, collection=chroma_collection)

    failing = FailingVectorIndex(server(), fail_on=["upsert"], times=None)
    with TieredMemory(tmp_path / "a", record_store=postgres_url, vector_store=failing, embedder=embedder) as first:
        with pytest.raises(VectorIndexError, match="next open"):
            first.add("user", "I keep bees on the roof in Lisbon", user_id="u1", session_id="s1")
    with TieredMemory(tmp_path / "b", record_store=postgres_url, vector_store=server(), embedder=embedder) as second:
        assert second.store.pending_index(1) == []
        [turn] = second.get_messages("s1", user_id="u1")
        assert second.index.ids("u1") == {turn.id}


def test_workers_starting_together_migrate_once(make_postgres_url: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tiered_memory.store.postgres import MIGRATIONS, PostgresRecordStore

    url = make_postgres_url()
    with ThreadPoolExecutor(6) as pool:
        stores = list(pool.map(lambda _: PostgresRecordStore(url), range(6)))
    try:
        rows = stores[0].query("SELECT name, version FROM schema_migrations ORDER BY version")
        assert rows == [("core", v) for v in range(1, len(MIGRATIONS) + 1)]
        assert all(s.schema_version() == len(MIGRATIONS) for s in stores)
    finally:
        for s in stores:
            s.close()


def test_embedded_vector_index_still_locks_its_folder(postgres_url: str, embedder: Any, tmp_path: Path) -> None:
    from tiered_memory.errors import StoreLockedError

    with TieredMemory(tmp_path / "m", record_store=postgres_url, embedder=embedder):
        with pytest.raises(StoreLockedError):
            TieredMemory(tmp_path / "m", record_store=postgres_url, embedder=embedder)


def test_unreachable_server_fails_fast_without_leaking_the_password() -> None:
    import socket

    from tiered_memory.errors import StoreError
    from tiered_memory.store.postgres import PostgresRecordStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(StoreError) as info:
        PostgresRecordStore(f"postgresql://app:s3cret@127.0.0.1:{port}/app", connect_timeout=2)
    assert "s3cret" not in str(info.value) and "app:***@" in str(info.value)


def test_unknown_record_store_setting_is_a_configuration_error(tmp_path: Path, embedder: Any) -> None:
    from tiered_memory.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="postgresql://"):
        TieredMemory(tmp_path / "m", record_store="mysql://db/app", embedder=embedder)


def test_two_workers_putting_the_same_store_keys_at_once_both_succeed(make_pgvector_url: Any, embedder: Any,
                                                                      tmp_path: Path) -> None:
    # a LangGraph put is an upsert: a key another worker inserted between the lookup and the
    # insert is updated, not a unique-key error
    import threading

    from langchain_tiered_memory import TieredMemoryStore

    url = make_pgvector_url()
    workers = [TieredMemory(tmp_path / f"w{n}", record_store=url, vector_store="pgvector", embedder=embedder)
               for n in range(2)]
    errors: list[BaseException] = []

    def put_all(memory: TieredMemory, tag: str) -> None:
        store = TieredMemoryStore(memory, fields=["text"])
        for r in range(40):
            try:
                store.put(("a", "notes"), f"k{r}", {"text": f"{tag} wrote note {r}"})
            except BaseException as e:  # noqa: BLE001 - every failure is the test's finding
                errors.append(e)

    try:
        threads = [threading.Thread(target=put_all, args=(m, t)) for m, t in zip(workers, "xy")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        store = TieredMemoryStore(workers[0], fields=["text"])
        items = store.search(("a", "notes"), limit=100)
        assert sorted(i.key for i in items) == sorted(f"k{r}" for r in range(40))
        assert workers[0].item_store().count() == 40
        hits = store.search(("a", "notes"), query="note 7", limit=40)  # one vector per item, the row's id
        assert len({h.key for h in hits}) == len(hits) and all(h.score is not None for h in hits)
    finally:
        for m in workers:
            m.close()


def test_two_workers_storing_one_batch_with_chosen_ids_at_once_both_succeed(make_pgvector_url: Any, embedder: Any,
                                                                            tmp_path: Path) -> None:
    # a retry racing the call it retries: the batch is stored once and both get its ids
    import threading

    url = make_pgvector_url()
    workers = [TieredMemory(tmp_path / f"w{n}", record_store=url, vector_store="pgvector", embedder=embedder)
               for n in range(2)]
    batch = [{"role": "user", "content": f"retried message {i}", "id": f"fixed-{i}"} for i in range(50)]
    results: list[Any] = []
    gate = threading.Barrier(2)

    def store(memory: TieredMemory) -> None:
        gate.wait()
        try:
            results.append(memory.add_many(batch, user_id="u", session_id="s"))
        except BaseException as e:  # noqa: BLE001 - every failure is the test's finding
            results.append(e)

    try:
        for _ in range(3):
            for m in workers:
                m.forget_user("u")
            results.clear()
            threads = [threading.Thread(target=store, args=(m,)) for m in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert results == [[f"fixed-{i}" for i in range(50)]] * 2
            assert [m.id for m in workers[1].get_messages("s", user_id="u")] == [f"fixed-{i}" for i in range(50)]
    finally:
        for m in workers:
            m.close()
