"""What the vector index owes, as rows: an id stored again keeps its new vector, one deletion
writes only its own entries, and deletions of different users do not wait for each other.

Run on SQLite and on PostgreSQL, each beside a Chroma index (two engines: what is owed
outlives an index failure in the record store; ``tiered_memory.store.pending_deletes``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.backends import open_layer_store
from tiered_memory.store.pending_deletes import PENDING_DELETIONS, Owed, changed, owed
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.chroma import ChromaVectorIndex

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _chroma(tmp_path: Path) -> ChromaVectorIndex:
    return ChromaVectorIndex(str(tmp_path / "index"))


def test_an_episode_imported_again_keeps_its_new_vectors(make_memory: Callable[..., TieredMemory],
                                                        tmp_path: Path) -> None:
    """An episode deleted while the index failed, then imported again under its id (import_jsonl
    keeps ids): paying the old deletion must not take the imported key points' vectors."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index)
    memory.add("user", "I keep bees on the roof of the library", session_id="s", user_id="u")
    episode = memory.end_session("s", user_id="u")
    points = {i for i in memory.index.ids("u") if i.startswith(f"ep:{episode.id}:")}
    assert points
    dump = tmp_path / "dump.jsonl"
    memory.export_jsonl(dump, user_id="u")
    index.fail_on = {"delete"}  # the server goes down
    with pytest.raises(VectorIndexError):
        memory.delete_episode(episode.id, user_id="u")
    index.healthy()
    memory.import_jsonl(dump)  # brought back, its key points' vectors written again
    assert [e.id for e in memory.episodes("u")] == [episode.id]
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:  # the open pays what is owed
        assert points <= memory.index.ids("u")
        assert memory.store.owed_rows.owed(100) == []
        assert [h.episode.id for h in memory.search_episodes("bees on the roof", user_id="u")] == [episode.id]


def test_a_message_stored_again_as_a_duplicate_keeps_no_vector_of_the_erased_text(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A caller's id forgotten while the index failed, stored again with a text the user holds
    already (a duplicate: no vector of its own): the erased text's vector must still go."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index)
    memory.add("user", "ok", session_id="s", user_id="u")
    memory.add_many([{"id": "note-1", "role": "user", "content": "My bank PIN is 4921"}], session_id="s", user_id="u")
    with pytest.raises(VectorIndexError):
        memory.forget("note-1", user_id="u")
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):  # pending till its old vectors go
        memory.add_many([{"id": "note-1", "role": "user", "content": "ok"}], session_id="s", user_id="u")
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:
        assert "note-1" not in memory.index.ids("u")  # the PIN's embedding is gone
        assert memory.store.owed_rows.owed(100) == []
        assert [m.content for m in memory.get_messages("s", user_id="u")] == ["ok", "ok"]


def _wal_bytes(memory: TieredMemory, record_backend: Any, act: Callable[[], object]) -> int:
    """What ``act`` writes to the record store's log (SQLite's WAL file, PostgreSQL's WAL)."""
    url = getattr(memory.store, "url", None)
    if url is None:
        wal = Path(f"{memory.store.path}-wal")  # type: ignore[attr-defined]
        memory.store.query("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
        before = wal.stat().st_size if wal.exists() else 0
        act()
        return wal.stat().st_size - before
    import psycopg  # PostgreSQL's case only: the torch-free run has no psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
        act()
        return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)",  # type: ignore[index]
                                (start,)).fetchone()[0])


def test_one_deletion_writes_its_own_entries_not_all_that_is_owed(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, record_backend: Any) -> None:
    """With 10,000 turns' vectors owed (a long outage of the index), forgetting one message
    writes about what forgetting it writes with nothing owed: not the whole backlog again."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    memory.add_many([{"role": "user", "content": f"note number {n}"} for n in range(10_000)],
                    session_id="big", user_id="u")
    a, b, c = (memory.add("user", f"small note {n}", session_id="s", user_id="u") for n in range(3))
    index.fail_on = {"delete"}
    with pytest.raises(VectorIndexError):
        memory.forget(a, user_id="u")

    def forget(memory_id: str) -> Callable[[], object]:
        return lambda: pytest.raises(VectorIndexError, memory.forget, memory_id, user_id="u")

    one = _wal_bytes(memory, record_backend, forget(b))  # one entry owed before it
    with pytest.raises(VectorIndexError):
        memory.clear_session("big", user_id="u")  # 10,000 owed
    after = _wal_bytes(memory, record_backend, forget(c))
    assert after < 120_000, (one, after)  # the backlog alone is some 450 KB of JSON


@pytest.mark.timeout(120)
def test_deletions_of_two_users_do_not_wait_for_each_other(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, record_backend: Any) -> None:
    """A deletion of one user whose transaction is still open (it owes vectors, not yet committed)
    does not hold up another user's deletion (PostgreSQL: many workers; SQLite has one writer)."""
    if not record_backend("mem"):
        pytest.skip("SQLite has one writer at a time by design")
    memory = make_memory(vector_store=_chroma(tmp_path))
    fact = memory.add_fact("User sails on weekends", user_id="b")
    rows = open_layer_store(memory.store)
    done = threading.Event()
    errors: list[BaseException] = []

    def delete_b() -> None:
        try:
            memory.delete_fact(fact.id, user_id="b")
        except BaseException as e:
            errors.append(e)
        done.set()

    with rows.unit() as u:  # user a's deletion, in flight
        u.owe_vectors("a", vectors=["fact:gone-a"])
        other = threading.Thread(target=delete_b)
        other.start()
        finished = done.wait(20)
    other.join(60)
    assert finished and not errors, errors
    assert memory.facts("b") == []
    rows_left = {(e.user_id, e.item_id) for e in memory.store.owed_rows.owed(100)}
    assert ("a", "fact:gone-a") in rows_left and ("b", f"fact:{fact.id}") not in rows_left


