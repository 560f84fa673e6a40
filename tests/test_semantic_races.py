"""A fact's write against another writer between its read and its write.

``add_fact`` (a fact said again, said more fully, or contradicting one) and ``update_fact``
read the fact they act on, then open their write transaction. Another process's delete,
invalidation or edit committed between the two made the write act on the row as it was read:
a deleted fact "confirmed" and the fact said lost (``NotFoundError``), an invalidated fact
confirmed again, a fact edited into another slot invalidated by a fact of the old one, an
edit's text lost to an update of the metadata. The row is read in the write's transaction
now (held till it commits: ``FOR UPDATE`` on PostgreSQL). The other writer is forced in
just before that transaction begins, through the public API, as in
``test_consolidation_merge_races.py`` (SQLite's folder lock keeps other processes out; the
interleaving is the one another process makes on PostgreSQL).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from hook_support import before_first_write
from tiered_memory import NotFoundError, StaticEmbedder, TieredMemory
from tiered_memory.embedding import embed_query
from tiered_memory.records import FactCandidate


def _actions(memory: TieredMemory, fact_id: str) -> list[str]:
    return [h.action for h in memory.fact_history("u", fact_id)]


def test_a_fact_said_again_after_another_writer_deleted_it_is_stored_anew(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.delete_fact(old.id, user_id="u"))
    # said again (with a key of its own: a no-op with nothing new writes nothing); the confirm went
    # to the deleted row and add_fact raised NotFoundError: what the user said was lost
    again = memory.add_fact("User enjoys hiking in the mountains", user_id="u", metadata={"seen": 2})
    assert fired
    assert again.id != old.id and again.valid and again.metadata["seen"] == 2
    assert [(f.id, f.text) for f in memory.facts("u")] == [(again.id, "User enjoys hiking in the mountains")]
    assert _actions(memory, old.id) == ["add", "delete"]
    assert memory.search_facts("hiking", user_id="u", k=1)[0].fact.id == again.id


def test_a_fact_said_again_after_another_writer_invalidated_it_is_not_confirmed(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    lisbon = memory.add_fact("User lives in Lisbon", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.add_fact("User lives in Porto", user_id="u"))
    # the invalidated fact was confirmed (sources, time, a confirm entry) and returned, invalid, while
    # Porto, said before it, stayed the user's city
    said = memory.add_fact("User lives in Lisbon", user_id="u", metadata={"seen": 2})
    assert fired
    assert said.valid and said.text == "User lives in Lisbon" and said.id != lisbon.id
    assert [f.text for f in memory.facts("u")] == ["User lives in Lisbon"]  # the last said, as if one at a time
    assert "confirm" not in _actions(memory, lisbon.id)


def test_a_fact_contradicting_one_another_writer_edited_into_another_slot_leaves_it_valid(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User lives in Lisbon", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.update_fact(
        old.id, user_id="u", text="User works at ACME"))
    # the invalidation was decided on the fact as read (Lisbon): the edited fact (ACME) went invalid
    porto = memory.add_fact("User lives in Porto", user_id="u")
    assert fired
    assert sorted(f.text for f in memory.facts("u")) == ["User lives in Porto", "User works at ACME"]
    assert porto.valid and _actions(memory, old.id) == ["add", "edit"]


def test_a_fact_contradicting_one_another_writer_deleted_writes_no_history_to_the_deleted_fact(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User lives in Lisbon", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.delete_fact(old.id, user_id="u"))
    porto = memory.add_fact("User lives in Porto", user_id="u")
    assert fired
    assert [f.id for f in memory.facts("u")] == [porto.id]
    assert _actions(memory, old.id) == ["add", "delete"]  # not an invalidation after its deletion


def test_update_fact_of_a_fact_another_writer_deleted_is_not_found_and_writes_nothing(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.delete_fact(old.id, user_id="u"))
    with pytest.raises(NotFoundError):
        memory.update_fact(old.id, user_id="u", text="User enjoys sailing on lakes")
    assert fired
    assert _actions(memory, old.id) == ["add", "delete"]  # an edit entry was written after the delete
    assert memory.facts("u") == []


def test_update_fact_keeps_what_another_writer_changed_meanwhile(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User enjoys hiking in the mountains", user_id="u", metadata={"a": 1})
    fired = before_first_write(memory, monkeypatch, lambda: memory.update_fact(
        old.id, user_id="u", text="User enjoys sailing on lakes", metadata={"b": 2}))
    # the metadata edit wrote back the text and metadata as it had read them: the other edit was lost
    new = memory.update_fact(old.id, user_id="u", metadata={"c": 3}, confidence=0.5)
    assert fired
    assert new.text == "User enjoys sailing on lakes" and new.confidence == 0.5
    assert {k: new.metadata[k] for k in "abc"} == {"a": 1, "b": 2, "c": 3}
    assert memory.facts("u") == [new]
    [edit] = [h for h in memory.fact_history("u", old.id) if h.action == "edit" and "c" in h.details["metadata_keys"]]
    assert edit.old_text == edit.new_text == "User enjoys sailing on lakes"
    assert memory.search_facts("sailing on lakes", user_id="u", k=1)[0].fact.id == old.id


def test_an_edit_into_a_slot_leaves_alone_the_slots_fact_another_writer_deleted_meanwhile(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    lisbon = memory.add_fact("User lives in Lisbon", user_id="u")
    hiking = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.delete_fact(lisbon.id, user_id="u"))
    # the edit made the slot's other fact, as read before its write, invalid: after its deletion
    moved = memory.update_fact(hiking.id, user_id="u", text="User lives in Porto")
    assert fired
    assert memory.facts("u") == [moved] and moved.key == "residence"
    assert _actions(memory, lisbon.id) == ["add", "delete"]


def test_a_fact_said_more_fully_after_another_writer_deleted_the_fact_it_refines_is_stored_anew(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User plays the piano", user_id="u")
    fired = before_first_write(memory, monkeypatch, lambda: memory.delete_fact(old.id, user_id="u"))
    # the update rewrote the deleted row (nothing) and add_fact raised NotFoundError: the fact was lost
    fuller = memory.add_fact("User plays the piano every evening", user_id="u")
    assert fired
    assert [(f.id, f.text) for f in memory.facts("u")] == [(fuller.id, "User plays the piano every evening")]
    assert fuller.id != old.id and _actions(memory, old.id) == ["add", "delete"]


def test_a_fact_said_again_with_nothing_new_after_another_writer_deleted_it_is_stored_anew(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """Said again with nothing new, nothing is written: add_fact returns the fact it names, read
    once more after the resolution; another writer's delete in between raised NotFoundError."""
    memory = make_memory()
    old = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    rows = memory._layers.facts.rows
    real = rows.fact
    reads: list[str] = []

    def fact(user_id: str, fact_id: str) -> Any:
        reads.append(fact_id)
        if len(reads) == 2:  # the resolution read it (first); add_fact reads it to return it
            memory.delete_fact(old.id, user_id="u")
        return real(user_id, fact_id)

    monkeypatch.setattr(rows, "fact", fact)
    again = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    assert len(reads) >= 2
    assert again.id != old.id and [f.id for f in memory.facts("u")] == [again.id]


