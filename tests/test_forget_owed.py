"""A deletion whose vector delete fails leaves no vector for good.

Every path that deletes rows with vectors (``forget``, ``clear_session``, ``delete_fact``,
``delete_episode``) records the vectors it owes the index in the transaction that deletes
the rows; an index that fails then raises :class:`VectorIndexError`, and the vectors are
deleted at the next open or before the next write (``tiered_memory.recall.forgetting``).
Run on SQLite and on PostgreSQL, each beside a Chroma index (two engines: what is owed
outlives the failure in the record store).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tiered_memory import (ConsolidationConfig, MemoryConfig, NotFoundError, StoreError, TieredMemory,
                           VectorIndexError)
from tiered_memory.store.pending_deletes import PENDING_DELETIONS, owed
from tiered_memory.store.postgres import PostgresRecordStore
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.chroma import ChromaVectorIndex

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

Act = Callable[[TieredMemory], set[str]]  # sets up, deletes, returns the vector ids that must go


def _secret(memory: TieredMemory) -> str:
    memory.add("user", "I keep bees on the roof of the library", session_id="kept", user_id="u")
    return memory.add("user", "My bank PIN is 4921, do not tell anyone", session_id="s", user_id="u")


def _forget(memory: TieredMemory) -> tuple[Callable[[], object], set[str]]:
    gone = _secret(memory)
    return lambda: memory.forget(gone, user_id="u"), {gone}


def _clear_session(memory: TieredMemory) -> tuple[Callable[[], object], set[str]]:
    ids = {_secret(memory), memory.add("user", "and my mother's maiden name is Quist", session_id="s", user_id="u")}
    return lambda: memory.clear_session("s", user_id="u"), ids


def _delete_fact(memory: TieredMemory) -> tuple[Callable[[], object], set[str]]:
    _secret(memory)
    fact = memory.add_fact("User's bank PIN is 4921", user_id="u")
    return lambda: memory.delete_fact(fact.id, user_id="u"), {f"fact:{fact.id}"}


def _delete_episode(memory: TieredMemory) -> tuple[Callable[[], object], set[str]]:
    _secret(memory)
    before = memory.index.ids("u")
    episode = memory.end_session("s", user_id="u")
    points = {i for i in memory.index.ids("u") - before if i.startswith("ep:")}
    assert points
    return lambda: memory.delete_episode(episode.id, user_id="u"), points


DELETIONS = {"forget": _forget, "clear_session": _clear_session, "delete_fact": _delete_fact,
             "delete_episode": _delete_episode}


def _chroma(tmp_path: Path) -> ChromaVectorIndex:
    return ChromaVectorIndex(str(tmp_path / "index"))


def _owed(memory: TieredMemory) -> set[str]:
    return {e.item_id for e in memory.store.owed_rows.owed(10_000)}


@pytest.mark.parametrize("kind", sorted(DELETIONS))
def test_a_deletion_whose_vectors_fail_to_go_deletes_them_at_the_next_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, kind: str) -> None:
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=[], times=None)
    memory = make_memory(vector_store=index)
    delete, vectors = DELETIONS[kind](memory)
    index.fail_on = {"delete"}  # the server goes down
    with pytest.raises(VectorIndexError, match="deleted, but their vectors not yet"):
        delete()
    assert vectors <= index.inner.ids("u")  # the embeddings of the erased text are still stored...
    assert _owed(memory)  # ...and the record store says they are owed
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:  # the index is back: the open pays
        assert not vectors & memory.index.ids("u")
        assert _owed(memory) == set()
        assert [h.text for h in memory.search("bees on the roof", user_id="u", k=1)] == [
            "I keep bees on the roof of the library"]  # what was not deleted stays found


def test_the_next_write_deletes_what_a_failed_forget_left(make_memory: Callable[..., TieredMemory],
                                                         tmp_path: Path) -> None:
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=1)
    memory = make_memory(vector_store=index)
    gone = _secret(memory)
    with pytest.raises(VectorIndexError):
        memory.forget(gone, user_id="u")
    assert gone in index.inner.ids("u")
    memory.add("user", "Another note", session_id="s", user_id="u")  # the index answers again
    assert gone not in index.inner.ids("u") and _owed(memory) == set()


def test_an_id_stored_again_keeps_its_new_vector(make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A caller's id forgotten while the index failed and stored again before the index came back:
    the owed deletion must not take the new message's vector."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index)
    memory.add_many([{"id": "note-1", "role": "user", "content": "My bank PIN is 4921"}], session_id="s", user_id="u")
    with pytest.raises(VectorIndexError):
        memory.forget("note-1", user_id="u")
    with pytest.raises(VectorIndexError, match="stored but not yet indexed"):  # pending till its old vectors go
        memory.add_many([{"id": "note-1", "role": "user", "content": "I moved to Porto"}], session_id="s",
                        user_id="u")
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:
        assert "note-1" in memory.index.ids("u") and _owed(memory) == set()
        assert [h.text for h in memory.search("where did I move?", user_id="u", k=1)] == ["I moved to Porto"]


def test_rebuild_index_clears_what_is_owed(make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete"], times=None)
    memory = make_memory(vector_store=index)
    gone = _secret(memory)
    with pytest.raises(VectorIndexError):
        memory.forget(gone, user_id="u")
    index.healthy()
    assert gone in index.inner.ids("u") and _owed(memory) == {gone}
    memory.rebuild_index()  # drops every vector and writes those of the rows: none of the forgotten turn
    assert gone not in index.inner.ids("u") and _owed(memory) == set()


def test_forget_user_and_a_turns_vectors_both_owed(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                   record_backend: Any) -> None:
    """An interrupted forget_user (its user in the meta record) and a turn's vectors (a row of
    their own) are both finished by the next open."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete", "delete_user"], times=None)
    memory = make_memory(vector_store=index)
    gone = _secret(memory)
    memory.add("user", "I leave", session_id="s", user_id="leaver")
    with pytest.raises(VectorIndexError):
        memory.forget(gone, user_id="u")
    with pytest.raises(VectorIndexError):
        memory.forget_user("leaver")
    assert (set(owed(memory.store.get_meta(PENDING_DELETIONS)).users), _owed(memory)) == ({"leaver"}, {gone})
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:
        assert not owed(memory.store.get_meta(PENDING_DELETIONS)) and _owed(memory) == set()
        assert memory.index.ids("leaver") == set() and gone not in memory.index.ids("u")


