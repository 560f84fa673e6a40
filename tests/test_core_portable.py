"""JSONL export -> import round trip, and malformed files."""

from __future__ import annotations

import json

import pytest

from tiered_memory import InvalidInputError, MemoryConfig
from tiered_memory.portable import ImportFormatError, parse_line

MESSAGES = [
    {"role": "user", "content": "Je m'appelle Zoë and I ❤ Kraków 🇵🇱",
     "metadata": {"source": {"app": "web", "tags": ["intro", "travel"], "depth": {"a": [1, 2.5, None]}}},
     "timestamp": 1_700_000_000.123456},
    {"role": "assistant", "content": "Nice to meet you, Zoë!", "timestamp": 1_700_000_030.5},
    {"role": "user", "content": "Remind me to renew my passport in June.",
     "metadata": {"flag": True, "n": 3}, "timestamp": "2024-05-01T10:00:00+02:00"},
]


def test_export_import_round_trips_content_metadata_and_timestamps(make_memory, tmp_path):
    src = make_memory("src")
    ids = src.add_many(MESSAGES, session_id="s1", user_id="zoe")
    src.add("user", "someone else's note", session_id="x", user_id="other")
    dump = tmp_path / "zoe.jsonl"
    assert src.export_jsonl(dump, user_id="zoe") == 3
    lines = dump.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and "other" not in dump.read_text(encoding="utf-8")
    assert json.loads(lines[0])["format"] == "tiered-memory/1"

    dst = make_memory("dst", vector_store="qdrant")  # portable across vector engines too
    report = dst.import_jsonl(dump)
    assert report.imported == 3 and report.invalid == []
    before = src.get_messages("s1", user_id="zoe")
    after = dst.get_messages("s1", user_id="zoe")
    assert [m.id for m in after] == ids
    for b, a in zip(before, after):
        assert (a.id, a.role, a.content, a.metadata, a.timestamp, a.session_id) == \
            (b.id, b.role, b.content, b.metadata, b.timestamp, b.session_id)
    assert after[0].metadata["source"]["depth"] == {"a": [1, 2.5, None]}
    assert after[0].timestamp == 1_700_000_000.123456
    # vectors were recomputed on import: the imported memory is searchable
    assert dst.stats().vectors == 3
    assert dst.search("when should I renew my passport?", user_id="zoe", k=1)[0].id == ids[2]


def test_importing_twice_skips_what_is_already_there(make_memory, tmp_path):
    src = make_memory("src")
    src.add_many(MESSAGES, session_id="s1", user_id="zoe")
    dump = tmp_path / "all.jsonl"
    src.export_jsonl(dump)
    dst = make_memory("dst")
    assert dst.import_jsonl(dump).imported == 3
    again = dst.import_jsonl(dump)
    assert (again.imported, again.skipped_existing) == (0, 3)
    assert dst.stats().messages == 3


def test_progress_callback_counts_every_imported_message(make_memory, tmp_path):
    dump = tmp_path / "d.jsonl"
    dump.write_text("".join(_line(id=f"m{i}", content=f"note {i}") + "\n" for i in range(130)))
    seen: list[int] = []
    make_memory("dst", config=MemoryConfig(write_chunk=128)).import_jsonl(dump, progress=seen.append)
    assert seen == [128, 2]  # one update per committed chunk


def _line(**over):
    base = {"format": "tiered-memory/1", "type": "message", "id": "m1", "user_id": "u",
            "session_id": "s", "role": "user", "content": "hello", "metadata": {}, "timestamp": 1.0}
    base.update(over)
    return json.dumps(base)


def test_malformed_jsonl_is_reported_by_line_and_nothing_is_imported(make_memory, tmp_path):
    dump = tmp_path / "bad.jsonl"
    dump.write_text("\n".join([
        _line(id="ok1"),
        "{not json",
        _line(id="ok2"),
        _line(id="bad-role", role="robot"),
        "",
        _line(id="no-ts", timestamp=None),
        _line(id="ok3"),
    ]) + "\n", encoding="utf-8")
    memory = make_memory()
    with pytest.raises(ImportFormatError) as info:
        memory.import_jsonl(dump)
    assert [n for n, _ in info.value.errors] == [2, 4, 6]
    assert "line 2" in str(info.value) and "nothing imported" in str(info.value)
    assert isinstance(info.value, InvalidInputError)
    assert memory.stats().messages == 0 and memory.stats().vectors == 0

    report = memory.import_jsonl(dump, skip_invalid=True)
    assert report.imported == 3 and [n for n, _ in report.invalid] == [2, 4, 6]
    assert {m.id for m in memory.get_messages("s", user_id="u")} == {"ok1", "ok2", "ok3"}