def test_update_fact_returns_the_fact_as_it_wrote_it_though_another_writer_deletes_it_right_after(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit commits, then another writer deletes the fact before the edit read it back to
    return it: NotFoundError said the edit failed, though it was written (its history says so)."""
    memory = make_memory()
    old = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    rows = memory._layers.rows
    real = rows.unit
    done: list[bool] = []

    @contextlib.contextmanager
    def unit() -> Iterator[Any]:
        with real() as u:
            yield u
        if not done:
            done.append(True)
            memory.delete_fact(old.id, user_id="u")

    monkeypatch.setattr(rows, "unit", unit)
    new = memory.update_fact(old.id, user_id="u", text="User enjoys sailing on lakes")
    assert done and (new.id, new.text) == (old.id, "User enjoys sailing on lakes")
    assert _actions(memory, old.id) == ["add", "edit", "delete"] and memory.facts("u") == []


def test_delete_fact_of_a_fact_another_writer_edited_or_deleted_meanwhile_logs_what_it_deleted(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    memory = make_memory()
    old = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    before_first_write(memory, monkeypatch, lambda: memory.update_fact(
        old.id, user_id="u", text="User enjoys sailing on lakes"))
    memory.delete_fact(old.id, user_id="u")
    [*_, deleted] = memory.fact_history("u", old.id)
    assert deleted.action == "delete" and deleted.old_text == "User enjoys sailing on lakes"  # not the text as read
    gone = memory.add_fact("User enjoys hiking in the mountains", user_id="u")
    before_first_write(memory, monkeypatch, lambda: memory.delete_fact(gone.id, user_id="u"))
    with pytest.raises(NotFoundError):  # a second delete entry, and no error, as though it had deleted it
        memory.delete_fact(gone.id, user_id="u")
    assert _actions(memory, gone.id) == ["add", "delete"]


def _after_first_lock(memory: TieredMemory, monkeypatch: pytest.MonkeyPatch, then: Callable[[], None]) -> None:
    """Run ``then`` once, right after the first statement by which the memory's next write unit
    holds facts (``held_facts``: the rows it locks on PostgreSQL) returns, inside that unit."""
    rows = memory._layers.rows
    real = rows.unit
    fired: list[bool] = []

    class Held:
        def __init__(self, u: Any) -> None:
            self._u = u

        def held_facts(self, user_id: str, ids: Any) -> Any:
            found = self._u.held_facts(user_id, ids)
            if not fired:
                fired.append(True)
                then()
            return found

        def __getattr__(self, name: str) -> Any:
            return getattr(self._u, name)

    @contextlib.contextmanager
    def unit() -> Iterator[Any]:
        with real() as u:
            yield Held(u)

    monkeypatch.setattr(rows, "unit", unit)


@pytest.mark.servers
def test_two_edits_moving_facts_into_each_others_slots_both_commit(
        make_postgres_url: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers on PostgreSQL, each editing a fact into the slot of the other's: an edit held
    its fact in one statement and the slot's other facts in a second, so each held its own and
    waited for the other's, a deadlock PostgreSQL broke by failing one edit (StoreError). Forced
    here: the second edit starts once the first holds what its first statement locks, and the
    first goes on once the second holds its own or waits for a lock."""
    import psycopg

    url = make_postgres_url()
    one = TieredMemory(tmp_path / "one", record_store=url, embedder=StaticEmbedder())
    two = TieredMemory(tmp_path / "two", record_store=url, embedder=StaticEmbedder())
    try:
        lisbon = one.add_fact("User lives in Lisbon", user_id="u")
        acme = one.add_fact("User works at ACME", user_id="u")
        assert (lisbon.key, acme.key) == ("residence", "employer")
        held, out = threading.Event(), []

        def second() -> None:
            try:
                out.append(two.update_fact(acme.id, user_id="u", text="User lives in Porto"))
            except BaseException as e:  # the test reads it
                out.append(e)

        def first_holds() -> None:
            worker = threading.Thread(target=second, daemon=True)
            worker.start()
            with psycopg.connect(url, autocommit=True) as c:
                for _ in range(500):  # the second edit holds its fact, or waits for one the first holds
                    waiting = c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                        " AND datname = current_database()").fetchone()
                    if held.is_set() or (waiting is not None and waiting[0]) or not worker.is_alive():
                        return
                    time.sleep(0.01)
            raise AssertionError("the second edit neither held its fact nor waited for a lock")

        _after_first_lock(one, monkeypatch, first_holds)
        _after_first_lock(two, monkeypatch, held.set)
        moved = one.update_fact(lisbon.id, user_id="u", text="User works at Initech")
        for _ in range(1000):
            if out:
                break
            time.sleep(0.01)
        assert out and not isinstance(out[0], BaseException), out
        assert moved.key == "employer" and out[0].text == "User lives in Porto"  # type: ignore[union-attr]
    finally:
        one.close()
        two.close()


