"""A deletion of one user (``forget_user``, ``forget``, ``clear_session``) does not hold up the
writes of the others.

The vector index deletes the user's vectors (by filter, or by id), which on a vector server under
load, or for a user with many vectors, takes a while. That delete runs outside the memory's write
lock: another user's ``add`` is stored meanwhile. The same user's writes wait for it (the delete
would take their vectors too): its ``add`` before the write lock, a fact or an episode at its
vector write. Each race is forced at its point: the real Chroma index below blocks its
``delete_user``, or its ``delete`` of user a's ids, on an event (every wait bounded, so a
regression fails instead of hanging).
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import TieredMemory, VectorIndexError
from tiered_memory.layers.items import ItemWrite
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.vector.base import ExactScope, VectorItem, WritesBehind
from tiered_memory.vector.chroma import ChromaVectorIndex

WAIT = 10.0  # the longest any step waits for another thread: a test that would hang fails instead


class HeldDeletes(ChromaVectorIndex):
    """The real Chroma index; while ``held``, ``delete_user`` and a ``delete`` of any of the ids in
    ``held_ids`` set ``entered`` and wait for ``release`` (then fail with ``error``, if set, once).
    ``landed`` is set by a write of user ``a``'s vectors that reaches the index while its delete is held."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.held = False
        self.held_ids: set[str] = set()
        self.entered, self.release, self.landed = threading.Event(), threading.Event(), threading.Event()
        self.error: Exception | None = None

    def upsert(self, items: list[VectorItem]) -> None:
        if self.entered.is_set() and not self.release.is_set() and any(i.user_id == "a" for i in items):
            self.landed.set()
        super().upsert(items)

    def delete_user(self, user_id: str) -> None:
        if self.held:
            self._hold()
        super().delete_user(user_id)

    def delete(self, ids: list[str]) -> None:
        if self.held and self.held_ids & set(ids):
            self._hold()
        super().delete(ids)

    def _hold(self) -> None:
        self.entered.set()
        if not self.release.wait(WAIT):
            raise RuntimeError("HeldDeletes was not released")
        if self.error is not None:  # once: a later delete (the payment the failure left) goes through
            error, self.error = self.error, None
            raise error


class Run:
    """``fn`` in a thread; ``result()`` its value or error, waiting at most ``WAIT``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.value = fn()
            except BaseException as e:
                self.error = e
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self) -> Any:
        assert self.done.wait(WAIT), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.value


def meanwhile(fn: Callable[[], Any], why: str) -> Any:
    """``fn``'s value, run in a thread while something else is held: it must return within
    ``WAIT`` (else ``why``), proving it did not wait for what is held."""
    run = Run(fn)
    assert run.done.wait(WAIT), why
    return run.result()


@pytest.fixture
def held(make_memory: Callable[..., TieredMemory], tmp_path: Path, request: pytest.FixtureRequest,
         ) -> tuple[TieredMemory, HeldDeletes]:
    """A memory over a :class:`HeldDeletes` index (parametrised ``indirect`` with ``"wrapped"``: seen
    through a wrapper that answers every method dynamically, as ``FailingVectorIndex`` does)."""
    index = HeldDeletes(str(tmp_path / "index"))
    wrapped = getattr(request, "param", None) == "wrapped"
    memory = make_memory(vector_store=FailingVectorIndex(index, fail_on=()) if wrapped else index)
    memory.add_many([{"role": "user", "content": "My bank PIN is 4921, do not tell anyone"},
                     {"role": "user", "content": "I keep bees on the roof of the library"}],
                    session_id="s", user_id="a")
    memory.add("user", "I sail on Sundays", session_id="s", user_id="b")
    index.held, index.held_ids = True, set(index.ids("a"))
    return memory, index


def _forgetting(memory: TieredMemory, index: HeldDeletes) -> Run:
    """``forget_user("a")`` started in a thread and held inside the index's delete."""
    forget = Run(lambda: memory.forget_user("a"))
    assert index.entered.wait(WAIT), "forget_user never reached the index's delete"
    return forget


