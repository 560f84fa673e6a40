"""JSONL export and import of what ``end_session`` has already summarised (each session's
coverage cursor, as the id of the last turn it covers), and of working memory into a store
whose capacity is smaller than the source's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import MemoryConfig, TieredMemory

from portable_support import MakeMemory, export, layer_rows, moved, refused_line

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

CURSOR = {"user_id": "ana", "session_id": "s", "through": "t1"}


def turns(m: TieredMemory, session: str, *texts: str, user: str = "ana") -> list[str]:
    return m.add_many([{"role": "user", "content": t, "timestamp": 1_700_000_000.0 + n}
                       for n, t in enumerate(texts)], session_id=session, user_id=user)


def summarised(m: TieredMemory) -> dict[str, Any]:
    """A session whose episode the user deleted ("gone"), one summarised with turns added
    after it ("open"), and bob's session of the same id, summarised."""
    turns(m, "gone", "My bank PIN is 4321.", "Please forget that.")
    m.delete_episode(m.end_session("gone", user_id="ana").id, user_id="ana")
    turns(m, "open", "I live in Lisbon.", "I love sushi.")
    first = m.end_session("open", user_id="ana")
    later = turns(m, "open", "I started learning Japanese.")
    turns(m, "gone", "Bees are my hobby.", user="bob")
    m.end_session("gone", user_id="bob")
    return {"first": first.id, "later": later}


def test_a_deleted_episodes_turns_are_released_after_a_move(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    made = summarised(src)
    lines = export(src, tmp_path / "all.jsonl")
    cursors = [x["cursor"] for x in lines if x["type"] == "cursor"]
    # the deleted episode released its turns (tests/test_episode_deletion.py): no cursor covers them
    assert sorted((c["user_id"], c["session_id"]) for c in cursors) == [("ana", "open"), ("bob", "gone")]
    assert {x["format"] for x in lines} == {"tiered-memory/1"}

    dst = make_memory("dst")
    report = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (report.cursors_imported, report.cursors_skipped, report.invalid) == (2, 0, [])
    assert dst.episodes("ana", "gone") == []
    # only the turn added after the episode is left to summarise
    assert layer_rows(dst).uncovered_count("ana", "open") == 1
    latest = dst.end_session("open", user_id="ana")
    assert latest.id != made["first"] and latest.source_ids == made["later"]
    assert dst.end_session("gone", user_id="bob").session_id == "gone"  # bob's own episode, as it was
    # ana's released turns are summarised again, as on the source
    again = dst.end_session("gone", user_id="ana")
    assert again.source_ids == [m.id for m in dst.get_messages("gone", user_id="ana")]
    assert again.source_ids == [m.id for m in src.get_messages("gone", user_id="ana")]


def test_an_import_never_moves_a_cursor_back(make_memory: MakeMemory, tmp_path: Path) -> None:
    """An export taken before ``end_session`` covered more, imported again, keeps the later
    cursor; imported twice, its cursors are skipped and counted."""
    m = make_memory()
    turns(m, "s", "I live in Lisbon.", "I love sushi.")
    m.end_session("s", user_id="ana")
    m.export_jsonl(tmp_path / "before.jsonl")
    turns(m, "s", "I moved to Porto.")
    m.end_session("s", user_id="ana")
    covered = layer_rows(m).cursor("ana", "s")
    report = m.import_jsonl(tmp_path / "before.jsonl")
    assert (report.cursors_imported, report.cursors_skipped) == (0, 1)
    assert layer_rows(m).cursor("ana", "s") == covered and layer_rows(m).uncovered_count("ana", "s") == 0

    dst = make_memory("dst")
    assert dst.import_jsonl(tmp_path / "before.jsonl").cursors_imported == 1
    again = dst.import_jsonl(tmp_path / "before.jsonl")
    assert (again.cursors_imported, again.cursors_skipped) == (0, 1)


def test_cursors_move_from_sqlite_to_postgres(make_memory: MakeMemory, make_postgres_url: Callable[[], str],
                                              tmp_path: Path) -> None:
    """Run once per source store: a message's seq is the store's own, so a cursor names a turn."""
    src = make_memory("src")
    summarised(src)
    with moved(src, make_postgres_url, tmp_path) as (dst, report):
        assert report.invalid == [] and report.cursors_imported == 2  # ana's "gone" was released
        assert layer_rows(dst).uncovered_count("ana", "gone") == 2
        assert layer_rows(dst).uncovered_count("ana", "open") == 1


def test_an_export_without_cursor_lines_still_imports(make_memory: MakeMemory, tmp_path: Path) -> None:
    """Before cursor lines, a session's cursor came back from its episodes' turns, as it still does."""
    src = make_memory("src")
    summarised(src)
    lines = [x for x in export(src, tmp_path / "all.jsonl") if x["type"] != "cursor"]
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    dst = make_memory("dst")
    report = dst.import_jsonl(tmp_path / "old.jsonl")
    assert (report.cursors_imported, report.cursors_skipped, report.invalid) == (0, 0, [])
    assert layer_rows(dst).uncovered_count("ana", "open") == 1


def test_a_cursor_naming_a_turn_not_stored_for_its_session_is_skipped(make_memory: MakeMemory,
                                                                      tmp_path: Path) -> None:
    """A cursor moves only past its own user's turns of its own session."""
    m = make_memory()
    bobs = turns(m, "s", "Bob's turn.", user="bob")
    other = turns(m, "elsewhere", "Ana's other session.")
    turns(m, "s", "Ana's turn.")
    lines = [{**CURSOR, "through": bobs[0]}, {**CURSOR, "session_id": "s2", "through": other[0]},
             {**CURSOR, "session_id": "s3", "through": "never-stored"}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"format": "tiered-memory/1", "type": "cursor",
                                                          "cursor": c}) + "\n" for c in lines), encoding="utf-8")
    report = m.import_jsonl(tmp_path / "c.jsonl")
    assert (report.cursors_imported, report.cursors_skipped) == (0, 3)
    assert [layer_rows(m).cursor(u, s) for u, s in [("ana", "s"), ("ana", "s2"), ("bob", "s")]] == [0, 0, 0]


