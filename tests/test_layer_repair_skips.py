"""The layers' and store items' repairs that one bad row fails (facts, episodes, store items,
stray vectors, background compression, re-embedding): the row is skipped, logged, left pending or
owed, and the rest are written (``tiered_memory.layers.layer_repair``, ``item_vectors``). The
engine is the real Chroma index refusing chosen ids (tests/repair_support.py).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Callable, Sequence

import pytest

from repair_support import NOTES, RefusingEngine, add_note, owed_ids, pending_ids, stored_pending
from tiered_memory import BufferConfig, EpisodeConfig, MemoryConfig, StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.embedding import embed
from tiered_memory.layers.item_rules import ItemWrite, vector_id
from tiered_memory.layers.layer_repair import episode_of_point
from tiered_memory.recall.indexing import repair
from tiered_memory.startup import REPAIR_DUE
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex


def _layer_vectors(index: RefusingEngine, prefix: str) -> set[str]:
    """The ids (fact or episode) of the layer vectors ``prefix`` the engine holds for ``u``."""
    return {i.split(":")[1] for i in index.inner.ids("u") if i.startswith(prefix)}


def test_a_fact_the_index_refuses_holds_back_no_other_fact_or_episode_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Facts and an episode stored pending (written while the engine was down), the engine
    refusing one fact's vector: the open's pass over pending facts stopped at the batch holding
    it (every later fact waited behind it), and the episodes' pass after it never ran. The
    others are written now; the refused fact stays pending for the next open."""
    memory, index = stored_pending(make_memory, tmp_path, [])
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
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = f"fact:{refused}"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its pending passes run, logged
    assert _layer_vectors(index, "fact:") == set(facts.values()) - {refused}
    assert _layer_vectors(index, "ep:") == {episode.id}
    assert index.refusals <= 4  # tried apart, once alone, not in a loop
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # still pending: the next open writes it
    assert _layer_vectors(index, "fact:") == set(facts.values())


def test_a_stray_vector_the_index_refuses_to_delete_holds_back_no_other_pass_at_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An unclean open's full repair finds vectors no row holds (a turn's, a fact's), the engine
    refusing to delete them: the repair stopped at the turns' delete, so no pass after it ran (a
    turn and a fact left pending stayed so, a turn's lost vector was not restored). They run now;
    the refused vectors are logged by name and owed, so the next open's payment deletes them."""
    memory, index = stored_pending(make_memory, tmp_path, ["note-1"])
    add_note(memory, "note-2", NOTES["note-2"])
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
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = {"ghost", "fact:ghost"}
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs, logged
    assert "'ghost'" in caplog.text and "'fact:ghost'" in caplog.text
    assert pending_ids(memory) == set() and {"note-1", "note-2"} <= index.inner.ids("u")
    assert _layer_vectors(index, "fact:") == {fact.id, "ghost"}
    # refused once each by the repair, then by the open's payment after it (the two, then each alone)
    assert owed_ids(memory) == {"ghost", "fact:ghost"} and index.refusals <= 5
    left: list[VectorIndexError] = []
    report = repair(store=memory.store, index=memory.index, embedder=memory.embedder,
                    threshold=memory.config.dedup_threshold, full=True, skipped=left)
    assert report["stray_owed"] == 1 and report["removed"] == 0 and len(left) == 1  # says what it left
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its payment deletes them
    assert owed_ids(memory) == set() and {"ghost", "fact:ghost"}.isdisjoint(index.inner.ids("u"))


