"""Reads and resolutions that race a delete in another thread: what was deleted is simply not
found, never an error, and nothing is resolved against a fact that is gone. Each race is forced
at its exact point (no sleeps): the real SQLite store below runs a delete just before a chosen
statement, as another thread's ``forget``, ``clear_session`` or ``delete_fact`` can commit
between two statements of one call; an LLM judgement (``ScriptedLLM``) is the other window."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest

from tiered_memory import TieredMemory
from tiered_memory.embedding import Embedder
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.testing import ScriptedLLM
from tiered_memory.types import StoredMessage

NEIGHBOUR_RANGES = "WITH t(sid, lo, hi)"  # the second statement of SQLiteRecordStore.neighbors
ONE_FACT = "FROM facts WHERE user_id=? AND id=?"  # a fact read by id (after `related` found it)


class DeletesBetweenStatements(SQLiteRecordStore):
    """The real SQLite store; ``action`` runs once, just before the first statement holding ``marker``."""

    marker = ""
    action: Callable[[], Any] | None = None

    def before(self, marker: str, action: Callable[[], Any]) -> None:
        self.marker, self.action = marker, action

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        if self.action is not None and self.marker in sql:
            run, self.action = self.action, None
            run()
        return super().query(sql, params)


def _memory(tmp_path: Path, embedder: Embedder, **kwargs: Any) -> tuple[TieredMemory, DeletesBetweenStatements]:
    (tmp_path / "mem").mkdir()
    store = DeletesBetweenStatements(tmp_path / "mem" / "records.sqlite3")
    return TieredMemory(tmp_path / "mem", record_store=store, embedder=embedder, **kwargs), store


def test_neighbours_of_a_message_deleted_meanwhile_are_none(tmp_path: Path) -> None:
    store = DeletesBetweenStatements(tmp_path / "records.sqlite3")
    rows = [StoredMessage(id=f"m{i}", user_id="u", session_id="s", role="user", content=f"turn {i}",
                          timestamp=1_700_000_000.0 + i) for i in range(3)]
    store.insert_messages(rows)
    store.before(NEIGHBOUR_RANGES, lambda: store.delete_message("u", "m1"))
    found = store.neighbors("u", ["m1"], 1)
    assert found == {"m1": []}  # gone: no neighbours, as for an id the store never held
    assert [m.id for m in store.neighbors("u", ["m0"], 1)["m0"]] == ["m0", "m2"]
    store.close()


def test_a_search_while_the_session_is_cleared_finds_nothing_of_it(tmp_path: Path, embedder: Embedder) -> None:
    memory, store = _memory(tmp_path, embedder)
    with memory:
        memory.add_many([{"role": "user", "content": "I am moving to Lisbon in May"},
                         {"role": "assistant", "content": "Lisbon is lovely in spring"}], session_id="trip", user_id="u")
        store.before(NEIGHBOUR_RANGES, lambda: memory.clear_session("trip", user_id="u"))
        memory.search("when is the move to Lisbon?", user_id="u")
        assert store.action is None  # the clear ran inside the search
        assert memory.search("when is the move to Lisbon?", user_id="u") == []


def test_add_fact_while_the_fact_it_matches_is_deleted_stores_it(tmp_path: Path, embedder: Embedder) -> None:
    memory, store = _memory(tmp_path, embedder)
    with memory:
        tea = memory.add_fact("User drinks green tea every morning", user_id="u")
        # the same text again is a no-op on `tea`: delete `tea` once `related` has found it
        store.before(ONE_FACT, lambda: memory.delete_fact(tea.id, user_id="u"))
        again = memory.add_fact("User drinks green tea every morning", user_id="u")
        assert store.action is None
        assert again.id != tea.id and [f.id for f in memory.facts("u")] == [again.id]


EPISODE = {"summary": "Talked about tea.", "entities": [], "decisions": [], "open_questions": [], "key_facts": []}


@pytest.mark.parametrize("judged", ["update", "noop", "invalidate"])
def test_a_fact_deleted_while_the_llm_judges_against_it_is_not_its_target(
        make_memory: Callable[..., TieredMemory], judged: str) -> None:
    """``end_session`` finds the related facts, asks the LLM, then writes: a ``delete_fact`` in
    another thread meanwhile leaves the judgement pointing at a fact that is gone. The candidate
    is then resolved again by the rules against the facts as they are (here: none, so added)."""
    memory: list[TieredMemory] = []

    def judge_while_deleted(messages: list[dict[str, str]]) -> dict[str, Any]:
        [tea] = memory[0].facts("u")
        memory[0].delete_fact(tea.id, user_id="u")
        return {"action": judged, "target": 1, "text": "User drinks green tea with honey every morning"}

    llm = ScriptedLLM(by_task={
        "facts": [{"facts": [{"type": "preference", "text": "User drinks green tea with honey in the morning",
                              "confidence": 0.8, "sources": [1]}]}],
        "resolve": [judge_while_deleted], "episode": [EPISODE]})
    memory.append(make_memory(llm=llm))
    memory[0].add_fact("User drinks green tea every morning", user_id="u", type="preference")
    memory[0].add("user", "I add honey to my green tea in the morning.", session_id="s", user_id="u")
    memory[0].end_session("s", user_id="u")
    assert "resolve" in llm.tasks()
    assert [f.text for f in memory[0].facts("u")] == ["User drinks green tea with honey in the morning"]


def test_a_merge_whose_keeper_is_deleted_meanwhile_keeps_its_duplicate(tmp_path: Path, embedder: Embedder) -> None:
    """``consolidate`` plans its merges from the facts it read, then merges group by group: a
    ``delete_fact`` of a group's keeper in between (here from the progress callback, which runs
    between two groups as another thread's call could) must not merge the duplicate into a
    fact that is gone. The group is left for the next run; the duplicate stays valid."""
    memory, _ = _memory(tmp_path, embedder)
    with memory:
        memory.add_fact("User keeps bees", user_id="u")  # the layer tables exist from here
        texts = {"tea": "User drinks green tea every morning", "cello": "User plays the cello on Sundays"}
        ids: dict[str, tuple[str, str]] = {}
        now = time.time()  # recent: the prune step after the merges leaves them
        with memory._layers.rows.transaction() as db:
            for name, text in texts.items():
                keep, dup = f"{name}-keep", f"{name}-dup"
                ids[name] = (keep, dup)
                for fid, body, confidence in ((keep, text, 0.9), (dup, text.upper() + ".", 0.8)):
                    db.execute("INSERT INTO facts (id, user_id, type, text, confidence, source_ids, metadata,"
                               " created_at, updated_at, valid_from) VALUES (?,?,?,?,?,?,?,?,?,?)",
                               (fid, "u", "fact", body, confidence, "[]", "{}", now, now, now))
        memory.rebuild_index()
        gone: list[str] = []

        def delete_the_other_keeper(step: str, done: int, total: int) -> None:
            if step == "merge" and done == 1 and total == 2:
                valid = {f.id for f in memory.facts("u")}
                [(keep, dup)] = [pair for pair in ids.values() if pair[1] in valid]  # the group not yet merged
                memory.delete_fact(keep, user_id="u")
                gone.append(dup)

        report = memory.consolidate("u", progress=delete_the_other_keeper)
        assert gone, "the callback ran between the two groups"
        assert report.merged == 1
        assert gone[0] in {f.id for f in memory.facts("u")}  # not merged into the deleted keeper
