"""A repair that one bad row fails: the row is skipped (logged, kept pending or owed, nothing
lost) and the pass goes on with the rest, so later rows do not wait behind it
(``tiered_memory.recall.indexing.repair``, ``tiered_memory.recall.forgetting.pay_owed``).

The vector engine here refuses one id only (a point it cannot write or delete); a wrapper of
the real Chroma index's methods, nothing else faked.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

from tiered_memory import BufferConfig, EpisodeConfig, MemoryConfig, StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.embedding import embed
from tiered_memory.layers.item_rules import ItemWrite, vector_id
from tiered_memory.recall.indexing import repair
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex


class _Engine:
    """The real Chroma index, written in step (no write-behind, as a server's is): its ``upsert``
    and ``delete`` fail a call holding the id ``refused`` (or one of a set: the whole call, as an
    engine does), and every call while ``down`` (``"upsert"``: every upsert); ``refusals`` counts
    the calls refused for ``refused``."""

    def __init__(self, inner: ChromaVectorIndex) -> None:
        self.inner, self.refusals = inner, 0
        self.refused: str | set[str] = ""
        self.down: bool | str = False
        self.refused_layer = ""  # "fact:": every fact vector refused

    def upsert(self, items: list[VectorItem]) -> None:
        self._check([i.id for i in items], "upsert")
        self.inner.upsert(items)

    def delete(self, ids: Sequence[str]) -> None:
        self._check(ids, "delete")
        self.inner.delete(ids)

    def _check(self, ids: Sequence[str], method: str) -> None:
        if self.down in (True, method):
            raise RuntimeError("the engine is down")
        refused = {self.refused} if isinstance(self.refused, str) else self.refused
        refused = refused | {i for i in ids if self.refused_layer and i.startswith(self.refused_layer)}
        if refused & set(ids):
            self.refusals += 1
            raise RuntimeError(f"the engine refuses {sorted(refused & set(ids))}")

    def __getattr__(self, name: str) -> Any:
        if name in ("upsert_behind", "settle_behind"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def _note(memory: TieredMemory, note_id: str, text: str) -> None:
    memory.add_many([{"id": note_id, "role": "user", "content": text}], session_id="s", user_id="u")


NOTES = {"note-1": "My bank PIN is 4921", "note-2": "I keep bees on the roof", "note-3": "My sister lives in Porto",
         "note-4": "I drink green tea at noon"}


def _stored_pending(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                    ids: Sequence[str]) -> tuple[TieredMemory, _Engine]:
    """A memory whose notes ``ids`` were stored while the engine was down (left pending)."""
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    index.down = True
    for note in ids:
        with pytest.raises(VectorIndexError):
            _note(memory, note, NOTES[note])
    index.down = False
    return memory, index


def _repair(memory: TieredMemory) -> dict[str, int]:
    return repair(store=memory.store, index=memory.index, embedder=memory.embedder,
                  threshold=memory.config.dedup_threshold, full=False)


def _pending(memory: TieredMemory) -> set[str]:
    return {r.id for r in memory.store.pending_index(100)}


def _owed(memory: TieredMemory) -> set[str]:
    return {e.item_id for e in memory.store.owed_rows.owed(100)}


def test_a_row_the_index_refuses_is_skipped_and_the_rest_are_indexed(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Three rows pending, the engine refusing ``note-2``'s vector: the repair wrote none (one
    upsert for the batch failed and the pass stopped), so every later row waited behind it."""
    memory, index = _stored_pending(make_memory, tmp_path, ["note-1", "note-2", "note-3"])
    index.refused = "note-2"
    with pytest.raises(VectorIndexError, match="1 turn"):
        _repair(memory)  # says what it left
    assert _pending(memory) == {"note-2"}  # kept pending, for the next pass
    assert index.inner.ids("u") == {"note-1", "note-3"}
    assert index.refusals <= 3  # tried apart, once alone, not in a loop
    index.refused = ""  # the engine takes it again
    assert _repair(memory)["indexed"] == 1 and _pending(memory) == set()


def test_an_engine_that_fails_every_call_is_not_asked_row_by_row(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Skipping what fails must not turn an engine that is down into one call per pending row."""
    memory, index = _stored_pending(make_memory, tmp_path, [])
    index.down = True
    rows = [{"id": f"n{i}", "role": "user", "content": f"note number {i}"} for i in range(64)]
    with pytest.raises(VectorIndexError):
        memory.add_many(rows, session_id="s", user_id="u")
    calls = 0
    real = index._check

    def counted(ids: Sequence[str], method: str) -> None:
        nonlocal calls
        calls += 1
        real(ids, method)

    index._check = counted  # type: ignore[method-assign]
    with pytest.raises(VectorIndexError, match="down"):
        _repair(memory)
    assert len(_pending(memory)) == 64 and calls <= 12


def test_a_payment_the_index_refuses_holds_back_its_row_only(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """``note-2`` stored again while its old vector was owed, and the engine refusing to delete
    it: the repair's payment for the batch failed, and no row of it was indexed. The rows owing
    nothing are indexed now; ``note-2`` stays pending, its old vector still owed."""
    memory, index = _stored_pending(make_memory, tmp_path, ["note-1"])
    _note(memory, "note-2", "I keep wasps")
    index.down = True
    with pytest.raises(VectorIndexError):
        memory.forget("note-2", user_id="u")  # its vector owed
    for note in ("note-2", "note-3"):
        with pytest.raises(VectorIndexError):
            _note(memory, note, NOTES[note])  # pending, note-2 under an owed id
    index.down, index.refused = False, "note-2"
    with pytest.raises(VectorIndexError):
        _repair(memory)
    assert _pending(memory) == {"note-2"} and _owed(memory) == {"note-2"}
    assert {"note-1", "note-3"} <= index.inner.ids("u")
    index.refused = ""
    _repair(memory)
    assert _pending(memory) == set() and _owed(memory) == set()
    assert "note-2" in index.inner.ids("u")  # the new vector, written after the old was deleted


def test_a_deletion_the_index_refuses_holds_back_no_other_payment_or_pending_row(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Three notes forgotten while deletes failed, and one stored while writes failed: the next
    write's payment sent the three deletions in one call, which the engine refused for
    ``note-2``, so none was paid, and the pending row waited too (the repair after a payment was
    not run). The others are paid and the row indexed; ``note-2``'s deletion stays owed."""
    memory, index = _stored_pending(make_memory, tmp_path, [])
    for note in ("note-1", "note-2", "note-3"):
        _note(memory, note, NOTES[note])
    index.down = True
    for note in ("note-1", "note-2", "note-3"):
        with pytest.raises(VectorIndexError):
            memory.forget(note, user_id="u")
    with pytest.raises(VectorIndexError):
        _note(memory, "note-4", NOTES["note-4"])
    index.down, index.refused = False, "note-2"
    memory.add("user", "Another note", session_id="t", user_id="u")  # pays, then indexes what is pending
    assert _owed(memory) == {"note-2"}
    assert index.inner.ids("u") & set(NOTES) == {"note-2", "note-4"}  # note-2's old vector, owed
    assert _pending(memory) == set()


def test_an_episode_the_index_refuses_holds_back_no_other_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Two episodes stored pending (ended while the engine was down), the engine refusing the
    first one's key points: the open's pass over pending episodes stopped at it, and the second
    waited behind it. The second is written now; the first stays pending for the next open."""
    memory, index = _stored_pending(make_memory, tmp_path, [])
    for session, text in (("s1", "I keep bees on the roof of the library"), ("s2", "My sister moved to Porto")):
        memory.add("user", text, session_id=session, user_id="u")
    index.down = True
    for session in ("s1", "s2"):
        with pytest.raises(VectorIndexError):
            memory.end_session(session, user_id="u")
    first, second = sorted(memory.episodes("u"), key=lambda e: e.session_id)
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = f"ep:{first.id}:0"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its repair runs, logged
    points = {i.split(":")[1] for i in index.inner.ids("u") if i.startswith("ep:")}
    assert points == {second.id}
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # the next open writes it
    assert {i.split(":")[1] for i in index.inner.ids("u") if i.startswith("ep:")} == {first.id, second.id}


def test_a_store_item_the_index_refuses_holds_back_no_other_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Two store items whose vectors a failed write left to the next open, the engine refusing
    one's: the open's payment wrote both in one call, refused, and owed both again."""
    memory, index = _stored_pending(make_memory, tmp_path, [])
    index.down = "upsert"
    with pytest.raises(VectorIndexError, match="the next open"):
        memory.item_store().write_many([
            ItemWrite(namespace=("u", "notes"), key=key, user_id="u", value={"text": text}, text=text)
            for key, text in (("tea", "Drinks green tea"), ("bees", "Keeps bees on the roof"))])
    tea, bees = (memory.item_store().get(("u", "notes"), key) for key in ("tea", "bees"))
    assert tea is not None and bees is not None
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = vector_id(tea.id, 0)
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its payment runs, logged
    assert {i for i in index.inner.ids("u") if i.startswith("item:")} == {vector_id(bees.id, 0)}
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # still owed: the next open writes it
    assert {vector_id(tea.id, 0), vector_id(bees.id, 0)} <= index.inner.ids("u")


def _layer_vectors(index: _Engine, prefix: str) -> set[str]:
    """The ids (fact or episode) of the layer vectors ``prefix`` the engine holds for ``u``."""
    return {i.split(":")[1] for i in index.inner.ids("u") if i.startswith(prefix)}


def test_a_fact_the_index_refuses_holds_back_no_other_fact_or_episode_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Facts and an episode stored pending (written while the engine was down), the engine
    refusing one fact's vector: the open's pass over pending facts stopped at the batch holding
    it (every later fact waited behind it), and the episodes' pass after it never ran. The
    others are written now; the refused fact stays pending for the next open."""
    memory, index = _stored_pending(make_memory, tmp_path, [])
    memory.add("user", "My sister moved to Porto", session_id="s1", user_id="u")
    index.down = True
    for text in ("User keeps bees on the roof", "User drinks green tea at noon", "User plays the cello"):
        with pytest.raises(VectorIndexError):
            memory.add_fact(text, user_id="u")
    with pytest.raises(VectorIndexError):
        memory.end_session("s1", user_id="u")
    facts = {f.text: f.id for f in memory.facts("u")}
    [episode] = memory.episodes("u")
    refused = facts["User drinks green tea at noon"]
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = f"fact:{refused}"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its pending passes run, logged
    assert _layer_vectors(index, "fact:") == set(facts.values()) - {refused}
    assert _layer_vectors(index, "ep:") == {episode.id}
    assert index.refusals <= 4  # tried apart, once alone, not in a loop
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # still pending: the next open writes it
    assert _layer_vectors(index, "fact:") == set(facts.values())


def test_a_stray_vector_the_index_refuses_to_delete_holds_back_no_other_pass_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An unclean open's full repair finds vectors no row holds (a turn's, a fact's), the engine
    refusing to delete them: the repair stopped at the turns' delete, so no pass after it ran (a
    turn and a fact left pending stayed so, a turn's lost vector was not restored). They run now;
    the refused vectors are logged by name and owed, so the next open's payment deletes them."""
    memory, index = _stored_pending(make_memory, tmp_path, ["note-1"])
    _note(memory, "note-2", NOTES["note-2"])
    index.down = True
    with pytest.raises(VectorIndexError):
        memory.add_fact("User plays the cello", user_id="u")
    index.down = False
    [fact] = memory.facts("u")
    vector = embed(memory.embedder, ["a vector no row holds"])[0]
    index.inner.upsert([VectorItem(id=i, vector=vector, user_id="u", layer=layer)
                        for i, layer in (("ghost", "turn"), ("fact:ghost", "fact"))])
    index.inner.delete(["note-2"])  # lost: the full repair restores it
    memory.close()
    con = sqlite3.connect(tmp_path / "mem" / "records.sqlite3")  # what a crash leaves: the store says it is open
    con.execute("UPDATE meta SET value='open' WHERE key='state'")
    con.commit()
    con.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = {"ghost", "fact:ghost"}
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs, logged
    assert "'ghost'" in caplog.text and "'fact:ghost'" in caplog.text
    assert _pending(memory) == set() and {"note-1", "note-2"} <= index.inner.ids("u")
    assert _layer_vectors(index, "fact:") == {fact.id, "ghost"}
    # refused once each by the repair, then by the open's payment after it (the two, then each alone)
    assert _owed(memory) == {"ghost", "fact:ghost"} and index.refusals <= 5
    left: list[VectorIndexError] = []
    report = repair(store=memory.store, index=memory.index, embedder=memory.embedder,
                    threshold=memory.config.dedup_threshold, full=True, skipped=left)
    assert report["stray_owed"] == 1 and report["removed"] == 0 and len(left) == 1  # says what it left
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its payment deletes them
    assert _owed(memory) == set() and {"ghost", "fact:ghost"}.isdisjoint(index.inner.ids("u"))


def test_a_fact_vector_background_compression_was_refused_is_written_by_the_next_write(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Compression off the request path (``compress_after_turns``) stored a fact whose vector the
    engine refused: its row stayed pending, but unlike a failed ``end_session`` nothing marked the
    memory as owing, so the next write did not index it (only the next open would), and the next
    compression, resolving the same turn's fact by vector, stored it a second time."""
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    config = MemoryConfig(buffer=BufferConfig(max_messages=2), episodes=EpisodeConfig(compress_after_turns=1))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder(), config=config)
    index.refused_layer = "fact:"
    turns = [("user", "I'm a violin teacher."), ("assistant", "Nice."), ("user", "Thanks."), ("assistant", "Sure.")]
    memory.add_many([{"role": r, "content": c} for r, c in turns], session_id="s1", user_id="u")  # 2 out of the buffer
    memory.flush()  # compressed in the background: the fact stored, its vector refused, no episode
    [fact] = memory.facts("u")
    assert index.refusals and _layer_vectors(index, "fact:") == set()
    index.refused_layer = ""
    memory.add_many([{"role": "user", "content": "OK."}, {"role": "assistant", "content": "Bye."}],
                    session_id="s1", user_id="u")  # a write pays what a failed call left; compressed again
    memory.flush()
    assert [f.id for f in memory.facts("u")] == [fact.id] and _layer_vectors(index, "fact:") == {fact.id}


def _crashed(memory: TieredMemory, tmp_path: Path) -> None:
    """Close ``memory`` and leave its store as a crash does: saying it is open (a full repair next)."""
    memory.close()
    con = sqlite3.connect(tmp_path / "mem" / "records.sqlite3")
    con.execute("UPDATE meta SET value='open' WHERE key='state'")
    con.commit()
    con.close()


def test_a_stray_item_vector_the_index_refuses_to_delete_holds_back_no_item_or_pass_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An unclean open's full repair finds a store item vector no row holds, the engine refusing
    to delete it: the items' restore deleted the strays in one call, so it failed before writing
    the missing item vectors, owed every item again (so every open compared them all, failing),
    and the pending passes after it never ran. The missing vector is written and the pending
    turn indexed now; the stray is owed, deleted by the next open's payment."""
    memory, index = _stored_pending(make_memory, tmp_path, [])
    memory.item_store().write_many([ItemWrite(namespace=("u", "notes"), key="tea", user_id="u",
                                              value={"text": "Drinks green tea"}, text="Drinks green tea")])
    tea = memory.item_store().get(("u", "notes"), "tea")
    assert tea is not None
    index.inner.upsert([VectorItem(id="item:ghost", vector=embed(memory.embedder, ["no row holds it"])[0],
                                   user_id="u", layer="item")])
    index.inner.delete([vector_id(tea.id, 0)])  # lost: the full repair restores it
    index.down = True
    with pytest.raises(VectorIndexError):
        _note(memory, "note-1", NOTES["note-1"])  # pending
    index.down = False
    _crashed(memory, tmp_path)
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = "item:ghost"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs, logged
    assert {vector_id(tea.id, 0), "note-1"} <= index.inner.ids("u") and _pending(memory) == set()
    assert _owed(memory) == {"item:ghost"} and memory.store.get_meta("unindexed_items") in (None, "[]")
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its payment deletes it
    assert _owed(memory) == set() and "item:ghost" not in index.inner.ids("u")


def _layers_written(make_memory: Callable[..., TieredMemory], tmp_path: Path) -> tuple[TieredMemory, dict[str, str], list[str]]:
    """A memory with three facts and two episodes, every vector written: the fact ids by text,
    and the episode ids in session order."""
    memory, _ = _stored_pending(make_memory, tmp_path, [])
    for text in ("User keeps bees on the roof", "User drinks green tea at noon", "User plays the cello"):
        memory.add_fact(text, user_id="u")
    for session, text in (("s1", "I keep bees on the roof of the library"), ("s2", "My sister moved to Porto")):
        memory.add("user", text, session_id=session, user_id="u")
        memory.end_session(session, user_id="u")
    episodes = [e.id for e in sorted(memory.episodes("u"), key=lambda e: e.session_id)]
    return memory, {f.text: f.id for f in memory.facts("u")}, episodes


def test_a_fact_or_episode_the_index_refuses_holds_back_no_other_in_a_rebuild(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """``rebuild_index`` re-embedding the layers, the engine refusing one fact's vector and one
    episode's: the facts' upsert failed for all of them and the rebuild stopped there (no
    episode, no store item written). The others are written; the two refused stay pending, so
    the next open writes them."""
    memory, facts, episodes = _layers_written(make_memory, tmp_path)
    refused = facts["User drinks green tea at noon"]
    index = memory.index
    assert isinstance(index, _Engine)
    index.refused = {f"fact:{refused}", f"ep:{episodes[0]}:0"}
    with pytest.raises(VectorIndexError, match="1 fact"):
        memory.rebuild_index()
    assert _layer_vectors(index, "fact:") == set(facts.values()) - {refused}
    assert _layer_vectors(index, "ep:") == {episodes[1]}
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # still pending: the open writes them
    assert _layer_vectors(index, "fact:") == set(facts.values()) and _layer_vectors(index, "ep:") == set(episodes)


def test_a_missing_layer_vector_the_index_refuses_holds_back_no_other_and_stays_pending(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An unclean open's full repair re-embedding lost fact and episode vectors, the engine
    refusing one fact's and one episode's: no fact vector and no episode's was written (the
    layers' re-embedding stopped at the facts' upsert), and the rows stayed settled, so no later
    open wrote them. The others are written; the two refused are left pending for the next open."""
    memory, facts, episodes = _layers_written(make_memory, tmp_path)
    memory.index.delete([i for i in memory.index.ids() if i.startswith(("fact:", "ep:"))])  # lost
    _crashed(memory, tmp_path)
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    refused = facts["User drinks green tea at noon"]
    index.refused = {f"fact:{refused}", f"ep:{episodes[0]}:0"}
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs, logged
    assert _layer_vectors(index, "fact:") == set(facts.values()) - {refused}
    assert _layer_vectors(index, "ep:") == {episodes[1]}
    memory.close()
    index = _Engine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its pending pass writes them
    assert _layer_vectors(index, "fact:") == set(facts.values()) and _layer_vectors(index, "ep:") == set(episodes)