def test_a_fact_vector_background_compression_was_refused_is_written_by_the_next_write(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """Compression off the request path (``compress_after_turns``) stored a fact whose vector the
    engine refused: its row stayed pending, but unlike a failed ``end_session`` nothing marked the
    memory as owing, so the next write did not index it (only the next open would), and the next
    compression, resolving the same turn's fact by vector, stored it a second time."""
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
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
    memory, index = stored_pending(make_memory, tmp_path, [])
    memory.item_store().write_many([ItemWrite(namespace=("u", "notes"), key="tea", user_id="u",
                                              value={"text": "Drinks green tea"}, text="Drinks green tea")])
    tea = memory.item_store().get(("u", "notes"), "tea")
    assert tea is not None
    index.inner.upsert([VectorItem(id="item:ghost", vector=embed(memory.embedder, ["no row holds it"])[0],
                                   user_id="u", layer="item")])
    index.inner.delete([vector_id(tea.id, 0)])  # lost: the full repair restores it
    index.down = True
    with pytest.raises(VectorIndexError):
        add_note(memory, "note-1", NOTES["note-1"])  # pending
    index.down = False
    _crashed(memory, tmp_path)
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.refused = "item:ghost"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs, logged
    assert {vector_id(tea.id, 0), "note-1"} <= index.inner.ids("u") and pending_ids(memory) == set()
    assert owed_ids(memory) == {"item:ghost"} and memory.store.get_meta("unindexed_items") in (None, "[]")
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its payment deletes it
    assert owed_ids(memory) == set() and "item:ghost" not in index.inner.ids("u")


SESSIONS = (("s1", "I keep bees on the roof of the library"), ("s2", "My sister moved to Porto"))


def _layers_written(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                    sessions: Sequence[tuple[str, str]] = SESSIONS) -> tuple[TieredMemory, dict[str, str], list[str]]:
    """A memory with three facts and an episode of each of ``sessions`` (two), every vector
    written: the fact ids by text, and the episode ids in session order."""
    memory, _ = stored_pending(make_memory, tmp_path, [])
    for text in ("User keeps bees on the roof", "User drinks green tea at noon", "User plays the cello"):
        memory.add_fact(text, user_id="u")
    for session, text in sessions:
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
    assert isinstance(index, RefusingEngine)
    index.refused = {f"fact:{refused}", f"ep:{episodes[0]}:0"}
    with pytest.raises(VectorIndexError, match="1 fact"):
        memory.rebuild_index()
    assert _layer_vectors(index, "fact:") == set(facts.values()) - {refused}
    assert _layer_vectors(index, "ep:") == {episodes[1]}
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
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
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    refused = facts["User drinks green tea at noon"]
    index.refused = {f"fact:{refused}", f"ep:{episodes[0]}:0"}
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs, logged
    assert _layer_vectors(index, "fact:") == set(facts.values()) - {refused}
    assert _layer_vectors(index, "ep:") == {episodes[1]}
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its pending pass writes them
    assert _layer_vectors(index, "fact:") == set(facts.values()) and _layer_vectors(index, "ep:") == set(episodes)


def test_layer_rows_a_full_repair_never_reached_are_written_by_the_next_open(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An unclean open's full repair re-embedding lost fact and episode vectors, the engine going
    down after its first write (the facts'): the episodes refused alone were left pending, but
    the one the pass stopped at (the third refusal: the engine is down) stayed settled without
    a vector, as would every row after it, so no later open wrote it and it was never recalled
    by similarity. Every row whose vector is missing is pending until it is written."""
    memory, facts, episodes = _layers_written(make_memory, tmp_path, (*SESSIONS, ("s3", "I drink green tea at noon")))
    memory.index.delete([i for i in memory.index.ids() if i.startswith(("fact:", "ep:"))])  # lost
    _crashed(memory, tmp_path)
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.writes_left = 1
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair is cut short, logged
    assert _layer_vectors(index, "fact:") == set(facts.values()) and _layer_vectors(index, "ep:") == set()
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # a clean open: its pending pass writes them
    assert _layer_vectors(index, "ep:") == set(episodes)


def test_an_episode_stored_again_under_owed_ids_keeps_the_vectors_a_full_repair_writes(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An episode imported again under its id while its old key points could not be deleted
    (still owed, the episode pending), then an unclean open's full repair re-embedding the layers
    (a fact's vector lost), deletes still failing: the re-embedding wrote the episode's key points
    without paying first, and settled it, so the next open's payment deleted them with the old
    ones and nothing wrote them again. It pays first, as the pending pass does."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    memory.add("user", "I keep bees on the roof of the library", session_id="s", user_id="u")
    episode = memory.end_session("s", user_id="u")
    fact = memory.add_fact("User plays the cello", user_id="u")
    dump = tmp_path / "dump.jsonl"
    memory.export_jsonl(dump, user_id="u")
    index.down = "delete"
    with pytest.raises(VectorIndexError):
        memory.delete_episode(episode.id, user_id="u")
    with pytest.raises(VectorIndexError):
        memory.import_jsonl(dump)  # the episode stored again, pending
    index.inner.delete([f"fact:{fact.id}"])  # lost: the full repair re-embeds the layers
    _crashed(memory, tmp_path)
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.down = "delete"
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its payment fails, its full repair runs
    assert _layer_vectors(index, "fact:") == {fact.id}
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # pays, then writes what is pending
    assert owed_ids(memory) == set() and _layer_vectors(index, "ep:") == {episode.id}


def test_a_full_repair_the_engine_cut_short_runs_again_so_no_fact_or_item_vector_stays_missing(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An unclean open's full repair, the index having lost turn, fact and store item vectors, the
    engine down from its first write: the turns' pass stopped it (their rows left pending) before
    the layers and the store items were compared with the index, and the next open, clean, only
    wrote the pending turns: the fact and the item never had their vectors again. A full repair
    cut short is run again by the next open."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    for note in ("note-1", "note-2", "note-3"):
        add_note(memory, note, NOTES[note])
    fact = memory.add_fact("User plays the cello", user_id="u")
    memory.item_store().write_many([ItemWrite(namespace=("u", "notes"), key="tea", user_id="u",
                                              value={"text": "Drinks green tea"}, text="Drinks green tea")])
    tea = memory.item_store().get(("u", "notes"), "tea")
    assert tea is not None
    lost = {"note-1", "note-2", "note-3", f"fact:{fact.id}", vector_id(tea.id, 0)}
    index.inner.delete(sorted(lost))
    _crashed(memory, tmp_path)
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.writes_left = 0
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair is cut short, logged
    assert lost.isdisjoint(index.inner.ids("u"))
    memory.close()
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())
    assert lost <= index.inner.ids("u") and pending_ids(memory) == set()


def test_a_full_repair_writes_only_the_layer_vectors_that_are_missing(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """An unclean open's full repair finding one fact vector and one episode key point missing
    re-embedded the layers of every user (every fact and episode, another user's too): at scale,
    one lost vector cost a re-embedding of the whole store. It writes the rows whose vectors are
    missing (pending since it found them), and only those."""
    memory, facts, episodes = _layers_written(make_memory, tmp_path)
    memory.add_fact("User collects stamps", user_id="v")
    lost_fact = facts["User plays the cello"]
    points = sorted(i for i in memory.index.ids("u") if i.startswith(f"ep:{episodes[1]}:"))
    memory.index.delete([f"fact:{lost_fact}", points[0]])  # lost: the episode's other points are kept
    _crashed(memory, tmp_path)
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair runs
    written = [i for i in index.upserted if i.startswith(("fact:", "ep:"))]
    assert sorted(written) == sorted([f"fact:{lost_fact}", *points])  # the episode's points: each once
    assert _layer_vectors(index, "fact:") == set(facts.values()) and _layer_vectors(index, "ep:") == set(episodes)


def test_a_rebuild_clears_the_mark_of_a_full_repair_cut_short(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """A full repair cut short (the engine down) marks the store so the next open repairs in full
    (``repair_due``); ``rebuild_index`` then re-embedded everything but left the mark, so the next
    open paid for a second full repair of an index just rebuilt. A rebuild that gets through
    clears it."""
    memory, index = stored_pending(make_memory, tmp_path, [])
    notes = ["note-1", "note-2", "note-3"]
    for note in notes:
        add_note(memory, note, NOTES[note])
    index.inner.delete(notes)  # lost: the full repair's turns pass writes them, and finds the engine down
    _crashed(memory, tmp_path)
    index = RefusingEngine(ChromaVectorIndex(str(tmp_path / "index")))
    index.writes_left = 0
    memory = make_memory(vector_store=index, embedder=StaticEmbedder())  # its full repair is cut short, logged
    assert memory.store.get_meta(REPAIR_DUE) == "full"
    index.down, index.writes_left = False, None
    memory.rebuild_index()
    assert memory.store.get_meta(REPAIR_DUE) in (None, "") and set(notes) <= index.inner.ids("u")


def test_a_rebuild_writes_the_episodes_key_points_in_batches(
        make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """``rebuild_index`` wrote each episode's key points in a call of its own (a pass over 1,000
    episodes: 40 s in embedded Chroma, 5 s in batches of 64; the pending pass alike). They go in
    one call per batch; one episode refused still holds back no other (the test above)."""
    memory, _, episodes = _layers_written(make_memory, tmp_path, (*SESSIONS, ("s3", "I drink green tea at noon")))
    index = memory.index
    assert isinstance(index, RefusingEngine)
    index.upserts.clear()
    memory.rebuild_index()
    calls = [ids for ids in index.upserts if ids[0].startswith("ep:")]
    assert len(calls) == 1 and {episode_of_point(i) for i in calls[0]} == set(episodes)
