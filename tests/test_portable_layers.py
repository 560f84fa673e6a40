"""JSONL export and import of the memory layers: facts (with history, invalid ones too),
episodes (with their key points), store items, archived turns and working memory (items and
scratchpads), restored as they were, indexed, and checked line by line."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tiered_memory import TieredMemory
from tiered_memory.backends import open_layer_store
from tiered_memory.portable import ImportFormatError
from tiered_memory.store.layer_store import LayerStore

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

MakeMemory = Callable[..., TieredMemory]


def fill(m: TieredMemory) -> dict[str, Any]:
    """A memory with two ended sessions (episodes, rule facts, one contradicted), an added fact
    that was edited (history), a fact and messages of another user, and accesses counted."""
    m.add_many([{"role": "user", "content": "I live in Lisbon. I love sushi. I'm allergic to peanuts.",
                 "timestamp": 1_700_000_000.0},
                {"role": "assistant", "content": "Noted: Lisbon, sushi, no peanuts.", "timestamp": 1_700_000_010.0}],
               session_id="s1", user_id="ana")
    first = m.end_session("s1", user_id="ana")
    m.add("user", "I moved to Porto. I hate sushi.", session_id="s2", user_id="ana", timestamp=1_700_100_000.0)
    second = m.end_session("s2", user_id="ana")
    colour = m.add_fact("User's favourite colour is green", user_id="ana", metadata={"src": "form"})
    m.update_fact(colour.id, user_id="ana", text="User's favourite colour is dark green", confidence=0.7)
    m.add("user", "I keep bees in Oslo.", session_id="b1", user_id="bob")
    m.add_fact("User keeps bees", user_id="bob")
    m.search_facts("favourite colour", user_id="ana")  # an access, flushed by the export
    return {"episodes": [first.id, second.id], "colour": colour.id}


def facts_of(m: TieredMemory, user: str) -> dict[str, Any]:
    return {f.id: f for f in m.facts(user, include_invalid=True)}


def export(m: TieredMemory, path: Path, user_id: str | None = None) -> list[dict[str, Any]]:
    m.export_jsonl(path, user_id=user_id)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def assert_same_layers(src: TieredMemory, dst: TieredMemory, user: str) -> None:
    assert facts_of(dst, user) == facts_of(src, user)  # every field: ids, times, validity, counts
    assert dst.fact_history(user) == src.fact_history(user)
    assert dst.episodes(user) == src.episodes(user)


def test_facts_and_episodes_round_trip_field_by_field_and_are_found(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    made = fill(src)
    lines = export(src, tmp_path / "all.jsonl")
    assert [x["type"] for x in lines] == sorted((x["type"] for x in lines), key=["message", "fact", "episode"].index)
    assert {x["format"] for x in lines} == {"tiered-memory/1"}
    invalid = [f for f in facts_of(src, "ana").values() if not f.valid]
    assert invalid and invalid[0].superseded_by  # the file holds a contradicted fact...
    assert any(f.access_count for f in facts_of(src, "ana").values())  # ...and counted accesses

    dst = make_memory("dst")
    seen: list[int] = []
    report = dst.import_jsonl(tmp_path / "all.jsonl", progress=seen.append)
    assert sum(seen) == len(lines)  # a progress bar over the file's lines reaches its end
    assert (report.facts_imported, report.facts_skipped) == (len(facts_of(src, "ana")) + 1, 0)
    assert (report.episodes_imported, report.episodes_skipped) == (2, 0)
    for user in ("ana", "bob"):
        assert_same_layers(src, dst, user)
    assert [h.action for h in dst.fact_history("ana", made["colour"])] == ["add", "edit"]
    # indexed with the memory's embedder: the facts and episodes are found
    hit = dst.search_facts("what is the user's favourite colour?", user_id="ana", k=1)[0]
    assert hit.fact.id == made["colour"] and hit.fact.text == "User's favourite colour is dark green"
    assert dst.search_episodes("Porto sushi", user_id="ana", k=2)[0].episode.id in made["episodes"]
    ctx = dst.build_context("where does the user live?", user_id="ana", session_id="new")
    facts_section, episodes_section = ctx.section("facts"), ctx.section("episodes")
    assert facts_section is not None and "User lives in Porto" in [i.text for i in facts_section.items]
    assert episodes_section is not None and episodes_section.items
    # the imported episodes cover their turns: ending the session again summarises nothing new
    assert dst.end_session("s1", user_id="ana").id == made["episodes"][0]
    assert [e.id for e in dst.episodes("ana")] == made["episodes"]


def test_a_scoped_export_holds_one_users_layers(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    fill(src)
    lines = export(src, tmp_path / "bob.jsonl", user_id="bob")
    assert {x["type"] for x in lines} == {"message", "fact"}
    assert {(x.get("fact") or x)["user_id"] for x in lines} == {"bob"}


@contextmanager
def moved(src: TieredMemory, make_postgres_url: Callable[[], str], tmp_path: Path) -> Iterator[tuple[TieredMemory, Any]]:
    """``src`` exported and imported into a memory on the other record store (SQLite ->
    PostgreSQL, or PostgreSQL -> SQLite): that memory and the import's report."""
    dump = tmp_path / "move.jsonl"
    src.export_jsonl(dump)
    from_postgres = "postgres" in type(src.store).__name__.lower()
    dst = TieredMemory(tmp_path / "dst", embedder=src.embedder,
                       record_store=None if from_postgres else make_postgres_url())
    try:
        assert type(dst.store) is not type(src.store)
        yield dst, dst.import_jsonl(dump)
    finally:
        dst.close()