def test_what_an_earlier_version_owes_in_meta_is_moved_into_the_table_and_paid(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A worker of the version before the table (a rolling upgrade) deletes a turn and records it
    the old way, ``["turn", id]`` in the meta record: the next open moves it into the table and
    pays it (the record keeps only users: unfinished forget_user calls, finished by the open too)."""
    memory = make_memory(vector_store=_chroma(tmp_path))
    gone = memory.add("user", "My bank PIN is 4921", session_id="s", user_id="u")
    kept = memory.add("user", "I keep bees", session_id="s", user_id="u")
    store: Any = memory.store  # the old worker deletes the row, and records its vectors in meta
    if getattr(store, "url", None) is None:
        with store.transaction() as c:
            c.execute("DELETE FROM messages WHERE id=?", (gone,))
    else:
        store.write(lambda c: c.execute("DELETE FROM messages WHERE id=%s", (gone,)))
    memory.store.change_meta(PENDING_DELETIONS, lambda raw: changed(raw, add=Owed(
        users=frozenset({"nobody"}), turns=frozenset({gone}))))
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:
        assert gone not in memory.index.ids("u") and kept in memory.index.ids("u")
        left = owed(memory.store.get_meta(PENDING_DELETIONS))
        assert (left.turns, left.vectors) == (frozenset(), frozenset()) and memory.store.owed_rows.owed(100) == []


def _waits_or_ends(url: str, thread: threading.Thread) -> None:
    """Poll until ``thread`` ended or a backend of the database waits for a lock."""
    import psycopg  # PostgreSQL's case only: the torch-free run has no psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while thread.is_alive() and conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'").fetchone()[0] < 1:  # type: ignore[index]
            conn.execute("SELECT pg_sleep(0.02)")


@pytest.mark.timeout(120)
def test_an_id_stored_again_waits_for_a_payment_of_it_in_flight(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, record_backend: Any) -> None:
    """Another worker paying the old deletion of ``note-1`` (its entry read, its index delete under
    way) when ``note-1`` is stored again: the write waits for that payment, so the new vector is
    written after the old one is deleted, never before (PostgreSQL: many workers)."""
    if not record_backend("mem"):
        pytest.skip("SQLite has one writer at a time by design")
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index)
    memory.add_many([{"id": "note-1", "role": "user", "content": "My bank PIN is 4921"}], session_id="s", user_id="u")
    with pytest.raises(VectorIndexError):
        memory.forget("note-1", user_id="u")
    index.healthy()
    errors: list[BaseException] = []

    def store_again() -> None:
        try:
            memory.add_many([{"id": "note-1", "role": "user", "content": "I moved to Porto"}], session_id="s",
                            user_id="u")
        except BaseException as e:
            errors.append(e)

    writer = threading.Thread(target=store_again)
    with memory.store.owed_rows.paying(memory.store.owed_rows.owed(10)) as due:  # the other worker's payment
        assert [e.item_id for e in due] == ["note-1"]
        writer.start()
        _waits_or_ends(str(record_backend("mem")["record_store"]), writer)
        index.inner.delete(["note-1"])  # its index delete, then its entries paid as the block ends
    writer.join(60)
    assert not writer.is_alive() and not errors, errors
    assert "note-1" in memory.index.ids("u")
    assert [h.text for h in memory.search("where did I move?", user_id="u", k=1)] == ["I moved to Porto"]


def test_an_import_after_a_forget_user_left_unfinished_is_kept(make_memory: Callable[..., TieredMemory],
                                                                tmp_path: Path) -> None:
    """A user's backup imported after their ``forget_user`` failed half-way (the index down): the
    import finishes that deletion first, as ``add_many`` does, so the next open does not finish it
    over the imported rows and delete them."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index)
    memory.add("user", "I keep bees on the roof of the library", session_id="s", user_id="u")
    fact = memory.add_fact("User keeps bees", user_id="u")
    dump = tmp_path / "dump.jsonl"
    memory.export_jsonl(dump, user_id="u")
    index.fail_on = {"delete_user"}  # the server goes down
    with pytest.raises(VectorIndexError):
        memory.forget_user("u")
    index.healthy()
    report = memory.import_jsonl(dump)  # the backup restored
    assert (report.imported, report.facts_imported) == (1, 1)
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:  # the open finishes what is unfinished
        assert [m.content for m in memory.get_messages("s", user_id="u")] == ["I keep bees on the roof of the library"]
        assert [f.id for f in memory.facts("u")] == [fact.id]
        assert "I keep bees on the roof of the library" in [h.text for h in memory.search("bees on the roof",
                                                                                          user_id="u")]
