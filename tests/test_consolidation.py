"""Consolidation on a store with hundreds of facts and episodes over months: every step of one
run (sessions, merge, promote, compress, prune), a run interrupted and resumed, archiving,
the CLI, and a strict model's failure (the pure decisions: ``test_consolidation_decisions.py``;
forgetting what it archived: ``test_consolidation_forget.py``)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from consolidation_support import NOW, build_store, count, store_transaction
from time_support import DAY
from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.config import ConsolidationConfig
from tiered_memory.layers.consolidation import ConsolidationReport
from tiered_memory.store.sqlite import SQLiteRecordStore

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


@pytest.fixture
def big(make_memory: Callable[..., TieredMemory]) -> tuple[TieredMemory, dict[str, Any]]:
    memory = make_memory("big")
    return memory, build_store(memory)


def test_consolidate_months_of_memory(big: tuple[TieredMemory, dict[str, Any]]) -> None:
    memory, info = big
    calls: list[tuple[str, int, int]] = []
    t0 = time.perf_counter()
    report = memory.consolidate("u1", progress=lambda step, done, total: calls.append((step, done, total)))
    elapsed = time.perf_counter() - t0
    print(f"consolidate: {elapsed:.1f} s for {len(info['episodes'])} episodes and 200 facts")
    assert isinstance(report, ConsolidationReport)

    # sessions: the three uncovered idle sessions became episodes
    assert report.sessions == 3
    assert {e.session_id for e in memory.episodes("u1")} >= set(info["uncovered"])

    # merge: every duplicated text collapsed to one live fact; losers kept (soft delete) with history
    live = memory.facts("u1")
    by_norm: dict[str, int] = {}
    for f in live:
        key = f.text.lower().rstrip(".")
        by_norm[key] = by_norm.get(key, 0) + 1
    assert all(by_norm[d.lower().rstrip(".")] == 1 for d in info["dups"])
    assert report.merged >= len(info["dups"])
    assert count(memory, "SELECT COUNT(*) FROM fact_history WHERE user_id='u1' AND action='merge'") == report.merged
    assert count(memory, "SELECT COUNT(*) FROM facts WHERE user_id='u1' AND deleted_at IS NOT NULL") \
        == report.merged + report.pruned  # the one working item is fresh, so only facts were pruned

    # promote: each popular episode's key fact is now a fact from promotion
    promoted = [f for f in live if f.metadata.get("method") == "promotion"]
    assert report.promoted == len(info["popular"]) == 10
    assert len(promoted) == 10 and all(f.text.startswith("User's project") for f in promoted)
    assert count(memory, "SELECT COUNT(*) FROM episodes WHERE promoted_at IS NOT NULL") == 10

    # compress: raw messages of episodes older than 30 days left the hot table, FTS and vectors
    old = [(eid, sid) for eid, sid, end in info["episodes"] if end < NOW - 30 * DAY]
    recent = [(eid, sid) for eid, sid, end in info["episodes"] if end >= NOW - 30 * DAY]
    assert report.compressed >= len(old) > 150 and recent
    assert report.archived_messages == report.compressed  # one turn per session here
    for _, sid in old[:20]:
        assert memory.get_messages(sid, user_id="u1") == []
    assert count(memory, "SELECT COUNT(*) FROM messages_archive WHERE user_id='u1'") == report.archived_messages
    assert all(memory.get_messages(sid, user_id="u1") for _, sid in recent)
    archived_ids = set(info["sessions"][old[0][1]])
    hits = memory.search(f"Session {old[0][1].split('-')[1]} review plan item", user_id="u1", k=50)
    assert archived_ids.isdisjoint({h.id for h in hits})
    assert not (archived_ids & memory.index.ids("u1"))

    # prune: stale, never accessed, low-confidence facts are soft-deleted with an audit record
    assert all(f.text not in info["stale"] for f in live)
    assert count(memory, "SELECT COUNT(*) FROM fact_history WHERE action='prune'") == len(info["stale"])
    assert count(memory, "SELECT COUNT(*) FROM facts WHERE deleted_at IS NOT NULL AND text LIKE '%in passing%'") \
        == len(info["stale"])  # kept for audit, hidden from reads

    # progress reported for every step that had work, ending at its total
    steps = {c[0] for c in calls}
    assert {"sessions", "merge", "promote", "compress", "prune"} <= steps
    assert all(c[1] <= c[2] for c in calls)

    # idempotent: a second run finds nothing to do
    again = memory.consolidate("u1")
    assert (again.sessions, again.merged, again.promoted, again.compressed, again.pruned) == (0, 0, 0, 0, 0)
    assert len(memory.facts("u1")) == len(live)


class Stop(Exception):
    pass


def test_interrupted_run_resumes(big: tuple[TieredMemory, dict[str, Any]]) -> None:
    memory, info = big

    def explode(step: str, done: int, total: int) -> None:
        if step == "compress" and done == 40:
            raise Stop()

    with pytest.raises(Stop):
        memory.consolidate("u1", progress=explode)
    partial = count(memory, "SELECT COUNT(*) FROM episodes WHERE compressed_at IS NOT NULL")
    assert 40 <= partial < len([e for e in info["episodes"] if e[2] < NOW - 30 * DAY])  # stopped midway
    memory.consolidate("u1")
    old = [eid for eid, _, end in info["episodes"] if end < NOW - 30 * DAY]
    with store_transaction(memory) as db:
        compressed = {r[0] for r in db.execute("SELECT id FROM episodes WHERE compressed_at IS NOT NULL")}
        per_message = db.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM messages_archive").fetchone()
        audits = db.execute("SELECT COUNT(*) FROM audit_log WHERE action='archive'").fetchone()[0]
    assert set(old) <= compressed
    assert per_message[0] == per_message[1]  # nothing archived twice
    assert audits == len(compressed)  # one audit record per episode, none repeated
    assert count(memory, "SELECT COUNT(*) FROM episodes WHERE promoted_at IS NOT NULL") == 10


@pytest.mark.parametrize("delete_raw", [False, True])
def test_archiving_a_long_message_drops_its_chunk_vectors(make_memory: Callable[..., TieredMemory],
                                                          delete_raw: bool) -> None:
    config = MemoryConfig(consolidation=replace(ConsolidationConfig(), delete_raw=delete_raw))
    memory = make_memory("long", config=config)
    long = " ".join(f"Sentence {i} is about the tide tables of the Lisbon harbour." for i in range(60))
    memory.add_many([{"role": "user", "content": long, "timestamp": NOW - 90 * DAY},
                     {"role": "assistant", "content": "Noted.", "timestamp": NOW - 90 * DAY + 1}],
                    session_id="old", user_id="u1")
    memory.end_session("old", user_id="u1")
    assert len(memory.index.ids("u1")) > 3  # the message, its chunks, the reply and the episode's points
    assert memory.consolidate("u1").archived_messages == 2
    left = memory.index.ids("u1")
    assert left and all(i.startswith("ep:") for i in left), left  # no chunk of the archived message stays
    assert memory.stats().vectors == len(left)


def test_delete_raw_option(make_memory: Callable[..., TieredMemory]) -> None:
    config = MemoryConfig(consolidation=replace(ConsolidationConfig(), delete_raw=True))
    memory = make_memory("raw", config=config)
    info = build_store(memory, sessions=30, templates=1)
    report = memory.consolidate("u1")
    assert report.compressed > 0 and report.archived_messages == report.compressed
    assert count(memory, "SELECT COUNT(*) FROM messages_archive") == 0
    assert count(memory, "SELECT COUNT(*) FROM audit_log WHERE action='delete_raw'") == report.compressed
    assert len(memory.episodes("u1")) == len(info["episodes"]) + 3  # episodes themselves stay


def test_rebuild_index_restores_layer_vectors(memory: TieredMemory, tmp_path: Path) -> None:
    fact = memory.add_fact("User collects vinyl records", user_id="u1")
    memory.add("user", "We planned the Berlin offsite for June.", session_id="s1", user_id="u1")
    ep = memory.end_session("s1", user_id="u1")
    memory.rebuild_index()
    assert f"fact:{fact.id}" in memory.index.ids("u1")
    assert memory.search_facts("music collection", user_id="u1")[0].fact.id == fact.id
    assert memory.search_episodes("offsite in Berlin", user_id="u1")[0].episode.id == ep.id


def test_cli_consolidate(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from tiered_memory.cli import main

    memory = make_memory("cli")
    if not isinstance(memory.store, SQLiteRecordStore):  # the CLI finds the server as an app would
        monkeypatch.setenv("TIERED_MEMORY_RECORD_STORE", memory.store.url)
    build_store(memory, sessions=40, templates=1)
    memory.close()
    out, err = io.StringIO(), io.StringIO()
    code = main(["--path", str(tmp_path / "cli"), "consolidate", "--user", "u1", "--json"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    report = json.loads(out.getvalue())
    assert report["sessions"] == 3 and report["merged"] >= 5 and report["compressed"] > 0
    again = io.StringIO()
    assert main(["--path", str(tmp_path / "cli"), "consolidate", "--user", "u1", "--no-progress"],
                stdout=again, stderr=io.StringIO()) == 0
    assert "merged 0" in again.getvalue() and "compressed 0" in again.getvalue()


def test_a_strict_llm_failure_leaves_its_session_and_consolidate_does_the_rest_then_says_what_it_left(
        make_memory: Callable[..., TieredMemory]) -> None:
    """Under ``LLMConfig(strict=True)`` one session the model failed on (a timeout, or output
    it cannot give for that session, every night) stopped the whole of consolidate at that
    session: the idle sessions after it, the merges, promotions, archiving and pruning were
    never done, and the LLMError did not say so. The steps now go on; the session is left as
    it was (no episode, its turns live) and the error, raised at the end, names it and what
    was done. Rerun with a model that answers, the session is compressed."""
    from tiered_memory.config import LLMConfig
    from tiered_memory.errors import LLMError
    from tiered_memory.testing import ScriptedLLM, task_of, timeout

    def answer(messages: list[dict[str, str]]) -> Any:
        if task_of(messages) != "episode":
            return {"facts": []}
        if "sailing" in messages[-1]["content"]:
            return timeout()
        return {"summary": "Talked about the week.", "entities": [], "decisions": [], "open_questions": []}

    memory = make_memory(llm=ScriptedLLM(default=answer),
                         config=MemoryConfig(llm=LLMConfig(timeout_s=0.2, strict=True)))
    old = time.time() - 3 * 86400
    for sid, text in [("a", "I went sailing off Cascais"), ("b", "I baked bread all week"),
                      ("c", "I repaired my bike")]:
        memory.add_many([{"role": "user", "content": text, "timestamp": old + len(sid)}], session_id=sid, user_id="u")
    faded = memory.working_memory("w", user_id="u").remember("an old passing thought", importance=0.01,
                                                              now=old)
    with pytest.raises(LLMError) as failed:
        memory.consolidate("u")
    message = str(failed.value)
    assert "1 of 3 idle sessions was not compressed: 'a'" in message and "pruned 1" in message
    assert sorted(e.session_id for e in memory.episodes("u")) == ["b", "c"]  # the others were done
    assert [m.content for m in memory.get_messages("a", user_id="u")] == ["I went sailing off Cascais"]
    assert faded.id not in {i.id for i in memory.working_memory("w", user_id="u").items()}
    memory.llm = ScriptedLLM(default={"summary": "Sailing.", "entities": [], "decisions": [], "open_questions": [],
                                      "facts": []})
    assert memory.consolidate("u").sessions == 1
    assert sorted(e.session_id for e in memory.episodes("u")) == ["a", "b", "c"]