@pytest.mark.parametrize("write", ["delete_fact", "add_fact"])
def test_a_write_failing_after_it_finished_a_failed_forget_user_leaves_it_finished(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, write: str) -> None:
    """Two engines: a write of a user whose ``forget_user`` failed half-way finishes it first, each
    step committed on its own (no transaction around the write, as pgvector's has:
    tests/test_pgvector_joint_deletes.py). The write failing after that (the fact it deletes went
    with the user; the new fact's vector refused) undoes none of it: the forgotten vectors stay
    gone, the user's next ``add`` is stored, and the next open deletes none of it."""
    index = FailingVectorIndex(_chroma(tmp_path), fail_on=["delete_user"], times=1)
    memory = make_memory(vector_store=index)
    gone = _secret(memory)
    fact = memory.add_fact("User keeps bees on the roof", user_id="u")
    with pytest.raises(VectorIndexError):
        memory.forget_user("u")
    assert gone in index.inner.ids("u")  # half-way: the rows deleted, the vectors not
    if write == "delete_fact":
        with pytest.raises(NotFoundError):  # the fact went with the user's rows
            memory.delete_fact(fact.id, user_id="u")
    else:
        index.fail_on, index.times = {"upsert"}, 2
        with pytest.raises(VectorIndexError):  # stored, its vector refused
            memory.add_fact("User moved to Porto", user_id="u")
    assert index.inner.ids("u") == set(), "the forgotten user's vectors outlived the finish"
    new = memory.add("user", "I sail on Mondays", session_id="s2", user_id="u")
    memory.close()
    with make_memory(vector_store=_chroma(tmp_path)) as memory:
        assert not owed(memory.store.get_meta(PENDING_DELETIONS))
        assert [m.id for m in memory.get_messages("s2", user_id="u")] == [new]
        assert [f.text for f in memory.facts("u")] == ([] if write == "delete_fact" else ["User moved to Porto"])
        assert memory.index.ids("u") == {new} | {f"fact:{f.id}" for f in memory.facts("u")}


@contextlib.contextmanager
def _refusing_message_deletes(memory: TieredMemory) -> Iterator[None]:
    """While it runs, the record store refuses to delete a message (as a full disk would)."""
    store = memory.store
    if isinstance(store, PostgresRecordStore):
        import psycopg  # (the torch-free suite's venv has no PostgreSQL driver: it runs the SQLite cases)

        with psycopg.connect(store.url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{store.schema}"')
            conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
                         " $$ BEGIN RAISE EXCEPTION 'disk full'; END $$")
            conn.execute("CREATE TRIGGER refuse BEFORE DELETE ON messages FOR EACH ROW EXECUTE FUNCTION refuse()")
            try:
                yield
            finally:
                conn.execute("DROP TRIGGER refuse ON messages")
                conn.execute("DROP FUNCTION refuse()")
        return
    with contextlib.closing(sqlite3.connect(memory.path / "records.sqlite3", isolation_level=None)) as db:
        db.execute("CREATE TRIGGER refuse BEFORE DELETE ON messages BEGIN SELECT RAISE(ABORT, 'disk full'); END")
        try:
            yield
        finally:
            db.execute("DROP TRIGGER refuse")


@pytest.mark.parametrize("call", ["end_session", "consolidate"])
def test_a_call_after_a_failed_forget_user_draws_nothing_from_the_forgotten_rows(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, call: str) -> None:
    """A ``forget_user`` whose row delete failed leaves the user's rows in place, the deletion
    pending. ``end_session`` read the turns (``consolidate`` the episodes it promotes), then its
    first write finished the deletion and stored the facts and episode drawn from them, which
    outlived it. ``consolidate`` finishes it before it reads; ``end_session`` before it stores,
    and then stores nothing of turns gone."""
    memory = make_memory(vector_store=_chroma(tmp_path),
                         config=MemoryConfig(consolidation=ConsolidationConfig(promote_access_count=0)))
    memory.add("user", "I live in Lisbon and my bank PIN is 4921", session_id="s", user_id="u")
    if call == "consolidate":
        memory.end_session("s", user_id="u")  # an episode, promoted by any run
    with _refusing_message_deletes(memory), pytest.raises(StoreError, match="disk full"):
        memory.forget_user("u")
    draws_nothing(memory, call, lambda: memory.index.ids("u"))


def draws_nothing(memory: TieredMemory, call: str, vectors: Callable[[], set[str]]) -> None:
    """After a failed ``forget_user`` of "u": ``call`` ("end_session" or "consolidate") draws nothing
    from the user's rows, and nothing of theirs is left (``vectors()``: their vector ids)."""
    if call == "end_session":
        with pytest.raises(NotFoundError, match="has no messages"):
            memory.end_session("s", user_id="u")
    else:
        assert memory.consolidate("u").promoted == 0
    assert (memory.facts("u"), memory.episodes("u"), vectors()) == ([], [], set())
