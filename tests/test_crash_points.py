"""SIGKILL at chosen points of the maintenance paths: nothing acknowledged is lost, the next
open repairs what the kill left, and no stored value breaks a read.

The harness is in ``tests/crash_support.py``: each test here builds a memory, closes it, and
runs this file as a child process that reopens the folder, arms one kill point and starts the
operation; the parent then checks, via ``verify``: each acknowledged turn, fact, episode and
item is stored once and found by meaning; the vector index holds exactly the vectors the
records call for (none missing, no orphan); ``stats()`` agrees with the store; an export
imports into a fresh folder whole.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.crash_support import (
    AT_OPEN, DAY, TURNS, Hooked, add_old_session, child, kill_at, open_memory, run_child, snapshot, step, verify,
)
from tiered_memory import TieredMemory
from tiered_memory.layers.item_rules import ItemWrite
from tiered_memory.layers import semantic

NS = ("memories", "u")
LONG = " ".join(f"Paragraph {n}: the lighthouse keeper logged the storm near cape {n} at dawn." for n in range(40))
WORDS = ("harbour lantern orchard violin glacier pepper comet saddle meadow anchor walnut "
         "thunder ribbon canyon falcon marble tulip compass ember quartz").split()


def note(n: int) -> str:
    """A distinct note (no two alike enough to be stored as duplicates)."""
    return f"Note {n}: I keep thinking about the {' and the '.join(random.Random(n).sample(WORDS, 5))}."


# ---------------------------------------------------------------------------
# the scenarios: (a) ... (h) of the crash review
# ---------------------------------------------------------------------------
def put_items(memory: TieredMemory, texts: dict[str, str]) -> None:
    memory.item_store().write_many([ItemWrite(namespace=NS, key=k, user_id="u", value={"text": t}, text=t)
                                    for k, t in texts.items()])


ITEMS = {"k1": "Prefers window seats on long flights.", "k2": "Works as a marine biologist in Faro."}


def with_everything(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A memory with turns (one long), an episode, facts and items of user u; closed."""
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:
        memory.add_many([{"role": "user", "content": t} for t in [*TURNS, LONG]], session_id="s", user_id="u")
        memory.end_session("s", user_id="u")
        memory.add_fact("User plays the cello", user_id="u")
        put_items(memory, ITEMS)
        return folder, snapshot(memory, ["u"])


@step
def put_killed_after_vectors(memory: TieredMemory) -> None:
    kill_at(memory.index, "upsert", after=True)
    put_items(memory, PUT)


@step
def put_killed_before_vectors(memory: TieredMemory) -> None:
    kill_at(memory.index, "upsert")
    put_items(memory, PUT)


PUT = {"k3": "Collects vintage maps of Lisbon.", "k1": "Speaks fluent Japanese and some Korean."}


@step
def sweep_killed_before_vectors(memory: TieredMemory) -> None:  # rows deleted, vectors not yet
    kill_at(memory.index, "delete")
    memory.item_store().sweep(now=time.time() + 10 * DAY)


@step
def rebuild_killed_half_way(memory: TieredMemory) -> None:  # the index reset, the rows not yet pending
    kill_at(memory.store, "reset_indexed")
    memory.rebuild_index()


@pytest.mark.parametrize("scenario", ["put_killed_after_vectors", "put_killed_before_vectors"])
def test_h_a_put_batch_killed_at_its_vectors_leaves_each_item_found_by_its_own_text(
        tmp_path: Path, scenario: str) -> None:
    folder, before = with_everything(tmp_path)
    run_child(scenario, folder)
    items = {**before["items"], (NS, "k1"): None}  # the put was not acknowledged: k1 old or new
    verify(folder, tmp_path, turns=before["turns"], facts=before["facts"], items=items)