def test_moving_between_sqlite_and_postgres(make_memory: MakeMemory, make_postgres_url: Callable[[], str],
                                            tmp_path: Path) -> None:
    """Run once per source store: SQLite -> PostgreSQL, and PostgreSQL -> SQLite."""
    src = make_memory("src")
    fill(src)
    with moved(src, make_postgres_url, tmp_path) as (dst, report):
        assert report.invalid == [] and report.episodes_imported == 2
        for user in ("ana", "bob"):
            assert_same_layers(src, dst, user)
        assert dst.search_facts("Porto", user_id="ana", k=1)[0].fact.text == "User lives in Porto"


def test_reimport_skips_every_fact_and_episode(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    fill(src)
    dump = tmp_path / "all.jsonl"
    src.export_jsonl(dump)
    dst = make_memory("dst")
    first = dst.import_jsonl(dump)
    again = dst.import_jsonl(dump)
    assert (again.imported, again.facts_imported, again.episodes_imported) == (0, 0, 0)
    assert (again.skipped_existing, again.facts_skipped, again.episodes_skipped) == (
        first.imported, first.facts_imported, first.episodes_imported)
    assert dst.fact_history("ana") == src.fact_history("ana")  # no history appended twice
    assert len(dst.episodes("ana")) == 2


def test_a_scoped_import_refuses_another_users_fact(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    fill(src)
    lines = export(src, tmp_path / "all.jsonl")
    dst = make_memory("dst")
    with pytest.raises(ImportFormatError) as e:
        dst.import_jsonl(tmp_path / "all.jsonl", user_id="ana")
    bob_fact = next(n for n, x in enumerate(lines, 1) if x["type"] == "fact" and x["fact"]["user_id"] == "bob")
    assert bob_fact in [n for n, _ in e.value.errors]
    assert dst.facts("ana", include_invalid=True) == [] and dst.stats().messages == 0
    report = dst.import_jsonl(tmp_path / "all.jsonl", user_id="ana", skip_invalid=True)
    assert dst.facts("bob") == [] and report.facts_imported == len(facts_of(src, "ana"))


def _with_fact(line: dict[str, Any], **changes: Any) -> str:
    return json.dumps({**line, "fact": {**line["fact"], **changes}})


@pytest.mark.parametrize("change", [
    {"confidence": "high"}, {"confidence": True}, {"confidence": 1.5}, {"text": 42}, {"text": "  "},
    {"created_at": float("nan")}, {"invalid_at": float("inf")}, {"type": "rumour"}, {"source_ids": "m1"},
    {"metadata": ["a"]}, {"access_count": -1}, {"polarity": 2}, {"user_id": None}, {"colour": "green"},
    {"updated_at": "2024-01-01"},
], ids=lambda c: "-".join(f"{k}={v!r}" for k, v in c.items()))
def test_a_malformed_fact_line_is_refused_and_nothing_is_written(
        make_memory: MakeMemory, tmp_path: Path, change: dict[str, Any]) -> None:
    src = make_memory("src")
    fill(src)
    lines = export(src, tmp_path / "all.jsonl")
    n = next(i for i, x in enumerate(lines) if x["type"] == "fact")
    # json.dumps writes NaN/Infinity for float("nan"/"inf"): what a careless tool would write
    refused_whole(make_memory, tmp_path, lines, n, _with_fact(lines[n], **change))


def refused_whole(make_memory: MakeMemory, tmp_path: Path, lines: list[dict[str, Any]], n: int,
                  bad: str) -> TieredMemory:
    """An export whose line ``n`` is ``bad`` is refused, that line named, and nothing of it
    written: the memory it was imported into, for more checks."""
    raw = [json.dumps(x) for x in lines]
    raw[n] = bad
    (tmp_path / "bad.jsonl").write_text("\n".join(raw) + "\n", encoding="utf-8")
    dst = make_memory("dst")
    with pytest.raises(ImportFormatError) as e:
        dst.import_jsonl(tmp_path / "bad.jsonl")
    assert [line for line, _ in e.value.errors] == [n + 1]
    assert dst.stats().messages == 0 and dst.facts("ana", include_invalid=True) == [] and dst.episodes("ana") == []
    return dst


TURN = {"id": "t1", "user_id": "ana", "session_id": "s", "role": "user", "content": "hi", "metadata": {},
        "timestamp": 1.7e9, "episode_id": "e1", "archived_at": 1.8e9}
WORKING = {"id": "w1", "user_id": "ana", "session_id": "s", "text": "a note", "type": "note", "importance": 0.5,
           "created_at": 1.7e9, "metadata": {}, "access_count": 0}
PAD = {"user_id": "ana", "session_id": "s", "data": {"step": 1}, "updated_at": 1.7e9}


@pytest.mark.parametrize("line", [
    {"type": "episode", "episode": {"id": "e1", "user_id": "ana", "session_id": "s", "summary": ["x"]}},
    {"type": "episode", "episode": {"id": "e1", "user_id": "ana", "session_id": "s", "summary": "x",
                                    "decisions": "all"}},
    {"type": "episode", "episode": {"id": "e1", "user_id": "ana", "session_id": "s", "summary": "x",
                                    "end": float("nan")}},
    {"type": "episode", "episode": {"id": "e1", "user_id": "ana", "session_id": "s", "summary": "x"},
     "points": [1]},
    {"type": "fact", "fact": {"id": "f1", "user_id": "ana", "type": "fact", "text": "t", "confidence": 1},
     "history": [{"fact_id": "other", "action": "add", "at": 1.0}]},
    {"type": "fact", "fact": {"id": "f1", "user_id": "ana", "type": "fact", "text": "t", "confidence": 1},
     "history": [{"fact_id": "f1", "action": "add", "at": 1.0, "details": {"x": float("nan")}}]},
    {"type": "item", "id": "i1"},
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
], ids=["summary-list", "decisions-str", "end-nan", "points-int", "history-other-fact", "details-nan", "unknown-type",
        "archived-role", "archived-iso-time", "archived-no-archived_at", "archived-flat", "working-importance",
        "working-score", "working-too-long", "pad-data-list", "pad-empty-key", "pad-no-time"])
def test_malformed_layer_lines_are_invalid(make_memory: MakeMemory, tmp_path: Path, line: dict[str, Any]) -> None:
    dump = tmp_path / "bad.jsonl"
    dump.write_text(json.dumps({"format": "tiered-memory/1", **line}) + "\n", encoding="utf-8")
    m = make_memory()
    with pytest.raises(ImportFormatError) as e:
        m.import_jsonl(dump)
    assert "expected an object with type" not in str(e.value)  # read as its type, refused for a field
    assert m.facts("ana", include_invalid=True) == [] and m.episodes("ana") == []
    assert all(table(m, t, "ana") == [] for t in ("messages_archive", "working_items", "scratchpads"))


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


def test_an_id_held_by_another_user_is_skipped_not_taken_over(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    fill(src)
    lines = export(src, tmp_path / "all.jsonl", user_id="bob")
    fact = next(x for x in lines if x["type"] == "fact")
    stolen = {**fact, "fact": {**fact["fact"], "user_id": "mallory", "text": "User is mallory's"}}
    (tmp_path / "steal.jsonl").write_text(json.dumps(stolen) + "\n", encoding="utf-8")
    src_bob = facts_of(src, "bob")
    report = src.import_jsonl(tmp_path / "steal.jsonl")
    assert (report.facts_imported, report.facts_skipped) == (0, 1)
    assert facts_of(src, "bob") == src_bob and src.facts("mallory") == []


def test_an_old_messages_only_file_still_imports(make_memory: MakeMemory, tmp_path: Path) -> None:
    old = [{"format": "tiered-memory/1", "type": "message", "id": f"m{i}", "user_id": "ana", "session_id": "s1",
            "role": "user", "content": f"note {i} about Lisbon", "metadata": {}, "timestamp": 1.7e9 + i}
           for i in range(3)]
    dump = tmp_path / "old.jsonl"
    dump.write_text("".join(json.dumps(x) + "\n" for x in old), encoding="utf-8")
    m = make_memory()
    report = m.import_jsonl(dump)
    assert (report.imported, report.skipped_existing, report.invalid) == (3, 0, [])
    assert (report.facts_imported, report.episodes_imported) == (0, 0)
    assert (report.archived_imported, report.working_imported, report.scratchpads_imported) == (0, 0, 0)
    assert [x.id for x in m.get_messages("s1", user_id="ana")] == ["m0", "m1", "m2"]
    assert m.facts("ana") == [] and m.episodes("ana") == []
    assert all(table(m, t, "ana") == [] for t in ("messages_archive", "working_items", "scratchpads"))


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
    lines = export(src, tmp_path / "all.jsonl")
    kinds = [x["type"] for x in lines]
    out, err = io.StringIO(), io.StringIO()
    code = main(["--path", str(tmp_path / "dst"), "import", str(tmp_path / "all.jsonl"), "--no-progress"],
                stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert (f"imported {kinds.count('message')} messages, {kinds.count('fact')} facts, "
            f"{kinds.count('episode')} episodes and 0 items; {kinds.count('archived')} archived turns, "
            f"4 working-memory items and 2 scratchpads") in out.getvalue()
    assert kinds.count("archived") == 5  # fill's three turns, old enough, were archived too
    out = io.StringIO()
    assert main(["--path", str(tmp_path / "dst"), "export", str(tmp_path / "again.jsonl")], stdout=out,
                stderr=err) == 0
    assert f"exported {len(lines)} lines" in out.getvalue()
    again = [json.loads(x) for x in (tmp_path / "again.jsonl").read_text(encoding="utf-8").splitlines()]
    for kind in ("fact", "archived", "working", "scratchpad"):
        assert [x for x in again if x["type"] == kind] == [x for x in lines if x["type"] == kind]
    out = io.StringIO()
    assert main(["--path", str(tmp_path / "dst"), "import", str(tmp_path / "all.jsonl"), "--no-progress"],
                stdout=out, stderr=err) == 0
    assert f"({len(lines)} already present, 0 invalid lines skipped)" in out.getvalue()


def _items(m: TieredMemory) -> list[Any]:
    return m.item_store().db.item_rows(None)


def test_store_items_round_trip_with_their_ttl_and_are_found(make_memory: MakeMemory, tmp_path: Path) -> None:
    from tiered_memory.layers.items import SHARED_OWNER, ItemWrite

    src = make_memory("src")
    src.item_store().write_many([
        ItemWrite(namespace=("ana", "prefs"), key="food", user_id="ana", value={"likes": "sushi", "n": [1, 2.5]},
                  text="Ana loves salmon sushi\x1eweekly dinners", ttl_minutes=600),
        ItemWrite(namespace=("ana", "notes"), key="trip", user_id="ana", value={"to": "Kyoto"}),
        ItemWrite(namespace=("docs",), key="policy", user_id=SHARED_OWNER, value={"v": 1}, text="refund policy"),
        ItemWrite(namespace=("bob", "prefs"), key="food", user_id="bob", value={"likes": "bees"}),
    ])
    lines = export(src, tmp_path / "all.jsonl")
    assert [x["type"] for x in lines].count("item") == 4
    assert {x["item"]["user_id"] for x in export(src, tmp_path / "ana.jsonl", "ana") if x["type"] == "item"} == {"ana"}

    dst = make_memory("dst")
    report = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (report.items_imported, report.items_skipped) == (4, 0)
    assert _items(dst) == _items(src)  # ids, owners, namespaces, values, texts, times, TTL, expiry
    hit = dst.item_store().recall("what food does Ana like?", user_id="ana", k=1)[0]
    assert hit.item.key == "food" and hit.item.value["likes"] == "sushi"
    again = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (again.items_imported, again.items_skipped) == (0, 4) and _items(dst) == _items(src)
    with pytest.raises(ImportFormatError):  # a scoped import refuses the shared item and bob's
        make_memory("third").import_jsonl(tmp_path / "all.jsonl", user_id="ana")


@pytest.mark.parametrize("change", [{"value": [1]}, {"namespace": []}, {"key": ""}, {"user_id": "\x02x"},
                                    {"text": 5}, {"created_at": float("nan")}, {"value": {"x": float("inf")}}],
                         ids=["value-list", "namespace-empty", "key-empty", "owner-control", "text-int",
                              "created-nan", "value-inf"])
def test_a_malformed_item_line_is_refused(make_memory: MakeMemory, tmp_path: Path, change: dict[str, Any]) -> None:
    item = {"id": "i1", "user_id": "ana", "namespace": ["ana"], "key": "k", "value": {"a": 1}, "text": "t",
            "created_at": 1.7e9, "updated_at": 1.7e9}
    dump = tmp_path / "bad.jsonl"
    dump.write_text(json.dumps({"format": "tiered-memory/1", "type": "item", "item": {**item, **change}}) + "\n",
                    encoding="utf-8")
    m = make_memory()
    with pytest.raises(ImportFormatError):
        m.import_jsonl(dump)
    assert _items(m) == []
    ttl = tmp_path / "ttl.jsonl"
    ttl.write_text(json.dumps({"format": "tiered-memory/1", "type": "item", "item": item, "ttl_minutes": 0}) + "\n",
                   encoding="utf-8")
    with pytest.raises(ImportFormatError):
        m.import_jsonl(ttl)


def test_long_turns_make_layers_that_import_again(make_memory: MakeMemory, tmp_path: Path) -> None:
    """What the layers store from long turns, however long, is a line the import takes back: a
    rule fact holds what a turn said (here 9,000 characters, over the 5,000 a caller's fact may
    have) and an extractive summary joins sentences of several turns."""
    src = make_memory("src")
    long_words = " ".join(f"harbour{i}" for i in range(1_500))
    src.add_many([{"role": "user", "content": "My name is " + "Zed" * 3_000},
                  {"role": "user", "content": f"We decided to sail past {long_words}."},
                  {"role": "user", "content": f"The crew counted {long_words} twice."}],
                 session_id="s", user_id="ana")
    src.end_session("s", user_id="ana")
    assert max(len(f.text) for f in src.facts("ana")) > 5_000
    export(src, tmp_path / "long.jsonl")
    dst = make_memory("dst")
    report = dst.import_jsonl(tmp_path / "long.jsonl")
    assert report.invalid == [] and report.episodes_imported == 1
    assert_same_layers(src, dst, "ana")


# ---- archived turns and working memory ---------------------------------------------------
def _rows(m: TieredMemory) -> LayerStore:
    rows = open_layer_store(m.store)
    assert isinstance(rows, LayerStore)
    return rows


def fill_sessions(m: TieredMemory) -> dict[str, Any]:
    """Old turns that ``consolidate`` archives (after summarising their idle session), working
    memory of a live session (items, one accessed, and a scratchpad), and bob's."""
    m.add_many([{"role": "user", "content": "Let's plan the Kyoto trip for April.", "timestamp": 1_700_000_000.0,
                 "metadata": {"channel": "web"}},
                {"role": "assistant", "content": "Kyoto in April: cherry blossoms, book early.",
                 "timestamp": 1_700_000_030.5}], session_id="old", user_id="ana")
    report = m.consolidate("ana")
    assert report.archived_messages >= 2 and m.get_messages("old", user_id="ana") == []
    wm = m.working_memory("live", user_id="ana")
    goal = wm.remember("user is debugging the payment webhook", importance=0.9, type="goal",
                       metadata={"ticket": 42})
    wm.remember("the staging database is read-only today", importance=0.4, now=1_700_000_100.0)
    wm.remember("lunch order: ramen for the team", importance=0.6, type="todo")
    wm.scratchpad["step"] = 2
    wm.scratchpad["plan"] = {"next": ["retry", "log"], "done": None}
    m.build_context("why does the payment webhook fail?", user_id="ana", session_id="live")  # accesses
    bob = m.working_memory("live", user_id="bob")  # the same session id, another user
    bob.remember("bob is counting the hives", importance=0.8)
    bob.scratchpad["hives"] = 3
    return {"goal": goal.id}


def table(m: TieredMemory, name: str, user: str) -> list[tuple[Any, ...]]:
    """Every column of the user's rows (vectors aside), as the store holds them."""
    columns = {"messages_archive": "id, user_id, session_id, role, content, metadata, timestamp, episode_id,"
                                   " archived_at",
               "working_items": "id, user_id, session_id, type, text, importance, metadata, created_at,"
                                " access_count, last_access, deleted_at",
               "scratchpads": "user_id, session_id, data, updated_at"}[name]
    return sorted(_rows(m).query(f"SELECT {columns} FROM {name} WHERE user_id=?", (user,)))


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
    archived = list(_rows(dst).archived_turns("ana"))
    assert archived == list(_rows(src).archived_turns("ana")) and len(archived) == 2
    assert dst.working_memory("live", user_id="ana").scratchpad.to_dict() == {
        "step": 2, "plan": {"next": ["retry", "log"], "done": None}}
    assert dst.clear_session("old", user_id="ana") == 2 and list(_rows(dst).archived_turns("ana")) == []
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
    pairs = _rows(dst).working_vectors("ana", "live")
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
    rows = _rows(m)
    whole = list(rows.archived_turns(None))
    assert len(whole) == 18 and len({t.id for t in whole}) == 18
    assert [t.id for t in whole] == [t.id for t in sorted(whole, key=lambda t: (t.user_id, t.session_id,
                                                                                t.timestamp, t.id))]
    for page in (1, 2, 4, 17):
        assert list(rows.archived_turns(None, page=page)) == whole
        assert list(rows.archived_turns("bob", page=page)) == [t for t in whole if t.user_id == "bob"]
