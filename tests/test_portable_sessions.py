"""JSONL export and import of a session's state: the turns ``consolidate`` archived and
working memory (items and scratchpads), restored as they were, and checked line by line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import TieredMemory
from tiered_memory.errors import InvalidInputError
from tiered_memory.portable import ImportFormatError

from portable_support import (MakeMemory, export, fill, fill_sessions, layer_rows, moved, refused_line,
                              refused_whole, table)

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


TURN = {"id": "t1", "user_id": "ana", "session_id": "s", "role": "user", "content": "hi", "metadata": {},
        "timestamp": 1.7e9, "episode_id": "e1", "archived_at": 1.8e9}
WORKING = {"id": "w1", "user_id": "ana", "session_id": "s", "text": "a note", "type": "note", "importance": 0.5,
           "created_at": 1.7e9, "metadata": {}, "access_count": 0}
PAD = {"user_id": "ana", "session_id": "s", "data": {"step": 1}, "updated_at": 1.7e9}
AUDIT = {"user_id": "ana", "layer": "episode", "item_id": "e1", "action": "archive", "at": 1.7e9, "details": {}}


@pytest.mark.parametrize("line", [
    {"type": "archived", "archived": {**TURN, "role": "robot"}},
    {"type": "archived", "archived": {**TURN, "timestamp": "2024-01-01T00:00:00Z"}},
    {"type": "archived", "archived": {k: v for k, v in TURN.items() if k != "archived_at"}},
    {"type": "archived", "id": "t1", "user_id": "ana", "content": "flat, as a message line"},
    {"type": "working", "working": {**WORKING, "importance": 1.5}},
    {"type": "working", "working": {**WORKING, "score": 0.5}},
    {"type": "working", "working": {**WORKING, "text": "x" * 20_001}},
    {"type": "scratchpad", "scratchpad": {**PAD, "data": ["step", 2]}},
    {"type": "scratchpad", "scratchpad": {**PAD, "data": {"": 1}}},
    {"type": "scratchpad", "scratchpad": {**PAD, "updated_at": None}},
    {"type": "audit", "audit": {**AUDIT, "layer": "fact"}},
    {"type": "audit", "audit": {**AUDIT, "at": float("nan")}},
    {"type": "audit", "audit": {**AUDIT, "details": ["x"]}},
    {"type": "audit", "audit": {**AUDIT, "item_id": ""}},
    {"type": "audit", "audit": {k: v for k, v in AUDIT.items() if k != "action"}},
    {"type": "audit", "audit": {**AUDIT, "seq": 4}},
], ids=["archived-role", "archived-iso-time", "archived-no-archived_at", "archived-flat", "working-importance",
        "working-score", "working-too-long", "pad-data-list", "pad-empty-key", "pad-no-time", "audit-layer",
        "audit-at-nan", "audit-details-list", "audit-item-empty", "audit-no-action", "audit-unknown-field"])
def test_malformed_session_lines_are_invalid(make_memory: MakeMemory, tmp_path: Path, line: dict[str, Any]) -> None:
    refused_line(make_memory(), tmp_path, line)


@pytest.mark.parametrize("kind,change", [
    ("archived", {"content": "  "}), ("archived", {"metadata": ["a"]}), ("archived", {"archived_at": float("nan")}),
    ("archived", {"episode_id": 5}), ("archived", {"id": "fact:x"}), ("archived", {"seq": 3}),
    ("archived", {"user_id": None}),
    ("working", {"importance": True}), ("working", {"type": "<goal>"}), ("working", {"text": 42}),
    ("working", {"access_count": -1}), ("working", {"created_at": float("inf")}),
    ("working", {"metadata": {"x": float("nan")}}), ("working", {"session_id": ""}), ("working", {"vector": [0.1]}),
    ("scratchpad", {"data": {"x": float("nan")}}), ("scratchpad", {"data": {"big": "x" * 70_000}}),
    ("scratchpad", {"session_id": 7}), ("scratchpad", {"updated_at": -1e12}), ("scratchpad", {"data": None}),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={str(x)[:12]!r}" for k, x in v.items()))
def test_a_malformed_archived_or_working_line_is_refused_and_nothing_is_written(
        make_memory: MakeMemory, tmp_path: Path, kind: str, change: dict[str, Any]) -> None:
    src = make_memory("src")
    fill_sessions(src)
    lines = export(src, tmp_path / "all.jsonl")
    n = next(i for i, x in enumerate(lines) if x["type"] == kind)
    dst = refused_whole(make_memory, tmp_path, lines, n, json.dumps({**lines[n], kind: {**lines[n][kind], **change}}))
    assert all(table(dst, t, u) == [] for t in ("messages_archive", "working_items", "scratchpads")
               for u in ("ana", "bob"))


def test_hand_written_archived_and_working_lines_import_with_the_records_defaults(make_memory: MakeMemory,
                                                                                  tmp_path: Path) -> None:
    """The bases of the malformed-lines table are valid lines; fields with a default may be left out."""
    lines = [{"type": "archived", "archived": TURN}, {"type": "working", "working": WORKING},
             {"type": "scratchpad", "scratchpad": PAD},
             {"type": "working", "working": {"id": "w2", "user_id": "ana", "session_id": "s", "text": "short"}}]
    dump = tmp_path / "hand.jsonl"
    dump.write_text("".join(json.dumps({"format": "tiered-memory/1", **x}) + "\n" for x in lines), encoding="utf-8")
    m = make_memory()
    report = m.import_jsonl(dump)
    assert (report.archived_imported, report.working_imported, report.scratchpads_imported) == (1, 2, 1)
    assert table(m, "messages_archive", "ana") == [("t1", "ana", "s", "user", "hi", "{}", 1.7e9, "e1", 1.8e9)]
    assert table(m, "working_items", "ana")[1] == ("w2", "ana", "s", "note", "short", 0.5, "{}", 0.0, 0, None, None)
    assert m.working_memory("s", user_id="ana").scratchpad.to_dict() == {"step": 1}


@pytest.mark.record_stores("sqlite")  # the CLI opens a folder; PostgreSQL is moved to and from above
def test_the_cli_moves_facts_episodes_archived_turns_and_working_memory(make_memory: MakeMemory,
                                                                        tmp_path: Path) -> None:
    from tiered_memory.cli import main
    import io

    src = make_memory("src")
    fill(src)
    fill_sessions(src)
    src.delete_fact(src.add_fact("User drives a red Fiat", user_id="ana").id, user_id="ana")
    lines = export(src, tmp_path / "all.jsonl")
    kinds = [x["type"] for x in lines]
    out, err = io.StringIO(), io.StringIO()
    code = main(["--path", str(tmp_path / "dst"), "import", str(tmp_path / "all.jsonl"), "--no-progress"],
                stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert kinds.count("fact_history") == 1
    def n(kind: str, one: str, many: str) -> str:
        return f"{kinds.count(kind)} {one if kinds.count(kind) == 1 else many}"
    assert kinds.count("message") == 1  # one is said so: "1 message"
    assert (f"imported {n('message', 'message', 'messages')}, {n('fact', 'fact', 'facts')} (and the history of 1 "
            f"deleted fact), {n('episode', 'episode', 'episodes')} and 0 items; {n('archived', 'archived turn', 'archived turns')}, "
            f"4 working-memory items, 2 scratchpads and {n('audit', 'audit entry', 'audit entries')}") in out.getvalue()
    assert kinds.count("archived") == 5  # fill's three turns, old enough, were archived too
    out = io.StringIO()
    assert main(["--path", str(tmp_path / "dst"), "export", str(tmp_path / "again.jsonl")], stdout=out,
                stderr=err) == 0
    assert f"exported {len(lines)} lines" in out.getvalue() and "the audit log" in out.getvalue()
    again = [json.loads(x) for x in (tmp_path / "again.jsonl").read_text(encoding="utf-8").splitlines()]
    for kind in ("fact", "fact_history", "archived", "working", "scratchpad"):
        assert [x for x in again if x["type"] == kind] == [x for x in lines if x["type"] == kind]
    out = io.StringIO()
    assert main(["--path", str(tmp_path / "dst"), "import", str(tmp_path / "all.jsonl"), "--no-progress"],
                stdout=out, stderr=err) == 0
    assert f"({len(lines)} already present, 0 invalid lines skipped)" in out.getvalue()


def assert_same_sessions(src: TieredMemory, dst: TieredMemory, user: str) -> None:
    for name in ("messages_archive", "working_items", "scratchpads"):
        assert table(dst, name, user) == table(src, name, user), name


def test_archived_turns_and_working_memory_round_trip_field_by_field(make_memory: MakeMemory,
                                                                     tmp_path: Path) -> None:
    src = make_memory("src")
    made = fill_sessions(src)
    lines = export(src, tmp_path / "all.jsonl")
    kinds = [x["type"] for x in lines]
    assert (kinds.count("archived"), kinds.count("working"), kinds.count("scratchpad")) == (2, 4, 2)
    assert "old" not in {x["session_id"] for x in lines if x["type"] == "message"}  # archived, not live
    assert {x["format"] for x in lines} == {"tiered-memory/1"}
    assert [i.access_count for i in src.working_memory("live", user_id="ana").items_raw()
            if i.id == made["goal"]] == [1]  # the file holds a counted access

    dst = make_memory("dst")
    seen: list[int] = []
    report = dst.import_jsonl(tmp_path / "all.jsonl", progress=seen.append)
    assert sum(seen) == len(lines)
    assert (report.archived_imported, report.working_imported, report.scratchpads_imported) == (2, 4, 2)
    assert (report.archived_skipped, report.working_skipped, report.scratchpads_skipped) == (0, 0, 0)
    for user in ("ana", "bob"):
        assert_same_sessions(src, dst, user)
    # archived, as they were: not live turns, readable as archived, deleted with the session
    assert dst.get_messages("old", user_id="ana") == [] and dst.search("Kyoto", user_id="ana", k=5) == []
    archived = list(layer_rows(dst).archived_turns("ana"))
    assert archived == list(layer_rows(src).archived_turns("ana")) and len(archived) == 2
    assert dst.working_memory("live", user_id="ana").scratchpad.to_dict() == {
        "step": 2, "plan": {"next": ["retry", "log"], "done": None}}
    assert dst.clear_session("old", user_id="ana") == 2 and list(layer_rows(dst).archived_turns("ana")) == []
    dst.forget_user("bob")
    assert table(dst, "working_items", "bob") == [] and table(dst, "scratchpads", "bob") == []
    assert table(dst, "working_items", "ana") == table(src, "working_items", "ana")


def test_working_memory_recall_works_after_import_into_a_fresh_store(make_memory: MakeMemory,
                                                                     tmp_path: Path) -> None:
    src = make_memory("src")
    made = fill_sessions(src)
    src.export_jsonl(tmp_path / "all.jsonl", user_id="ana")
    dst = make_memory("dst")
    dst.import_jsonl(tmp_path / "all.jsonl")
    # embedded as remember() embeds an item: the stored vectors are the embedder's own
    pairs = layer_rows(dst).working_vectors("ana", "live")
    assert len(pairs) == 3
    for item, vector in pairs:
        assert vector is not None
        assert float(vector @ dst.embedder.embed_query(item.text)) > 0.99
    wm = dst.working_memory("live", user_id="ana")
    assert wm.items("what to eat for lunch?", k=1)[0].text == "lunch order: ramen for the team"
    assert wm.items("payment webhook bug", k=1)[0].id == made["goal"]
    ctx = dst.build_context("why does the payment webhook fail?", user_id="ana", session_id="live")
    session = ctx.section("session")
    assert session is not None and "user is debugging the payment webhook" in [i.text for i in session.items]
    assert dst.working_memory("live", user_id="bob").items() == []  # a scoped export: ana's only


def test_archived_turns_and_working_memory_move_from_sqlite_to_postgres(
        make_memory: MakeMemory, make_postgres_url: Callable[[], str], tmp_path: Path) -> None:
    """Run once per source store: SQLite -> PostgreSQL, and PostgreSQL -> SQLite."""
    src = make_memory("src")
    fill_sessions(src)
    with moved(src, make_postgres_url, tmp_path) as (dst, report):
        assert report.invalid == [] and (report.archived_imported, report.working_imported) == (2, 4)
        for user in ("ana", "bob"):
            assert_same_sessions(src, dst, user)
        assert dst.working_memory("live", user_id="ana").items("ramen", k=1)[0].type == "todo"


def test_reimport_skips_every_archived_turn_working_item_and_scratchpad(make_memory: MakeMemory,
                                                                         tmp_path: Path) -> None:
    src = make_memory("src")
    fill_sessions(src)
    dump = tmp_path / "all.jsonl"
    src.export_jsonl(dump)
    dst = make_memory("dst")
    dst.import_jsonl(dump)
    pad = dst.working_memory("live", user_id="ana").scratchpad
    pad["step"] = 3  # changed since: a re-import must not put the exported pad back
    again = dst.import_jsonl(dump)
    assert (again.archived_imported, again.working_imported, again.scratchpads_imported) == (0, 0, 0)
    assert (again.archived_skipped, again.working_skipped, again.scratchpads_skipped) == (2, 4, 2)
    assert pad["step"] == 3
    for name in ("messages_archive", "working_items"):
        assert table(dst, name, "ana") == table(src, name, "ana")  # nothing written twice


def test_a_scoped_import_refuses_another_users_archived_and_working_lines(make_memory: MakeMemory,
                                                                           tmp_path: Path) -> None:
    src = make_memory("src")
    fill_sessions(src)
    kinds = ("archived", "working", "scratchpad")
    lines = [x for x in export(src, tmp_path / "all.jsonl") if x["type"] in kinds]
    # bob has working memory; an archived turn of his is one of ana's, moved to him
    turn = next(x for x in lines if x["type"] == "archived")
    lines.append({**turn, "archived": {**turn["archived"], "id": "bob-turn", "user_id": "bob"}})
    (tmp_path / "some.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    bobs = [n for n, x in enumerate(lines, 1) if x[x["type"]]["user_id"] == "bob"]
    assert sorted(lines[n - 1]["type"] for n in bobs) == sorted(kinds)
    dst = make_memory("dst")
    with pytest.raises(ImportFormatError) as e:
        dst.import_jsonl(tmp_path / "some.jsonl", user_id="ana")
    assert [n for n, _ in e.value.errors] == bobs and all("another user" in m for _, m in e.value.errors)
    assert all(table(dst, t, u) == [] for t in ("messages_archive", "working_items", "scratchpads")
               for u in ("ana", "bob"))  # nothing written, ana's lines neither
    report = dst.import_jsonl(tmp_path / "some.jsonl", user_id="ana", skip_invalid=True)
    assert (report.archived_imported, report.working_imported, report.scratchpads_imported) == (2, 3, 1)
    assert all(table(dst, t, "bob") == [] for t in ("messages_archive", "working_items", "scratchpads"))


def test_an_id_held_by_another_users_working_item_or_archived_turn_is_skipped(make_memory: MakeMemory,
                                                                                tmp_path: Path) -> None:
    src = make_memory("src")
    fill_sessions(src)
    lines = [x for x in export(src, tmp_path / "all.jsonl", user_id="ana") if x["type"] in ("archived", "working")]
    stolen = [{**x, x["type"]: {**x[x["type"]], "user_id": "mallory", "session_id": "m"}} for x in lines]
    (tmp_path / "steal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stolen), encoding="utf-8")
    before = {t: table(src, t, "ana") for t in ("messages_archive", "working_items")}
    report = src.import_jsonl(tmp_path / "steal.jsonl")
    assert (report.archived_imported, report.archived_skipped) == (0, 2)
    assert (report.working_imported, report.working_skipped) == (0, 3)
    assert {t: table(src, t, "ana") for t in before} == before
    assert table(src, "messages_archive", "mallory") == table(src, "working_items", "mallory") == []


def test_reimporting_an_export_from_before_consolidate_brings_no_archived_turn_back(make_memory: MakeMemory,
                                                                                    tmp_path: Path) -> None:
    """A turn is live or archived, never both: an export taken before ``consolidate`` archived
    its turns, imported again, skips them (they used to come back as live turns, each id then
    held twice and exported twice); an archived line whose id a live turn holds is skipped
    too, and a message line and an archived line of one id in a file are refused."""
    m = make_memory()
    m.add_many([{"role": "user", "content": "Let's plan the Kyoto trip for April.", "timestamp": 1_700_000_000.0},
                {"role": "assistant", "content": "Book early.", "timestamp": 1_700_000_030.5}],
               session_id="old", user_id="ana")
    before = export(m, tmp_path / "before.jsonl")
    assert m.consolidate("ana").archived_messages == 2
    archive = table(m, "messages_archive", "ana")
    report = m.import_jsonl(tmp_path / "before.jsonl")
    assert (report.imported, report.skipped_existing) == (0, 2)
    assert m.get_messages("old", user_id="ana") == [] and m.search("Kyoto trip", user_id="ana") == []
    assert table(m, "messages_archive", "ana") == archive
    assert [x["type"] for x in export(m, tmp_path / "after.jsonl")].count("message") == 0

    live = make_memory("live")
    live.add_many([{"id": "t1", "role": "user", "content": "hi"}],
                  session_id="s", user_id="ana")
    (tmp_path / "turn.jsonl").write_text(json.dumps({"format": "tiered-memory/1", "type": "archived",
                                                      "archived": TURN}) + "\n", encoding="utf-8")
    report = live.import_jsonl(tmp_path / "turn.jsonl")
    assert (report.archived_imported, report.archived_skipped) == (0, 1)
    assert table(live, "messages_archive", "ana") == []

    message = next(x for x in before if x["type"] == "message")
    both = [message, {"format": "tiered-memory/1", "type": "archived", "archived": {**TURN, "id": message["id"]}}]
    (tmp_path / "both.jsonl").write_text("".join(json.dumps(x) + "\n" for x in both), encoding="utf-8")
    with pytest.raises(ImportFormatError) as e:
        make_memory("fresh").import_jsonl(tmp_path / "both.jsonl")
    assert [n for n, _ in e.value.errors] == [2] and "also on line 1" in e.value.errors[0][1]


def test_the_archive_is_read_page_by_page_in_one_order(make_memory: MakeMemory) -> None:
    """An archive may hold most of a long history: an export reads it a page at a time, and
    every page size gives the same turns in the same order, for one user or for everyone."""
    m = make_memory("paged")
    for user in ("ana", "bob"):
        for s in range(3):
            m.add_many([{"role": "user", "content": f"{user} planned trip {s} step {n}.",
                         "timestamp": 1_700_000_000.0 + 10 * n} for n in range(3)],
                       session_id=f"old-{s}", user_id=user)
        m.consolidate(user)
    rows = layer_rows(m)
    whole = list(rows.archived_turns(None))
    assert len(whole) == 18 and len({t.id for t in whole}) == 18
    assert [t.id for t in whole] == [t.id for t in sorted(whole, key=lambda t: (t.user_id, t.session_id,
                                                                                t.timestamp, t.id))]
    for page in (1, 2, 4, 17):
        assert list(rows.archived_turns(None, page=page)) == whole
        assert list(rows.archived_turns("bob", page=page)) == [t for t in whole if t.user_id == "bob"]


def test_the_audit_log_is_read_and_moves_with_the_memory(make_memory: MakeMemory, tmp_path: Path) -> None:
    """``audit_log`` reads what consolidation and eviction did; an export carries it and an
    import restores it as it was, once."""
    from dataclasses import replace

    from tiered_memory import MemoryConfig

    src = make_memory("src")
    fill_sessions(src)
    small = MemoryConfig(working=replace(MemoryConfig().working, capacity=1))
    mem = make_memory("tight", config=small)
    mem.working_memory("w", user_id="ana").remember("first note", importance=0.2)
    mem.working_memory("w", user_id="ana").remember("second note", importance=0.9)
    evicted = mem.audit_log("ana")
    assert [(e.layer, e.action, e.details) for e in evicted] == [("working", "evict", {"text": "first note"})]
    assert mem.audit_log("bob") == [] and mem.audit_log("ana", layer="episode") == []
    with pytest.raises(InvalidInputError):
        mem.audit_log("ana", layer="facts")

    archived = src.audit_log("ana", layer="episode")
    assert [e.action for e in archived] == ["summarise", "archive"] and src.audit_log("ana", layer="working") == []
    lines = export(src, tmp_path / "all.jsonl")
    assert [x["audit"] for x in lines if x["type"] == "audit"] == [
        {"user_id": "ana", "layer": e.layer, "item_id": e.item_id, "action": e.action, "at": e.at, "details": e.details}
        for e in archived]
    dst = make_memory("dst")
    report = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (report.audit_imported, report.audit_skipped, report.invalid) == (len(archived), 0, [])
    assert dst.audit_log("ana") == src.audit_log("ana")
    again = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (again.audit_imported, again.audit_skipped) == (0, len(archived))
    assert dst.audit_log("ana") == src.audit_log("ana")  # nothing appended twice
    with pytest.raises(ImportFormatError):  # a scoped import refuses another user's entry
        make_memory("third").import_jsonl(tmp_path / "all.jsonl", user_id="bob")