def test_h_a_ttl_sweep_killed_between_rows_and_vectors_leaves_no_orphan_vector(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:
        memory.add_many([{"role": "user", "content": t} for t in TURNS], session_id="s", user_id="u")
        memory.item_store().write_many([ItemWrite(namespace=NS, key="old", user_id="u", value={"a": 1},
                                                  text="A note that expires soon.", ttl_minutes=1.0)])
        put_items(memory, ITEMS)
        before = snapshot(memory, ["u"])
    run_child("sweep_killed_before_vectors", folder)
    del before["items"][(NS, "old")]
    verify(folder, tmp_path, turns=before["turns"], items=before["items"])


def test_d_rebuild_index_killed_half_way_is_finished_by_the_next_open(tmp_path: Path) -> None:
    folder, before = with_everything(tmp_path)
    run_child("rebuild_killed_half_way", folder)
    verify(folder, tmp_path, turns=before["turns"], facts=before["facts"], items=before["items"])


# (a) consolidate --------------------------------------------------------------------------
@step
def consolidate_killed_after_archiving(memory: TieredMemory) -> None:  # turns archived, vectors not deleted
    kill_at(memory.index, "delete")
    memory.consolidate("u")


def test_a_consolidate_killed_after_the_archive_commit_leaves_live_turns_found_by_meaning(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:
        add_old_session(memory, "u")
        # a later session repeats a turn: stored as a duplicate of the one consolidate archives
        memory.add_many([{"role": "user", "content": TURNS[1]}, {"role": "user", "content": "We moved to Braga."}],
                        session_id="new", user_id="u")
        before = snapshot(memory, ["u"])
        old_ids = {m.id for m in memory.get_messages("old", user_id="u")}
    run_child("consolidate_killed_after_archiving", folder)
    verify(folder, tmp_path, turns=before["turns"], facts=before["facts"], archived=frozenset(old_ids))


# (b) end_session ------------------------------------------------------------------------
@step
def end_session_killed_before_the_episode(memory: TieredMemory) -> None:  # facts stored, no episode
    kill_at(memory._layers.episodes, "save")
    memory.end_session("s", user_id="u")


def test_b_end_session_killed_between_facts_and_episode_is_redone_without_duplicates(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:
        memory.add_many([{"role": "user", "content": t} for t in ["I live in Lisbon.", "I prefer tea over coffee.",
                                                                  "My daughter is called Rita."]],
                        session_id="s", user_id="u")
        before = snapshot(memory, ["u"])
    run_child("end_session_killed_before_the_episode", folder)
    with open_memory(folder) as memory:
        stored = sorted(f.text for f in memory.facts("u"))
        episode = memory.end_session("s", user_id="u")  # redone: the turns are still uncovered
        assert [e.id for e in memory.episodes("u")] == [episode.id]
        facts = sorted(f.text for f in memory.facts("u"))
        assert facts == stored and len(set(facts)) == len(facts)  # the second pass added no duplicate
    verify(folder, tmp_path, turns=before["turns"], facts={"u": facts})


# (c) import_jsonl -----------------------------------------------------------------------
@step
def import_killed_after_two_chunks(memory: TieredMemory) -> None:
    done = [0]

    def progress(n: int) -> None:
        done[0] += 1
        if done[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    memory.import_jsonl(Path(os.environ["CRASH_DUMP"]), progress=progress)


@step
def import_killed_before_the_audit(memory: TieredMemory) -> None:
    kill_at(memory._rows, "audit_log")  # read first by the working-memory restore, after facts and episodes
    memory.import_jsonl(Path(os.environ["CRASH_DUMP"]))


@pytest.mark.parametrize("scenario", ["import_killed_after_two_chunks", "import_killed_before_the_audit"])
def test_c_an_import_killed_half_way_and_run_again_stores_each_record_once(tmp_path: Path, scenario: str) -> None:
    source = tmp_path / "source"
    with open_memory(source) as memory:
        for s in range(3):
            memory.add_many([{"role": "user", "content": note(s * 100 + n)} for n in range(40)],
                            session_id=f"s{s}", user_id="u")
            memory.end_session(f"s{s}", user_id="u")
        memory.working_memory("s2", user_id="u").remember("book the flight to Faro", type="goal")
        put_items(memory, ITEMS)
        memory.export_jsonl(tmp_path / "dump.jsonl")
        before = snapshot(memory, ["u"])
    folder = tmp_path / "mem"
    open_memory(folder).close()
    run_child(scenario, folder, CRASH_DUMP=str(tmp_path / "dump.jsonl"))
    with open_memory(folder) as memory:
        memory.import_jsonl(tmp_path / "dump.jsonl")  # the whole import again: what is stored is skipped
        assert snapshot(memory, ["u"])["facts"] == before["facts"]
        assert len(memory.episodes("u")) == 3 and len(memory.working_memory("s2", user_id="u").items()) == 1
        memory.export_jsonl(tmp_path / "again.jsonl")
    assert sorted(open(tmp_path / "again.jsonl")) == sorted(open(tmp_path / "dump.jsonl"))
    verify(folder, tmp_path, turns=before["turns"], facts=before["facts"], items=before["items"])


# (e) forget_user ------------------------------------------------------------------------
@step
def forget_killed_before_the_vectors(memory: TieredMemory) -> None:  # every row gone, the vectors not
    kill_at(memory.index, "delete_user")
    memory.forget_user("gone")


def test_e_forget_user_killed_half_way_is_finished_by_the_next_open(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:
        for user in ("gone", "u"):
            add_old_session(memory, user)
            memory.add_many([{"role": "user", "content": LONG}], session_id="s", user_id=user)
            memory.add_fact("User plays the cello", user_id=user)
            memory.working_memory("s", user_id=user).remember("tune the cello", type="goal")
        memory.consolidate("gone")  # its old turns archived, audited
        memory.item_store().write_many([ItemWrite(namespace=("memories", "gone"), key="k", user_id="gone",
                                                  value={"a": 1}, text="Likes jazz records.")])
        gone_turns = {m.id: (m.user_id, m.content) for m in memory.store.iter_messages("gone")}
        gone_turns.update({i: ("gone", "") for i in memory._rows.archive_owners(list(gone_turns))})
        keep = snapshot(memory, ["u"])
    run_child("forget_killed_before_the_vectors", folder)
    kept = {i: t for i, t in keep["turns"].items() if t[0] == "u"}
    verify(folder, tmp_path, turns=kept, facts=keep["facts"], gone_users=("gone",))
    with open_memory(folder) as memory:
        assert not memory.store.get_by_ids("gone", list(gone_turns)) and memory.sessions("gone") == []
        assert memory.item_store().get(("memories", "gone"), "k") is None
        assert memory.working_memory("s", user_id="gone").items() == []
        assert memory.store.get_meta("pending_forget_users") == "[]"


# (f) the write-behind queue ---------------------------------------------------------------
class Stalled(Hooked):
    """The engine write never finishes: what add_many acknowledged is still queued."""

    def upsert(self, **kwargs: Any) -> None:
        import threading

        threading.Event().wait()


class CutAfter(Hooked):
    """The engine is killed right after writing ``last``'s vector: what a write cut between two
    engine calls (the writer's batches, Chroma's 2,000-item calls) leaves."""

    def __init__(self, inner: Any, last: str) -> None:
        super().__init__(inner)
        self.last = last

    def upsert(self, *, ids: list[str], embeddings: Any, metadatas: Any) -> None:
        if self.last in ids:
            n = ids.index(self.last) + 1
            self.inner.upsert(ids=ids[:n], embeddings=embeddings[:n], metadatas=metadatas[:n])
            os.kill(os.getpid(), signal.SIGKILL)
        self.inner.upsert(ids=ids, embeddings=embeddings, metadatas=metadatas)


def _acknowledge(memory: TieredMemory, batch: list[dict[str, str]]) -> None:
    ids = memory.add_many(batch, session_id="s", user_id="u")
    Path(os.environ["CRASH_ACK"]).write_text(json.dumps(ids))


@step
def acknowledged_while_queued(memory: TieredMemory) -> None:
    memory.index.collection = Stalled(memory.index.collection)
    _acknowledge(memory, [{"role": "user", "content": t} for t in [*TURNS, LONG]])
    os.kill(os.getpid(), signal.SIGKILL)


@step
def engine_write_cut_after_a_long_message(memory: TieredMemory) -> None:
    memory.index.collection = CutAfter(memory.index.collection, "long-1")
    _acknowledge(memory, [{"role": "user", "content": t} for t in TURNS] + [
        {"role": "user", "content": LONG, "id": "long-1"}, {"role": "user", "content": "I cycle to work."}])
    memory.flush()


@pytest.mark.parametrize("scenario", ["acknowledged_while_queued", "engine_write_cut_after_a_long_message"])
def test_f_acknowledged_turns_whose_vectors_were_queued_are_found_by_meaning(tmp_path: Path, scenario: str) -> None:
    folder = tmp_path / "mem"
    open_memory(folder).close()
    run_child(scenario, folder, CRASH_ACK=str(tmp_path / "ack.json"))
    ids = json.loads((tmp_path / "ack.json").read_text())
    texts = [*TURNS, LONG] if len(ids) == 5 else [*TURNS, LONG, "I cycle to work."]
    stats = verify(folder, tmp_path, turns={i: ("u", t) for i, t in zip(ids, texts)})
    assert stats["messages"] == len(ids)
    with open_memory(folder) as memory:  # the tail of the long message, by meaning
        hit = memory.search("the storm near cape 37", user_id="u", k=1)[0]
        assert hit.id == ids[4] and "vector" in hit.explanation["signals"]


# (g) compaction at open ---------------------------------------------------------------
def compaction_killed_after_dropping_the_old_collection(folder: Path) -> None:
    from chromadb.api.client import Client

    kill_at(Client, "delete_collection", after=True)  # the old collection dropped, the copy not yet renamed
    open_memory(folder)


AT_OPEN["compaction_killed_after_dropping_the_old_collection"] = compaction_killed_after_dropping_the_old_collection


def test_g_compaction_killed_half_way_loses_no_vector(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:  # a memory used through the LangGraph store and facts alone
        memory.add_fact("User plays the cello", user_id="u")
        put_items(memory, ITEMS)
        memory.store.set_meta("forgotten_vectors", "10000")  # past churn: compaction is worth it
        before = snapshot(memory, ["u"])
    run_child("compaction_killed_after_dropping_the_old_collection", folder)
    verify(folder, tmp_path, facts=before["facts"], items=before["items"])
    with open_memory(folder) as memory:  # the copy the kill left behind is gone too
        assert [c.name for c in memory.index.client.list_collections()] == [memory.index.collection.name]


# update_fact ---------------------------------------------------------------------------
@step
def fact_update_killed_before_its_vector(memory: TieredMemory) -> None:  # the row revised, the vector not
    kill_at(semantic, "write_fact_vectors")  # its vector and settlement, the row written
    fact = memory.facts("u")[0]
    memory.update_fact(fact.id, user_id="u", text="User speaks fluent Japanese")


def test_an_update_fact_killed_before_its_vector_leaves_the_fact_found_by_its_new_text(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    with open_memory(folder) as memory:
        memory.add_fact("User plays the cello", user_id="u")
    run_child("fact_update_killed_before_its_vector", folder)
    verify(folder, tmp_path, facts={"u": ["User speaks fluent Japanese"]})


# the release of duplicates the repair runs, on both record stores ------------------------
@pytest.mark.servers
def test_every_users_duplicates_of_a_removed_turn_are_released_on_postgres_too(
        tmp_path: Path, postgres_url: str) -> None:
    from tiered_memory.store.postgres import PostgresRecordStore
    from tiered_memory.store.sqlite import SQLiteRecordStore
    from tiered_memory.types import StoredMessage

    def turn(n: int, user: str) -> StoredMessage:
        return StoredMessage(id=f"{user}{n}", user_id=user, session_id="s", role="user", content="same text",
                             metadata={}, timestamp=float(n))

    for store in (SQLiteRecordStore(tmp_path / "r.sqlite3"), PostgresRecordStore(postgres_url)):
        try:
            for user in ("a", "b"):
                store.insert_messages([turn(0, user), turn(1, user)], indexed=True, duplicates={f"{user}1": f"{user}0"})
                store.delete_message(user, f"{user}0")
            assert {m.id for m in store.release_duplicates(None)} == {"a1", "b1"}
            assert {m.id for m in store.pending_index(10)} == {"a1", "b1"} and store.release_duplicates(None) == []
        finally:
            store.close()


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
