"""Bad input, hand-written and property-based: every call either works (and stores
exactly what it was given) or raises a typed :class:`TieredMemoryError` with a
clear message. Nothing escapes as a bare ``TypeError``/``AttributeError``/
``RecursionError``/``UnicodeDecodeError``, and a rejected call writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered_memory import (
    ConfigurationError,
    ContentTooLargeError,
    CorruptStoreError,
    InvalidInputError,
    MemoryConfig,
    NotFoundError,
    TieredMemory,
    TieredMemoryError,
)

FAST = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def mem(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[TieredMemory]:
    with TieredMemory(tmp_path_factory.mktemp("bad") / "store", embedder=embedder) as m:
        yield m


def message_count(m: TieredMemory) -> int:
    return m.stats().messages


def rejected(call: Callable[[], Any], error: type[TieredMemoryError], *fragments: str) -> TieredMemoryError:
    with pytest.raises(TieredMemoryError) as info:
        call()
    assert isinstance(info.value, error), f"{type(info.value).__name__}: {info.value}"
    for f in fragments:
        assert f.lower() in str(info.value).lower(), str(info.value)
    return info.value


# ---- unicode and control characters: stored exactly ---------------------------------
ODD_TEXT = [
    "emoji 👩‍👩‍👧‍👦 family and flags 🇵🇹",
    "right-to-left עברית and العربية mixed with English",
    "combining e\u0301 vs precomposed \u00e9 are different strings",
    "\ufeffbyte order mark first",
    "zero\u200bwidth\u200djoiners\u2060",
    "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 𠜎𠜱",
    "bell \x07 escape \x1b[31mred\x1b[0m and DEL \x7f",
    "tabs\tand\r\nwindows newlines\n",
    "'; DROP TABLE messages; -- \" OR 1=1",
    "MATCH syntax: NEAR(a b) AND \"unbalanced * ^ : -",
]


@pytest.mark.parametrize("text", ODD_TEXT)
def test_odd_text_is_stored_exactly_and_searchable(mem: TieredMemory, text: str) -> None:
    mid = mem.add("user", text, session_id="odd", user_id="u-odd")
    stored = {m.id: m.content for m in mem.get_messages("odd", user_id="u-odd")}
    assert stored[mid] == text
    mem.search(text, user_id="u-odd", k=3)  # any FTS syntax in the query is inert


@pytest.mark.parametrize("content, fragment", [
    ("", "non-whitespace"), ("   ", "non-whitespace"), ("\n\t\r", "non-whitespace"),
    ("\u3000\u2003", "non-whitespace"), ("nul\x00inside", "nul"), ("lone \ud800 surrogate", "surrogate"),
    (None, "must be a str"), (123, "must be a str"), (b"bytes", "must be a str"), (["x"], "must be a str"),
])
def test_bad_content_is_rejected_and_nothing_written(mem: TieredMemory, content: Any, fragment: str) -> None:
    before = message_count(mem)
    batch = [{"role": "user", "content": "a fine message"}, {"role": "user", "content": content}]
    err = rejected(lambda: mem.add_many(batch, session_id="s", user_id="u"), InvalidInputError, fragment)
    assert "message 1" in str(err)  # says which message
    assert message_count(mem) == before


def test_a_one_megabyte_message_is_rejected_with_the_limit(mem: TieredMemory) -> None:
    before = message_count(mem)
    rejected(lambda: mem.add("user", "x" * 1_000_000, session_id="s", user_id="u"), ContentTooLargeError,
             "1,000,000", "max_content_chars")
    assert message_count(mem) == before


def test_a_large_message_within_a_raised_limit_is_stored_whole(make_memory: Callable[..., TieredMemory]) -> None:
    m = make_memory(config=MemoryConfig(max_content_chars=1_100_000))
    text = ("All work and no play makes Jack a dull boy. " * 200)[:6_000] + " unicorn-marker"
    mid = m.add("user", text, session_id="s", user_id="u")
    assert m.get_messages("s", user_id="u")[0].content == text
    assert m.search("unicorn-marker", user_id="u", k=1)[0].id == mid


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"role": "admin"}, InvalidInputError, "role must be one of"),
    ({"role": None}, InvalidInputError, "role must be one of"),
    ({"metadata": "not a dict"}, InvalidInputError, "mapping"),
    ({"metadata": {1: "int key"}}, InvalidInputError, "keys must be strings"),
    ({"metadata": {"obj": object()}}, InvalidInputError, "json"),
    ({"metadata": {"nan": float("nan")}}, InvalidInputError, "json"),
    ({"metadata": {"big": "x" * 200_000}}, InvalidInputError, "limit"),
    ({"timestamp": "yesterday"}, InvalidInputError, "iso"),
    ({"timestamp": True}, InvalidInputError, "bool"),
    ({"timestamp": float("inf")}, InvalidInputError, "finite"),
    ({"user_id": None}, InvalidInputError, "user_id"),
    ({"user_id": 42}, InvalidInputError, "user_id"),
    ({"user_id": " "}, InvalidInputError, "user_id"),
    ({"user_id": "x" * 300}, InvalidInputError, "limit"),
    ({"session_id": "line\nbreak"}, InvalidInputError, "control"),
])
def test_bad_arguments_to_add(mem: TieredMemory, kwargs: dict[str, Any], error: type[TieredMemoryError],
                              fragment: str) -> None:
    args: dict[str, Any] = {"role": "user", "content": "hello", "session_id": "s", "user_id": "u"}
    args.update(kwargs)
    before = message_count(mem)
    rejected(lambda: mem.add(**args), error, fragment)
    assert message_count(mem) == before


def test_deeply_nested_metadata_is_a_typed_error(mem: TieredMemory) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["k"] = {}
        node = node["k"]
    rejected(lambda: mem.add("user", "hi", session_id="s", user_id="u", metadata=deep), InvalidInputError,
             "metadata")


@pytest.mark.parametrize("messages", [None, 42, [None], ["just a string"], [{"role": "user"}],
                                      [{"role": "user", "content": "x", "extra": 1}]])
def test_add_many_with_a_wrong_shape(mem: TieredMemory, messages: Any) -> None:
    rejected(lambda: mem.add_many(messages, session_id="s", user_id="u"), InvalidInputError)


@pytest.mark.parametrize("call", [
    lambda m: m.search(None, user_id="u"),
    lambda m: m.search("   ", user_id="u"),
    lambda m: m.search("hi", user_id="u", k=0),
    lambda m: m.search("hi", user_id="u", k="3"),
    lambda m: m.search("hi", user_id="u", filters="role=user"),
    lambda m: m.search("hi", user_id="u", filters={"since": "last week"}),
    lambda m: m.build_context(None, user_id="u", session_id="s"),
    lambda m: m.build_context("hi", user_id="u", session_id="s", max_tokens="lots"),
    lambda m: m.build_context("hi", user_id="u", session_id="s", max_tokens=-5),
    lambda m: m.get_messages("s", user_id="u", limit="ten"),
    lambda m: m.get_messages("s", user_id="u", limit=-1),
    lambda m: m.forget(None, user_id="u"),
    lambda m: m.forget("no-such-id", user_id="u"),
    lambda m: m.forget_user(None),
    lambda m: m.add_fact(None, user_id="u"),
    lambda m: m.add_fact("   ", user_id="u"),
    lambda m: m.search_facts("", user_id="u"),
    lambda m: m.end_session(None, user_id="u"),
])
def test_wrong_types_in_reads_and_deletes_are_typed_errors(mem: TieredMemory, call: Callable[[TieredMemory], Any]) -> None:
    with pytest.raises(TieredMemoryError) as info:
        call(mem)
    assert str(info.value).strip(), "the error needs a message"


@pytest.mark.parametrize("user_id", ["../../etc/passwd", "a/b\\c", "C:\\Users\\x", "'; DROP TABLE messages; --",
                                     "%", "_", '"', "u' OR '1'='1", "NUL-free but \u202e RTL override"])
def test_ids_with_path_and_sql_metacharacters_are_plain_data(mem: TieredMemory, tmp_path: Path, user_id: str) -> None:
    mid = mem.add("user", f"note of {user_id!r} about walruses", session_id=user_id, user_id=user_id)
    assert [m.id for m in mem.get_messages(user_id, user_id=user_id)] == [mid]
    assert {h.id for h in mem.search("walruses", user_id=user_id, k=20)} == {mid}
    assert not (tmp_path.parent / "etc").exists()
    names = {r[0] for r in mem.store.conn.execute("SELECT name FROM sqlite_master")}  # type: ignore[attr-defined]
    assert "messages" in names
    mem.forget_user(user_id)
    assert mem.get_messages(user_id, user_id=user_id) == []


# ---- property-based -------------------------------------------------------------
@FAST
@given(text=st.text(max_size=200))
def test_any_text_is_stored_exactly_or_rejected(mem: TieredMemory, text: str) -> None:
    before = message_count(mem)
    try:
        mid = mem.add("user", text, session_id="prop", user_id="u-prop")
    except InvalidInputError as e:
        assert str(e)
        assert message_count(mem) == before
        return
    assert text.strip()
    assert mem.store.get_by_ids("u-prop", [mid])[mid].content == text


@FAST
@given(user_id=st.text(max_size=300))
def test_any_user_id_is_used_exactly_or_rejected(mem: TieredMemory, user_id: str) -> None:
    try:
        mid = mem.add("user", "a note about otters", session_id="s", user_id=user_id)
    except InvalidInputError as e:
        assert "user_id" in str(e)
        return
    hits = mem.search("otters", user_id=user_id, k=50)
    assert mid in {h.id for h in hits}
    assert all(mem.store.get_by_ids(user_id, [h.id]) for h in hits)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


@FAST
@given(metadata=st.dictionaries(st.text(max_size=10), JSON, max_size=5))
def test_any_json_metadata_round_trips(mem: TieredMemory, metadata: dict[str, Any]) -> None:
    try:
        mid = mem.add("user", "metadata carrier", session_id="meta", user_id="u-meta", metadata=metadata)
    except InvalidInputError as e:
        # the only reasons valid JSON data is refused: text no store can hold or filter on
        assert "surrogate" in str(e) or ("NUL" in str(e) and _holds_nul(metadata))
        return
    assert mem.store.get_by_ids("u-meta", [mid])[mid].metadata == json.loads(json.dumps(metadata))


# ---- JSONL import ---------------------------------------------------------------
def _line(**over: Any) -> str:
    row = {"format": "tiered-memory/1", "type": "message", "id": os.urandom(8).hex(), "user_id": "imp",
           "session_id": "s", "role": "user", "content": "imported note", "metadata": {}, "timestamp": 1.7e9}
    row.update(over)
    return json.dumps(row)


def test_malformed_jsonl_is_reported_by_line_and_nothing_is_imported(make_memory: Callable[..., TieredMemory],
                                                                     tmp_path: Path) -> None:
    m = make_memory()
    dup = os.urandom(8).hex()
    lines = [_line(), "{not json", json.dumps(["a list"]), _line(id=None), _line(role="wizard"), "",
             _line(content="   "), _line(id=dup), _line(id=dup), _line(timestamp=None), _line()]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InvalidInputError) as info:
        m.import_jsonl(path)
    bad_lines = [n for n, _ in info.value.errors]  # type: ignore[attr-defined]
    assert bad_lines == [2, 3, 4, 5, 7, 9, 10], info.value
    assert "line 2" in str(info.value) and "nothing imported" in str(info.value)
    assert message_count(m) == 0
    report = m.import_jsonl(path, skip_invalid=True)
    assert report.imported == 3 and [n for n, _ in report.invalid] == bad_lines
    assert message_count(m) == 3


def test_non_utf8_and_missing_import_files_are_typed_errors(make_memory: Callable[..., TieredMemory],
                                                            tmp_path: Path) -> None:
    m = make_memory()
    path = tmp_path / "latin1.jsonl"
    path.write_bytes((_line() + "\n").encode() + b'{"content": "caf\xe9"}\n' + (_line() + "\n").encode())
    with pytest.raises(InvalidInputError) as info:
        m.import_jsonl(path)
    assert [n for n, _ in info.value.errors] == [2]  # type: ignore[attr-defined]
    assert message_count(m) == 0
    rejected(lambda: m.import_jsonl(tmp_path / "missing.jsonl"), InvalidInputError, "missing.jsonl")
    rejected(lambda: m.export_jsonl(tmp_path / "no" / "such" / "dir.jsonl"), InvalidInputError, "dir.jsonl")


# ---- what is at `path` ------------------------------------------------------------
def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_file_at_path_is_a_configuration_error(tmp_path: Path, embedder: Any) -> None:
    f = tmp_path / "a-file"
    f.write_text("hello")
    rejected(lambda: TieredMemory(f, embedder=embedder), ConfigurationError, "folder")
    assert f.read_text() == "hello"


@pytest.mark.parametrize("make_file", ["garbage", "foreign", "truncated"])
def test_corrupt_or_foreign_database_is_a_corrupt_store_error_and_untouched(
    tmp_path: Path, embedder: Any, make_file: str,
) -> None:
    folder = tmp_path / "store"
    db = folder / "records.sqlite3"
    if make_file == "truncated":
        with TieredMemory(folder, embedder=embedder) as m:
            m.add_many([{"role": "user", "content": f"note {i} " * 40} for i in range(60)], session_id="s", user_id="u")
        for extra in folder.glob("records.sqlite3-*"):
            extra.unlink()
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 3] + os.urandom(4096))
    else:
        folder.mkdir()
        if make_file == "garbage":
            db.write_bytes(os.urandom(64 * 1024))
        else:
            con = sqlite3.connect(db)
            con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
            con.execute("INSERT INTO invoices VALUES (1, 9.5)")
            con.commit()
            con.close()
    before = _digest(db)
    with pytest.raises(TieredMemoryError) as info:
        with TieredMemory(folder, embedder=embedder) as m:
            m.search("note", user_id="u")  # a damaged page may only show on read
            m.stats()
    assert isinstance(info.value, CorruptStoreError), repr(info.value)
    assert "records.sqlite3" in str(info.value)
    if make_file != "truncated":
        assert _digest(db) == before, "tiered-memory modified a database it did not create"
    assert not list(folder.glob("records.sqlite3-wal")) or make_file == "truncated"
    # the folder lock was released: a second attempt gives the same clear error, not StoreLockedError
    with pytest.raises(CorruptStoreError):
        TieredMemory(folder, embedder=embedder)


def test_a_corrupt_vector_index_is_rebuilt_or_a_typed_error(tmp_path: Path, embedder: Any) -> None:
    folder = tmp_path / "store"
    with TieredMemory(folder, embedder=embedder) as m:
        mid = m.add("user", "the otter sleeps in the river", session_id="s", user_id="u")
    for f in (folder / "chroma").rglob("*.sqlite3"):
        f.write_bytes(os.urandom(32 * 1024))
    try:
        with TieredMemory(folder, embedder=embedder) as m:
            assert m.search("otter", user_id="u", k=1)[0].id == mid
    except TieredMemoryError as e:
        assert "chroma" in str(e).lower()


def test_not_found_is_a_lookup_error(mem: TieredMemory) -> None:
    with pytest.raises(LookupError):
        mem.forget("nope", user_id="u")
    assert issubclass(NotFoundError, TieredMemoryError)