def test_another_users_add_is_stored_while_a_forget_user_deletes_vectors(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    memory, index = held
    forget = _forgetting(memory, index)
    try:
        new = meanwhile(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="b"),
                        "b's add waited for a's vector delete")
        assert forget.thread.is_alive()  # a's delete still held: b's write did not wait for it
    finally:
        index.release.set()
    assert forget.result() == 2
    assert {m.id for m in memory.get_messages("s", user_id="b")} >= {new}
    assert new in memory.index.ids("b") and memory.index.ids("a") == set()


def test_the_same_users_add_waits_for_the_delete_and_keeps_its_vector(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    memory, index = held
    forget = _forgetting(memory, index)
    try:
        add = Run(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="a"))
        assert not add.done.wait(0.1)  # it waits for a's delete (which would take its vector too)
    finally:
        index.release.set()
    assert forget.result() == 2
    new = add.result()
    assert [m.id for m in memory.get_messages("s", user_id="a")] == [new]  # the forgotten turns gone, the new one kept
    assert memory.index.ids("a") == {new}
    assert memory.search("where did I move?", user_id="a")[0].id == new


@pytest.mark.parametrize(("held", "write"), [("engine", "upsert"), ("engine", "upsert_behind"), ("wrapped", "upsert")],
                         indirect=["held"])
def test_a_vector_write_for_the_user_waits_for_the_delete_another_users_does_not(
        held: tuple[TieredMemory, HeldDeletes], write: str) -> None:
    """What writes vectors (turns, facts, episodes, items, an import) writes them through
    ``parts.index``: the gate holds the user's, forwards the others' at once; both writes, whether
    the index's class names them (the engine) or its ``__getattr__`` answers them (a wrapper)."""
    memory, index = held
    gated, vector = memory.parts.index, memory.embedder.embed_documents(["I moved to Porto"])[0]
    if not isinstance(memory.index, FailingVectorIndex):
        for protocol in (ExactScope, WritesBehind):  # the index's optional parts, seen by a static look-up too
            assert isinstance(gated, protocol) and all(inspect.getattr_static(gated, name, None) is not None
                                                       for name in dir(protocol) if not name.startswith("_"))
    forget = _forgetting(memory, index)
    try:
        Run(lambda: getattr(gated, write)([VectorItem(id="b-new", vector=vector, user_id="b")])).result()
        upsert = Run(lambda: getattr(gated, write)([VectorItem(id="a-new", vector=vector, user_id="a")]))
        assert not index.landed.wait(0.1) and not upsert.done.is_set()  # held before the index
    finally:
        index.release.set()
    assert forget.result() == 2
    upsert.result()
    if write == "upsert_behind":
        index.settle_behind(wait=True)
    assert memory.index.ids("a") == {"a-new"} and "b-new" in memory.index.ids("b")


def test_a_fact_written_for_the_user_during_the_delete_keeps_its_vector(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    memory, index = held
    forget = _forgetting(memory, index)
    try:
        add = Run(lambda: memory.add_fact("User moved to Porto", user_id="a"))
        assert not index.landed.wait(0.1)  # its vector waits for a's delete, which would take it too
    finally:
        index.release.set()
    assert forget.result() == 2
    fact = add.result()
    assert [f.id for f in memory.facts("a")] == [fact.id]
    assert memory.index.ids("a") == {f"fact:{fact.id}"}


@pytest.mark.parametrize("write", ["fact", "item"])
def test_a_fact_or_item_of_the_user_being_forgotten_waits_for_the_delete_without_holding_up_another_user(
        held: tuple[TieredMemory, HeldDeletes], write: str) -> None:
    """A fact, or a store item, of the user written during the delete waits for it before the write
    lock (the user's lock first, as ``add_many``), not at its vector write holding the lock."""
    memory, index = held
    forget = _forgetting(memory, index)
    try:
        written = Run(lambda: memory.add_fact("User moved to Porto", user_id="a") if write == "fact" else
                      memory.item_store().write_many([ItemWrite(namespace=("a", "notes"), key="home", user_id="a",
                                                                value={"city": "Porto"}, text="moved to Porto")]))
        assert not written.done.wait(0.1)  # it waits for a's delete, which would take its vector too
        new_b = meanwhile(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="b"),
                          f"b's add waited behind a's {write}, waiting for a's delete")
        assert new_b in memory.index.ids("b")
        assert forget.thread.is_alive() and not index.landed.is_set()
    finally:
        index.release.set()
    assert forget.result() == 2
    written.result()
    assert len(memory.index.ids("a")) == 1  # the fact's or item's vector, written after the delete