@pytest.mark.parametrize("change", [{"through": ""}, {"through": None}, {"user_id": 5}, {"session_id": " "},
                                    {"seq": 3}, {"through": "x\x00y"}],
                         ids=["through-empty", "through-none", "user-int", "session-blank", "seq", "through-nul"])
def test_a_malformed_cursor_line_is_refused(make_memory: MakeMemory, tmp_path: Path, change: dict[str, Any]) -> None:
    refused_line(make_memory(), tmp_path, {"type": "cursor", "cursor": {**CURSOR, **change}})


def test_two_cursor_lines_of_one_session_are_refused(make_memory: MakeMemory, tmp_path: Path) -> None:
    line = json.dumps({"format": "tiered-memory/1", "type": "cursor", "cursor": CURSOR})
    (tmp_path / "two.jsonl").write_text(line + "\n" + line + "\n", encoding="utf-8")
    from tiered_memory.portable import ImportFormatError
    with pytest.raises(ImportFormatError) as e:
        make_memory().import_jsonl(tmp_path / "two.jsonl")
    assert [n for n, _ in e.value.errors] == [2] and "also on line 1" in e.value.errors[0][1]


def test_a_working_memory_import_keeps_the_stores_capacity(make_memory: MakeMemory, tmp_path: Path) -> None:
    """Imported into a store whose capacity is smaller, a session keeps its most important
    items, as ``remember`` would, and each evicted one is in the audit log."""
    src = make_memory("src")
    wm = src.working_memory("live", user_id="ana")
    for n, importance in enumerate([0.3, 0.9, 0.1, 0.7]):
        wm.remember(f"note {n}", importance=importance, now=1_700_000_000.0 + n)
    src.working_memory("other", user_id="ana").remember("alone", importance=0.2, now=1_700_000_000.0)
    src.export_jsonl(tmp_path / "all.jsonl")

    tight = MemoryConfig(working=replace(MemoryConfig().working, capacity=2, decay_per_hour=0.0))
    dst = make_memory("dst", config=tight)
    dst.working_memory("live", user_id="ana").remember("already here", importance=0.8, now=1_700_000_010.0)
    report = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (report.working_imported, report.working_skipped) == (5, 0)
    live = dst.working_memory("live", user_id="ana").items()
    assert [i.text for i in live] == ["note 1", "already here"]
    assert [i.text for i in dst.working_memory("other", user_id="ana").items()] == ["alone"]
    evicted = [e for e in dst.audit_log("ana", layer="working") if e.action == "evict"]
    assert sorted(e.details["text"] for e in evicted) == ["note 0", "note 2", "note 3"]
    again = dst.import_jsonl(tmp_path / "all.jsonl")  # the evicted ones are not brought back
    assert (again.working_imported, again.working_skipped) == (0, 5)
    assert [i.text for i in dst.working_memory("live", user_id="ana").items()] == ["note 1", "already here"]