@pytest.mark.parametrize("raw, fragment", [
    ("[]", "type 'message'"),
    ('{"type": "fact"}', "type 'message'"),
    (_line(user_id=""), "user_id"),
    (_line(content="   "), "content"),
    (_line(metadata=[1, 2]), "metadata"),
    (_line(timestamp="yesterday"), "ISO"),
    ("nope", "not JSON"),
    (_line(id="fact:1"), "starts with 'fact:'"),
    pytest.param('{"type": "message", "timestamp": ' + "9" * 5000 + "}", "not JSON this library can read",
                 id="an-int-of-5000-digits"),
    pytest.param('{"type": "message", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}",
                 "not JSON this library can read", id="nested-past-the-stack"),
    (_line(timestamp=10**400), "outside 1900"),
    (_line(metadata={"d": json.loads('{"a":' * 120 + "1" + "}" * 120)}), "more than 100 levels"),
])
def test_parse_line_rejects(raw, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        parse_line(raw, max_chars=1000, max_metadata_bytes=1000)


def test_export_of_unknown_user_writes_an_empty_file(memory, tmp_path):
    out = tmp_path / "none.jsonl"
    assert memory.export_jsonl(out, user_id="ghost") == 0
    assert out.read_text() == ""


def test_duplicate_ids_and_bad_utf8_are_invalid_lines_not_a_half_import(make_memory, tmp_path):
    dump = tmp_path / "dups.jsonl"
    lines = [_line(id=f"m{i}", content=f"note {i}").encode() for i in range(600)]
    lines.append(_line(id="m3", content="same id again").encode())
    lines.append(b'{"type": "message", "content": "caf\xe9"}')
    dump.write_bytes(b"\n".join(lines) + b"\n")
    memory = make_memory()
    with pytest.raises(ImportFormatError) as info:
        memory.import_jsonl(dump)
    assert info.value.errors[0] == (601, "id 'm3' is also on line 4")
    assert info.value.errors[1][0] == 602 and "not UTF-8" in info.value.errors[1][1]
    assert memory.stats().messages == 0


def test_a_line_of_another_format_version_is_refused_naming_it(make_memory, tmp_path):
    """A dump written by a later version (whose fields may mean something else) is not read as
    this one: its lines are invalid, named by line, and nothing is imported. A line with no
    ``format`` (a file written by hand) is read as this version's."""
    dump = tmp_path / "future.jsonl"
    dump.write_text("\n".join([
        _line(id="ok1"),
        _line(id="later", format="tiered-memory/2"),
        json.dumps({k: v for k, v in json.loads(_line(id="by-hand")).items() if k != "format"}),
        json.dumps({"format": ["tiered-memory/1"], "type": "fact", "fact": {}}),
    ]) + "\n", encoding="utf-8")
    memory = make_memory()
    with pytest.raises(ImportFormatError) as info:
        memory.import_jsonl(dump)
    assert [n for n, _ in info.value.errors] == [2, 4]
    assert "'tiered-memory/2'" in info.value.errors[0][1] and "tiered-memory/1" in info.value.errors[0][1]
    assert "format" in info.value.errors[1][1]
    assert memory.stats().messages == 0
    with pytest.raises(InvalidInputError, match="format"):
        parse_line(_line(format="tiered-memory/2"), max_chars=1000, max_metadata_bytes=1000)


def test_a_file_that_starts_with_a_byte_order_mark_imports(make_memory, tmp_path):
    """A JSONL file saved by a Windows tool (Notepad, PowerShell 5's Out-File -Encoding utf8)
    starts with a UTF-8 byte order mark: its first line was invalid, 'not JSON (Unexpected UTF-8
    BOM (decode using utf-8-sig))', and the import refused the whole file. The mark is not
    text; a line after the first that starts with one is still invalid."""
    dump = tmp_path / "notepad.jsonl"
    dump.write_bytes(b"\xef\xbb\xbf" + f"{_line(id='m1')}\r\n{_line(id='m2')}\r\n".encode())
    memory = make_memory()
    report = memory.import_jsonl(dump)
    assert (report.imported, report.invalid) == (2, [])
    dump.write_bytes(f"{_line(id='m3')}\n".encode() + b"\xef\xbb\xbf" + _line(id="m4").encode())
    with pytest.raises(ImportFormatError) as info:
        memory.import_jsonl(dump)
    assert [n for n, _ in info.value.errors] == [2]


@pytest.mark.parametrize("kind", ["message", "fact", "episode", "item"])
def test_an_index_failing_during_an_import_is_a_typed_error_and_a_rerun_restores_the_rest(make_memory, tmp_path,
                                                                                         kind):
    """A vector index that fails during an import (a custom one may raise anything) gives a
    ``VectorIndexError`` saying what to do, as ``add`` does, not the engine's own exception; what
    was stored stays, and the import run again once the index works writes the rest."""
    from tiered_memory import VectorIndexError
    from tiered_memory.layers.items import ItemWrite
    from tiered_memory.testing import FailingVectorIndex
    from tiered_memory.vector.chroma import ChromaVectorIndex

    src = make_memory("src")
    src.add_many(MESSAGES, session_id="s1", user_id="zoe")
    src.end_session("s1", user_id="zoe")
    src.add_fact("User's favourite colour is green", user_id="zoe")
    src.item_store().write_many([ItemWrite(namespace=("zoe", "prefs"), key="food", user_id="zoe",
                                           value={"likes": "pierogi"}, text="Zoë loves pierogi")])
    dump = tmp_path / "all.jsonl"
    src.export_jsonl(dump)
    lines = [json.loads(x) for x in dump.read_text(encoding="utf-8").splitlines()]
    one = tmp_path / "one.jsonl"  # the lines of one kind, so the failure happens in its restore
    one.write_text("".join(json.dumps(x) + "\n" for x in lines if x["type"] == kind), encoding="utf-8")

    index = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "index")), fail_on=["upsert"], times=None)
    dst = make_memory("dst", vector_store=index)
    with pytest.raises(VectorIndexError, match="import the file again"):
        dst.import_jsonl(one)
    index.healthy()
    dst.import_jsonl(dump)
    dst.close()
    with make_memory("dst", vector_store=ChromaVectorIndex(str(tmp_path / "index"))) as dst:
        if kind == "item":  # an item's missing vector is restored by a rebuild, not by an open
            dst.rebuild_index()
        assert len(dst.get_messages("s1", user_id="zoe")) == 3
        assert [f.text for f in dst.facts("zoe")] == [f.text for f in src.facts("zoe")]
        assert [e.id for e in dst.episodes("zoe")] == [e.id for e in src.episodes("zoe")]
        assert dst.item_store().recall("what food does Zoë like?", user_id="zoe", k=1)[0].item.key == "food"
        assert "passport" in dst.search("renew my passport", user_id="zoe", k=1)[0].text