def test_a_failed_delete_still_finishes_before_the_users_next_write(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    memory, index = held
    index.error = RuntimeError("vector server overloaded")
    forget = _forgetting(memory, index)
    add = Run(lambda: memory.add("user", "I sail on Mondays too", session_id="s", user_id="b"))
    add.result()  # b's write does not wait for a's delete, failing or not
    index.release.set()
    with pytest.raises(VectorIndexError, match="finished on the next open, or before the next write"):
        forget.result()
    assert memory.index.ids("a")  # the vectors are still there: the deletion is pending
    index.held = False
    new = memory.add("user", "I moved to Porto", session_id="s", user_id="a")  # finishes the deletion first
    assert memory.index.ids("a") == {new}
    assert [m.id for m in memory.get_messages("s", user_id="a")] == [new]


def _deleting(memory: TieredMemory, index: HeldDeletes, deletion: str) -> Run:
    """``forget`` of user a's first turn, or ``clear_session`` of a's session, started in a thread
    and held inside the index's delete of their vectors."""
    first = memory.get_messages("s", user_id="a")[0].id
    delete = Run(lambda: memory.forget(first, user_id="a") if deletion == "forget"
                 else memory.clear_session("s", user_id="a"))
    assert index.entered.wait(WAIT), f"{deletion} never reached the index's delete"
    return delete


@pytest.mark.parametrize("deletion", ["forget", "clear_session"])
def test_another_users_add_is_stored_while_a_forget_or_clear_session_deletes_vectors(
        held: tuple[TieredMemory, HeldDeletes], deletion: str) -> None:
    memory, index = held
    kept = memory.get_messages("s", user_id="a")[1].id
    delete = _deleting(memory, index, deletion)
    try:
        new = meanwhile(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="b"),
                        f"b's add waited for a's {deletion}")
        assert delete.thread.is_alive()  # a's delete still held: b's write did not wait for it
    finally:
        index.release.set()
    delete.result()
    assert new in memory.index.ids("b")
    assert memory.index.ids("a") == ({kept} if deletion == "forget" else set())


