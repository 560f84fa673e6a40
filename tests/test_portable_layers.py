"""JSONL export and import of the memory layers: facts (with history, invalid ones too),
episodes (with their key points) and store items, restored as they were, indexed, and
checked line by line (archived turns and working memory: tests/test_portable_sessions.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.portable import ImportFormatError

from portable_support import MakeMemory, export, fill, moved, refused_line, refused_whole, table

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def facts_of(m: TieredMemory, user: str) -> dict[str, Any]:
    return {f.id: f for f in m.facts(user, include_invalid=True)}


def assert_same_layers(src: TieredMemory, dst: TieredMemory, user: str) -> None:
    assert facts_of(dst, user) == facts_of(src, user)  # every field: ids, times, validity, counts
    assert dst.fact_history(user) == src.fact_history(user)
    assert dst.episodes(user) == src.episodes(user)


def test_facts_and_episodes_round_trip_field_by_field_and_are_found(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    made = fill(src)
    lines = export(src, tmp_path / "all.jsonl")
    assert [x["type"] for x in lines] == sorted((x["type"] for x in lines), key=["message", "fact", "episode", "cursor"].index)
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
    assert (report.cursors_imported, report.cursors_skipped) == (2, 0)  # ana's two sessions
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


def test_a_fact_exported_without_its_slot_is_imported_in_the_slot_its_words_name(make_memory: MakeMemory,
                                                                                 tmp_path: Path) -> None:
    """A file whose "User lives in Porto" has no key (written from a store of facts stored
    without one) was restored as it was: outside its slot, which is read by key, so the next
    residence could leave it valid beside it. It is imported in the slot its words name."""
    src = make_memory("src")
    src.add_fact("User lives in Porto", user_id="ana")
    src.add_fact("User has a cat", user_id="ana")
    lines = export(src, tmp_path / "all.jsonl")
    for x in lines:
        if x["type"] == "fact":
            x["fact"]["key"] = None
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    dst = make_memory("dst")
    assert dst.import_jsonl(tmp_path / "all.jsonl").facts_imported == 2
    assert {f.text: (f.key, f.polarity) for f in dst.facts("ana")} == {
        "User lives in Porto": ("residence", 1), "User has a cat": (None, 1)}


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
    {"type": "fact_history", "user_id": "ana", "fact_id": "f1", "history": []},
    {"type": "fact_history", "user_id": "ana", "fact_id": "f1", "history": [{"fact_id": "f2", "action": "delete",
                                                                             "at": 1.0}]},
    {"type": "fact_history", "user_id": "ana", "fact_id": "f1", "history": [{"fact_id": "f1", "action": "delete",
                                                                             "at": "yesterday"}]},
    {"type": "fact_history", "fact_id": "f1", "history": [{"fact_id": "f1", "action": "delete", "at": 1.0}]},
    {"type": "fact_history", "user_id": "ana", "fact_id": "f1", "history": [{"fact_id": "f1", "action": "delete",
                                                                             "at": 1.0}], "fact": {}},
], ids=["summary-list", "decisions-str", "end-nan", "points-int", "history-other-fact", "details-nan",
        "unknown-type", "gone-history-empty", "gone-history-other-fact", "gone-history-at-str", "gone-no-user",
        "gone-unknown-field"])
def test_malformed_layer_lines_are_invalid(make_memory: MakeMemory, tmp_path: Path, line: dict[str, Any]) -> None:
    refused_line(make_memory(), tmp_path, line)


def test_the_history_of_deleted_facts_moves_too(make_memory: MakeMemory, tmp_path: Path) -> None:
    src = make_memory("src")
    made = fill(src)
    car = src.add_fact("User's car is a red Fiat", user_id="ana")
    src.update_fact(car.id, user_id="ana", text="User's car is a blue Fiat")
    src.delete_fact(car.id, user_id="ana")
    src.delete_fact(made["colour"], user_id="ana")
    lines = export(src, tmp_path / "all.jsonl")
    gone = [x for x in lines if x["type"] == "fact_history"]
    assert sorted(x["fact_id"] for x in gone) == sorted([car.id, made["colour"]])
    assert {x["user_id"] for x in gone} == {"ana"}

    dst = make_memory("dst")
    report = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (report.histories_imported, report.histories_skipped, report.invalid) == (2, 0, [])
    for user in ("ana", "bob"):
        assert_same_layers(src, dst, user)  # the whole trail, every field, in its first order
    assert [h.action for h in dst.fact_history("ana", car.id)] == ["add", "edit", "delete"]
    assert car.id not in facts_of(dst, "ana") and made["colour"] not in facts_of(dst, "ana")
    again = dst.import_jsonl(tmp_path / "all.jsonl")
    assert (again.histories_imported, again.histories_skipped) == (0, 2)
    assert dst.fact_history("ana") == src.fact_history("ana")  # nothing appended twice


def test_a_whole_store_export_holds_the_history_of_a_user_with_no_fact_left(make_memory: MakeMemory,
                                                                           tmp_path: Path) -> None:
    """A full export listed the users who hold facts or episodes: one whose every fact was
    deleted lost the trail of them on a move (a scoped export kept it)."""
    m = make_memory()
    tea = m.add_fact("User drinks green tea", user_id="cy")
    m.delete_fact(tea.id, user_id="cy")
    gone = [x for x in export(m, tmp_path / "all.jsonl") if x["type"] == "fact_history"]
    assert [(x["user_id"], x["fact_id"]) for x in gone] == [("cy", tea.id)]
    dst = make_memory("dst")
    dst.import_jsonl(tmp_path / "all.jsonl")
    assert dst.fact_history("cy") == m.fact_history("cy")


def test_reimporting_an_older_export_brings_no_deleted_fact_back(make_memory: MakeMemory, tmp_path: Path) -> None:
    """An export taken before a fact was deleted, imported again: the fact's id is held by the
    history (a re-import is a no-op), so the fact stays deleted and its trail is not written
    twice (it used to come back live, with 'add' again after its 'delete')."""
    m = make_memory()
    tea = m.add_fact("User drinks green tea", user_id="ana")
    m.export_jsonl(tmp_path / "before.jsonl")
    m.delete_fact(tea.id, user_id="ana")
    trail = m.fact_history("ana")
    report = m.import_jsonl(tmp_path / "before.jsonl")
    assert (report.facts_imported, report.facts_skipped) == (0, 1)
    assert tea.id not in facts_of(m, "ana") and m.search_facts("green tea", user_id="ana") == []
    assert m.fact_history("ana") == trail and [h.action for h in trail] == ["add", "delete"]


def test_a_deleted_facts_history_never_lands_on_a_stored_fact(make_memory: MakeMemory, tmp_path: Path) -> None:
    """The history line of an id that a stored fact (or history) holds is skipped: it is not
    appended to that fact's trail, whoever owns it. A fact line and a history line naming
    the same fact in one file are refused."""
    m = make_memory()
    held = m.add_fact("User keeps bees", user_id="bob")
    trail = m.fact_history("bob")
    entry = {"fact_id": held.id, "action": "delete", "old_text": "User keeps bees", "new_text": None, "at": 1.0,
             "details": {}}
    line = {"format": "tiered-memory/1", "type": "fact_history", "user_id": "mallory", "fact_id": held.id,
            "history": [entry]}
    (tmp_path / "one.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    report = m.import_jsonl(tmp_path / "one.jsonl")
    assert (report.histories_imported, report.histories_skipped) == (0, 1)
    assert m.fact_history("bob") == trail and m.fact_history("mallory") == []
    fact = {"format": "tiered-memory/1", "type": "fact", "fact": {"id": "f9", "user_id": "ana", "type": "fact",
                                                                "text": "t", "confidence": 1.0}, "history": []}
    twice = {**line, "user_id": "ana", "fact_id": "f9", "history": [{**entry, "fact_id": "f9"}]}
    (tmp_path / "two.jsonl").write_text(json.dumps(fact) + "\n" + json.dumps(twice) + "\n", encoding="utf-8")
    with pytest.raises(ImportFormatError) as e:
        m.import_jsonl(tmp_path / "two.jsonl")
    assert [n for n, _ in e.value.errors] == [2] and m.facts("ana") == [] and m.fact_history("ana") == []


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
    static = StaticEmbedder()  # what is stored is the point, not its ranking (MiniLM: 10 s of long turns)
    src = make_memory("src", embedder=static)
    long_words = " ".join(f"harbour{i}" for i in range(1_500))
    src.add_many([{"role": "user", "content": "My name is " + "Zed" * 3_000},
                  {"role": "user", "content": f"We decided to sail past {long_words}."},
                  {"role": "user", "content": f"The crew counted {long_words} twice."}],
                 session_id="s", user_id="ana")
    src.end_session("s", user_id="ana")
    assert max(len(f.text) for f in src.facts("ana")) > 5_000
    export(src, tmp_path / "long.jsonl")
    dst = make_memory("dst", embedder=static)
    report = dst.import_jsonl(tmp_path / "long.jsonl")
    assert report.invalid == [] and report.episodes_imported == 1
    assert_same_layers(src, dst, "ana")