def test_a_fact_another_writer_edits_while_a_rebuild_embeds_it_keeps_its_new_texts_vector(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """``rebuild_index`` reads the facts, embeds them, and writes their vectors into the rows and
    the index. Another writer's edit committed between the read and the write lost its vector:
    the row took the old text's (kept: consolidation and the slot's resolution read it) and the
    index too. A vector is written only to a row still holding the text it was embedded from."""
    embedder = StaticEmbedder()
    memory = make_memory(embedder=embedder)
    old = memory.add_fact("User plays the violin", user_id="u")
    rows = memory._layers.rows
    real = rows.valid_facts
    edited: list[bool] = []

    def read_then_edited(user_id: str | None = None) -> Any:
        found = real(user_id)  # the rebuild's read (nothing else reads it); the edit commits right after
        if not edited:
            edited.append(True)
            memory.update_fact(old.id, user_id="u", text="User plays the cello")
        return found

    monkeypatch.setattr(rows, "valid_facts", read_then_edited)
    memory.rebuild_index()
    assert edited
    cello = embed_query(embedder, "User plays the cello")
    [(fact, stored)] = rows.fact_vectors("u")
    assert fact.text == "User plays the cello" and stored is not None
    assert float(stored @ cello) == pytest.approx(1.0, abs=1e-5)  # not the violin's
    [[(vector_id, similarity)]] = memory.index.query(cello[None, :], user_id="u", k=1, layers=["fact"])
    assert vector_id == f"fact:{old.id}" and similarity == pytest.approx(1.0, abs=1e-5)


def test_one_restatement_another_writer_counted_meanwhile_is_confirmed_once(
        make_memory: Callable[..., TieredMemory], monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's restatement citing no turn confirms a fact when dated after its last statement,
    decided on the history read before the write's transaction: two workers reading one span's
    restatement at once (each ``end_session``'s, here the layer's own call) both found it news and
    wrote two ``confirm`` entries for one statement. The second, held in its transaction, sees the
    first's confirmation (the fact's update time moved) and decides again: nothing new."""
    memory = make_memory(embedder=StaticEmbedder())
    fact = memory.add_fact("User lives in Berlin", user_id="u", confidence=0.9)
    said = FactCandidate(type="fact", text="User lives in Berlin", confidence=0.5)
    t = fact.valid_from + 60.0
    facts = memory._layers.facts
    fired = before_first_write(memory, monkeypatch, lambda: facts.resolve_and_apply("u", said, at=t))
    facts.resolve_and_apply("u", said, at=t)
    assert fired
    confirms = [h for h in memory.fact_history("u", fact.id) if h.action == "confirm"]
    assert [h.details["said_at"] for h in confirms] == [t]