def test_a_failed_forget_is_paid_before_the_users_next_write_and_the_id_stored_again_kept(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    """The user's write waits for the delete (outside the write lock); the delete fails, its
    vectors stay owed, and that write pays them before writing its own. The forgotten id stored
    again then keeps its new vector."""
    memory, index = held
    index.error = RuntimeError("vector server overloaded")
    first = memory.get_messages("s", user_id="a")[0].id
    delete = _deleting(memory, index, "forget")
    add = Run(lambda: memory.add("user", "I sail on Mondays", session_id="s", user_id="a"))
    try:
        assert not add.done.wait(0.1)  # it waits for a's delete
    finally:
        index.release.set()
    with pytest.raises(VectorIndexError, match="deleted, but their vectors not yet"):
        delete.result()
    index.held = False
    new = add.result()
    assert first not in memory.index.ids("a") and new in memory.index.ids("a")  # the owed paid first
    assert memory.add_many([{"id": first, "role": "user", "content": "I moved to Porto"}],
                           session_id="s", user_id="a") == [first]
    assert first in memory.index.ids("a")
    assert memory.search("where did I move?", user_id="a")[0].id == first


@pytest.mark.parametrize("write", ["fact", "item", "working", "scratchpad"])
def test_a_write_after_a_failed_forget_user_is_not_deleted_by_its_finishing(
        held: tuple[TieredMemory, HeldDeletes], write: str) -> None:
    """A forget_user that failed half-way is finished before the user's next write, as ``add_many``
    does: finished after it (by a later ``add``, or the next open), it would delete what that write
    stored and acknowledged."""
    memory, index = held
    index.error = RuntimeError("vector server overloaded")
    forget = _forgetting(memory, index)
    index.release.set()
    with pytest.raises(VectorIndexError, match="finished on the next open, or before the next write"):
        forget.result()
    index.held = False
    stale = memory.index.ids("a")  # the forgotten turns' vectors, still there
    wm = memory.working_memory("s2", user_id="a")
    if write == "fact":
        memory.add_fact("User moved to Porto", user_id="a")
    elif write == "item":
        memory.item_store().write_many([ItemWrite(namespace=("a", "notes"), key="home", user_id="a",
                                                  value={"city": "Porto"}, text="moved to Porto")])
    elif write == "working":
        wm.remember("moved to Porto", type="goal")  # (its vector lives in its row)
    else:
        wm.scratchpad["city"] = "Porto"
    kept = memory.index.ids("a") - stale
    assert memory.index.ids("a") == kept  # the forgotten turns' vectors gone before it was written
    new = memory.add("user", "I sail on Mondays", session_id="s", user_id="a")  # finishes nothing now
    assert {"fact": lambda: len(memory.facts("a")), "item": lambda: memory.item_store().get(("a", "notes"), "home"),
            "working": lambda: len(wm.items()), "scratchpad": lambda: wm.scratchpad.get("city")}[write]()
    assert memory.index.ids("a") == kept | {new}


def test_another_users_deletion_and_add_go_ahead_while_a_forget_deletes_vectors(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    """b's ``delete_fact`` pays its own entry under the write lock while a's ``forget`` pays a's
    outside it, held in the index's delete. On SQLite a payment held every entry of the process
    (one lock), so b's deletion waited for a's, holding the write lock, and b's next ``add`` behind
    it: now a payer waits only for the entries another holds."""
    memory, index = held
    fact = memory.add_fact("User sails on Sundays", user_id="b")
    delete = _deleting(memory, index, "forget")
    try:
        meanwhile(lambda: memory.delete_fact(fact.id, user_id="b"), "b's delete_fact waited for a's vector delete")
        new = meanwhile(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="b"),
                        "b's add waited for a's vector delete")
        assert delete.thread.is_alive()  # a's delete still held: b's calls did not wait for it
    finally:
        index.release.set()
    delete.result()
    assert f"fact:{fact.id}" not in memory.index.ids("b") and new in memory.index.ids("b")
    assert memory.facts("b") == [] and memory.store.owed_rows.owed(10) == []


@pytest.mark.record_stores("sqlite", "postgres")  # PostgreSQL: a's entries are held by a's transaction's row locks
@pytest.mark.parametrize("held", ["wrapped"], indirect=True)
def test_another_users_write_paying_what_a_failed_deletion_left_goes_ahead_while_a_forget_deletes_vectors(
        held: tuple[TieredMemory, HeldDeletes]) -> None:
    """b's earlier ``delete_fact`` failed at the index: b's next write pays everything owed first,
    under the write lock, a's entries (in flight outside it) among them. It waited for a's held
    delete; it pays the rest now and leaves a's to a's delete, which pays them."""
    memory, index = held
    failing = memory.index
    assert isinstance(failing, FailingVectorIndex)
    fact = memory.add_fact("User sails on Sundays", user_id="b")
    failing.fail_on = {"delete"}
    with pytest.raises(VectorIndexError):
        memory.delete_fact(fact.id, user_id="b")
    failing.healthy()
    delete = _deleting(memory, index, "forget")
    try:
        new = meanwhile(lambda: memory.add("user", "I moved to Porto", session_id="s", user_id="b"),
                        "b's write, paying what was owed, waited for a's vector delete")
        assert f"fact:{fact.id}" not in index.ids("b")  # b's owed vector paid before b's write
        assert delete.thread.is_alive()
    finally:
        index.release.set()
    delete.result()
    assert new in index.ids("b") and memory.store.owed_rows.owed(10) == []

