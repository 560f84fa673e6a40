"""No stored value may break a later read, whoever wrote the row.

Writes through the API are checked (test_bad_input*.py), but rows also come from older
versions, from ``import_jsonl``, from a second process on the same store or from a user's
own SQL. Each case writes one malformed value with raw SQL beside a user's good memories
(a second connection, as another process would), then runs every read: each renders the
row sanitised, and the user's other rows still come back; another user's never do.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

from langchain_tiered_memory import TieredChatMessageHistory, TieredMemoryRetriever, TieredMemoryStore
from llamaindex_tiered_memory import TieredMemoryBlock
from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.store.sqlite_db import register_functions

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

GOOD = "I keep bees on the roof."
SECRET = "other user keeps a secret hive"
INSERT = ("INSERT INTO messages (id, user_id, session_id, role, content, metadata, timestamp, created_at)"
          " VALUES ('bad', 'u', 's1', ?, ?, ?, ?, 0)")


def _msg(role: Any = "user", content: Any = "bees from another writer", metadata: Any = "{}",
         timestamp: Any = 1.7e9) -> tuple[str, tuple[Any, ...]]:
    return INSERT, (role, content, metadata, timestamp)


def _set(table: str, column: str, value: Any) -> tuple[str, tuple[Any, ...]]:
    return f"UPDATE {table} SET {column} = ? WHERE user_id = 'u'", (value,)


# (case, SQL with ? parameters, parameters, the backends that can hold the value)
BOTH, SQLITE = ("sqlite", "postgres"), ("sqlite",)
CASES: list[tuple[str, tuple[str, tuple[Any, ...]], tuple[str, ...]]] = [
    ("metadata not JSON", _msg(metadata="{not json"), BOTH),
    ("metadata a list", _msg(metadata="[1, 2]"), BOTH),
    ("metadata null", _msg(metadata="null"), BOTH),
    ("metadata nested 1,000 deep", _msg(metadata="[" * 1000 + "]" * 1000), BOTH),
    ("metadata a number", _msg(metadata=5), SQLITE),
    ("metadata bytes not UTF-8", _msg(metadata=sqlite3.Binary(b'{"a": "\xff"}')), SQLITE),
    ("content with a lone surrogate", (INSERT.replace("?, ?, ?, ?", "'user', CAST(X'6265657320EDA080' AS TEXT),"
                                                      " '{}', 1.7e9"), ()), SQLITE),
    ("content bytes", _msg(content=sqlite3.Binary(b"bees \xff\xfe")), SQLITE),
    ("timestamp bytes", _msg(timestamp=sqlite3.Binary(b"\x00\x01")), SQLITE),
    ("fact source_ids not JSON", _set("facts", "source_ids", "nope"), BOTH),
    ("fact metadata not JSON", _set("facts", "metadata", "{"), BOTH),
    ("fact confidence text", _set("facts", "confidence", "high"), SQLITE),
    ("fact updated_at text", _set("facts", "updated_at", "x"), SQLITE),
    ("episode body not JSON", _set("episodes", "body", "nope"), BOTH),
    ("episode body a list", _set("episodes", "body", "[1]"), BOTH),
    ("episode lists not lists of text",
     _set("episodes", "body", '{"entities": 5, "decisions": "abc", "key_facts": [1, null]}'), BOTH),
    ("episode source_ids a number", _set("episodes", "source_ids", "5"), BOTH),
    ("episode end_ts text", _set("episodes", "end_ts", "x"), SQLITE),
    ("episode key point bytes", _set("episode_points", "text", sqlite3.Binary(b"bees \xff\xfe")), SQLITE),
    ("working importance text", _set("working_items", "importance", "x"), SQLITE),
    ("working created_at text", _set("working_items", "created_at", "x"), SQLITE),
    ("working metadata not JSON", _set("working_items", "metadata", "x"), BOTH),
    ("working vector not float32", _set("working_items", "vector", sqlite3.Binary(b"\x00" * 3)), SQLITE),
    ("fact history details not JSON", _set("fact_history", "details", "x"), BOTH),
    ("audit at text", ("INSERT INTO audit_log (user_id, layer, item_id, action, at, details)"
                       " VALUES ('u', 'episode', 'x', 'prune', 'x', 'x')", ()), SQLITE),
    ("audit details not JSON", ("INSERT INTO audit_log (user_id, layer, item_id, action, at, details)"
                                " VALUES ('u', 'episode', 'x', 'prune', 1, 'x')", ()), BOTH),
    ("item value not JSON", _set("items", "value", "x"), BOTH),
    ("item namespace not JSON", _set("items", "namespace", "x"), BOTH),
    ("item updated_at in milliseconds", _set("items", "updated_at", 1.7e12), BOTH),
    ("scratchpad not JSON", ("INSERT INTO scratchpads VALUES ('u', 's2', 'x', 1)", ()), BOTH),
    ("session cursor text", ("INSERT INTO session_cursor VALUES ('u', 's3', 'x')", ()), SQLITE),
    ("session id with a newline", (INSERT.replace("'s1'", "'s\n1'"), ("user", "bees", "{}", 1.7e9)), BOTH),
]


def _raw_write(where: Path | str, sql: str, params: tuple[Any, ...]) -> None:
    """Write as another process would: a connection of its own, no tiered-memory code but the
    SQL function the layer tables' keyword triggers call, which such a writer must register."""
    if isinstance(where, Path):
        con = sqlite3.connect(where)
        register_functions(con)
        try:
            with con:
                con.execute(sql, params)
        finally:
            con.close()
        return
    import psycopg

    with psycopg.connect(where, options="-c search_path=tiered_memory", autocommit=True) as pg:
        pg.execute(sql.replace("?", "%s"), params)  # type: ignore[arg-type]


def _fill(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": GOOD}, {"role": "assistant", "content": "What honey?"},
                     {"role": "user", "content": "Heather honey, mostly."}], session_id="s1", user_id="u")
    memory.add("user", SECRET, session_id="s1", user_id="v")
    memory.end_session("s1", user_id="u")
    fact = memory.add_fact("The user keeps bees", user_id="u")
    memory.update_fact(fact.id, user_id="u", text="The user keeps bees on the roof")
    memory.working_memory("s2", user_id="u").remember("buy a smoker for the bees")
    TieredMemoryStore(memory, fields=["text"]).put(("u", "prefs"), "k1", {"text": "bees like lavender"})
    memory.add("user", "what about my bees now?", session_id="s3", user_id="u")


def _read_everything(memory: TieredMemory, tmp_path: Path) -> None:
    hits = memory.search("bees roof", user_id="u", k=10)
    assert GOOD in [h.text for h in hits] and SECRET not in [h.text for h in hits]
    memory.search_sessions("bees roof", user_id="u")
    for session in ("s1", "s3"):
        ctx = memory.build_context("tell me about my bees on the roof", user_id="u", session_id=session,
                                   max_tokens=800)
        assert SECRET not in ctx.to_text()
        ctx.to_messages()
    assert GOOD in [m.content for m in memory.get_messages("s1", user_id="u")]
    memory.get_buffer("s1", user_id="u")
    memory.sessions("u")
    assert memory.facts("u", include_invalid=True)
    memory.search_facts("bees", user_id="u")
    assert memory.episodes("u")
    memory.search_episodes("bees honey", user_id="u")
    assert memory.fact_history("u")
    memory.audit_log("u")
    wm = memory.working_memory("s2", user_id="u")
    assert wm.items() and wm.items("smoker")
    memory.stats()
    # LangChain and LlamaIndex reads
    assert TieredChatMessageHistory(memory, "s1", user_id="u", include_memory=True).messages
    assert TieredMemoryRetriever(memory=memory, user_id="u").invoke("bees on the roof")
    store = TieredMemoryStore(memory, fields=["text"])
    store.get(("u", "prefs"), "k1")
    store.search(("u",), query="lavender")
    store.search(("u",))
    store.search(("u",), filter={"text": {"$ne": "wasps"}})  # a filter the database decides
    store.search(("u",), query="lavender", filter={"text": {"$ne": "wasps"}})
    store.list_namespaces()
    from llama_index.core.llms import ChatMessage

    block = TieredMemoryBlock(memory=memory, user_id="u")
    assert asyncio.run(block.aget([ChatMessage(role="user", content="bees on the roof?")], session_id="s3"))
    # a round trip through an export, then the writes that read what they change
    memory.export_jsonl(tmp_path / "out.jsonl")
    with TieredMemory(tmp_path / "copy", embedder=StaticEmbedder()) as copy:
        assert copy.import_jsonl(tmp_path / "out.jsonl").invalid == []  # what an export writes, an import takes
        assert GOOD in [h.text for h in copy.search("bees roof", user_id="u", k=10)]
    memory.end_session("s3", user_id="u")
    memory.rebuild_index()
    assert GOOD in [h.text for h in memory.search("bees roof", user_id="u", k=10)]
    # last: consolidation, which leaves alone a record whose time cannot be read
    memory.consolidate("u")


def _check(make_memory: Callable[..., TieredMemory], tmp_path: Path, url: object,
           write: tuple[str, tuple[Any, ...]]) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    _fill(memory)
    _raw_write(str(url) if url else tmp_path / "mem" / "records.sqlite3", *write)
    _read_everything(memory, tmp_path)
    memory.close()
    reopened = make_memory(embedder=StaticEmbedder())  # the start-up repair reads every pending row
    assert SECRET not in [h.text for h in reopened.search("bees roof hive", user_id="u", k=10)]
    assert reopened.get_messages("s3", user_id="u")


def _cases(backends: tuple[str, ...]) -> Any:
    chosen = [(name, write) for name, write, where in CASES if where == backends]
    return pytest.mark.parametrize("write", [w for _, w in chosen], ids=[n for n, _ in chosen])


@_cases(BOTH)
def test_a_malformed_stored_value_never_breaks_a_read(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                      record_backend: Callable[[str], dict[str, object]],
                                                      write: tuple[str, tuple[Any, ...]]) -> None:
    _check(make_memory, tmp_path, record_backend("mem").get("record_store"), write)


@pytest.mark.record_stores("sqlite")
@_cases(SQLITE)
def test_a_value_only_sqlite_keeps_never_breaks_a_read(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                       write: tuple[str, tuple[Any, ...]]) -> None:
    """SQLite keeps any value in any column (text in a REAL column, bytes that are not UTF-8)."""
    _check(make_memory, tmp_path, None, write)



def _dump(memory: TieredMemory, path: Path) -> list[str]:
    """What every read of the layers returns, as the export writes it (lines in a stable order)."""
    memory.export_jsonl(path)
    return sorted(json.dumps(json.loads(line), sort_keys=True) for line in path.read_text("utf-8").splitlines())


def _round_trip(make_memory: Callable[..., TieredMemory], tmp_path: Path, url: object,
                write: tuple[str, tuple[Any, ...]], caplog: pytest.LogCaptureFixture) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    _fill(memory)
    _raw_write(str(url) if url else tmp_path / "mem" / "records.sqlite3", *write)
    sessions = [s.session_id for s in memory.sessions("u") if s.session_id.isprintable()]  # the API's ids
    before = {s: memory.get_messages(s, user_id="u") for s in sessions}
    facts, episodes = memory.facts("u", include_invalid=True), memory.episodes("u")
    dumped = _dump(memory, tmp_path / "backup.jsonl")
    # an item whose namespace cannot be read has no line the import takes: left out, and said so
    left_out = [r.getMessage() for r in caplog.records if "import_jsonl would refuse" in r.getMessage()]
    unreadable_namespace = "SET namespace" in write[0]
    assert len(left_out) == 2 * unreadable_namespace and all("item" in m for m in left_out)
    if "'s\n1'" in write[0]:  # kept, its session id written as the import takes it
        assert any(json.dumps("s\u240a1") in line for line in dumped)
    copy = make_memory("copy", embedder=StaticEmbedder())
    report = copy.import_jsonl(tmp_path / "backup.jsonl")  # no skip_invalid: a backup restores whole
    assert report.invalid == []
    assert {s: copy.get_messages(s, user_id="u") for s in sessions} == before
    assert copy.facts("u", include_invalid=True) == facts and copy.episodes("u") == episodes
    assert _dump(copy, tmp_path / "again.jsonl") == dumped


@_cases(BOTH)
def test_an_export_of_malformed_rows_restores_whole(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                    record_backend: Callable[[str], dict[str, object]],
                                                    write: tuple[str, tuple[Any, ...]],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """What ``export_jsonl`` writes of rows read sanitised, ``import_jsonl`` takes: each
    message, fact and episode comes back as the first store reads it."""
    _round_trip(make_memory, tmp_path, record_backend("mem").get("record_store"), write, caplog)


@pytest.mark.record_stores("sqlite")
@_cases(SQLITE)
def test_an_export_of_values_only_sqlite_keeps_restores_whole(make_memory: Callable[..., TieredMemory],
                                                              tmp_path: Path,
                                                              write: tuple[str, tuple[Any, ...]],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    _round_trip(make_memory, tmp_path, None, write, caplog)


def _unreadable_time(make_memory: Callable[..., TieredMemory], tmp_path: Path, url: object, table: str,
                     column: str) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    where, bad = (str(url), float("nan")) if url else (tmp_path / "mem" / "records.sqlite3", "x")
    memory.add("user", "my bees swarmed this morning", session_id="s4", user_id="u")
    fact = memory.add_fact("The user keeps bees", user_id="u")
    memory.working_memory("s2", user_id="u").remember("buy a smoker for the bees")
    if table == "messages":  # the turn's time, before its episode is made from it
        _raw_write(where, *_set(table, column, bad))
    memory.end_session("s4", user_id="u")
    if table != "messages":
        _raw_write(where, *_set(table, column, bad))
    report = memory.consolidate("u")
    assert (report.compressed, report.archived_messages, report.pruned) == (0, 0, 0), report.details
    assert [m.content for m in memory.get_messages("s4", user_id="u")] == ["my bees swarmed this morning"]
    assert [f.id for f in memory.facts("u")] == [fact.id]
    assert [i.text for i in memory.working_memory("s2", user_id="u").items()] == ["buy a smoker for the bees"]


@pytest.mark.parametrize("table, column", [("episodes", "end_ts"), ("facts", "updated_at"),
                                           ("working_items", "created_at")])
def test_an_unreadable_time_is_not_an_age(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                          record_backend: Callable[[str], dict[str, object]],
                                          table: str, column: str) -> None:
    """A time a read cannot take (text; NaN in PostgreSQL) is read as 0.0, 1970: ``consolidate``
    must not archive its episode's turns, nor prune its fact or working item, as decades old."""
    _unreadable_time(make_memory, tmp_path, record_backend("mem").get("record_store"), table, column)


@pytest.mark.record_stores("sqlite")
def test_an_unreadable_turn_time_is_not_an_age(make_memory: Callable[..., TieredMemory], tmp_path: Path) -> None:
    """The episode of a session whose one turn has a time SQLite keeps as text ends at 0.0 (a
    PostgreSQL turn time is a float, NaN kept as NaN): its turn is not archived as decades old."""
    _unreadable_time(make_memory, tmp_path, None, "messages", "timestamp")


def test_a_session_is_idle_by_the_times_it_can_read(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                   record_backend: Callable[[str], dict[str, object]]) -> None:
    """A turn time another writer left unreadable (text, which SQLite sorts above every number;
    NaN, which PostgreSQL sorts there) tells no age: the session is idle by its other turns,
    and ``consolidate`` compresses it, where the bad time had kept it from ever being idle."""
    url = record_backend("mem").get("record_store")
    memory = make_memory(embedder=StaticEmbedder())
    where, bad = (str(url), float("nan")) if url else (tmp_path / "mem" / "records.sqlite3", "x")
    memory.add_many([{"role": "user", "content": "my bees swarmed this morning"},
                     {"role": "assistant", "content": "Did you catch the swarm?"}], session_id="s4", user_id="u")
    _raw_write(where, "UPDATE messages SET timestamp = ? WHERE user_id = 'u'", (1.7e9,))  # 2023: long idle
    _raw_write(where, "UPDATE messages SET timestamp = ? WHERE user_id = 'u' AND role = 'assistant'", (bad,))
    report = memory.consolidate("u")
    assert report.sessions == 1, report.details
    assert [e.session_id for e in memory.episodes("u")] == ["s4"]


def _add_raw(memory: TieredMemory, tmp_path: Path, url: object, rows: list[tuple[str, str, str, str]]) -> None:
    for message_id, user, session, content in rows:
        _raw_write(str(url) if url else tmp_path / "mem" / "records.sqlite3",
                   "INSERT INTO messages (id, user_id, session_id, role, content, metadata, timestamp, created_at)"
                   " VALUES (?, ?, ?, 'user', ?, '{}', 1.7e9, 0)", (message_id, user, session, content))


def test_an_id_written_printable_is_never_another_stored_id(make_memory: Callable[..., TieredMemory],
                                                             tmp_path: Path,
                                                             record_backend: Callable[[str], dict[str, object]]) -> None:
    """User ``w\\n1`` (another writer's) and user ``w␊1`` (the API's) stay two users through an
    export and an import, and sessions ``s\\n1`` and ``s␊1`` of one user stay two sessions: the
    id an export writes for one never merges its rows into another's."""
    memory = make_memory(embedder=StaticEmbedder())
    memory.add("user", "the real w keeps bees", session_id="s", user_id="w\u240a1")
    memory.add("user", "the real session", session_id="s\u240a1", user_id="u")
    _add_raw(memory, tmp_path, record_backend("mem").get("record_store"),
             [("x1", "w\n1", "s", "another writer's user"), ("x2", "u", "s\n1", "another writer's session")])
    memory.export_jsonl(tmp_path / "backup.jsonl")
    copy = make_memory("copy", embedder=StaticEmbedder())
    assert copy.import_jsonl(tmp_path / "backup.jsonl").invalid == []
    assert [m.content for m in copy.get_messages("s", user_id="w\u240a1")] == ["the real w keeps bees"]
    assert [m.content for m in copy.get_messages("s\u240a1", user_id="u")] == ["the real session"]
    written = {json.loads(line)["id"]: json.loads(line) for line in (tmp_path / "backup.jsonl").read_text("utf-8").splitlines()}
    assert [m.content for m in copy.get_messages("s", user_id=written["x1"]["user_id"])] == ["another writer's user"]
    assert [m.content for m in copy.get_messages(written["x2"]["session_id"], user_id="u")] == ["another writer's session"]


def test_an_export_names_a_rewritten_id_once(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                             record_backend: Callable[[str], dict[str, object]],
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A session id another writer left with a newline is rewritten on every line of its turns,
    and said once, not once a turn (a large session would flood the log)."""
    memory = make_memory(embedder=StaticEmbedder())
    _add_raw(memory, tmp_path, record_backend("mem").get("record_store"),
             [(f"x{n}", "u", "s\n1", f"turn {n}") for n in range(20)])
    memory.export_jsonl(tmp_path / "backup.jsonl")
    said = [r.getMessage() for r in caplog.records if "import_jsonl refuses" in r.getMessage()]
    assert len(said) == 1 and "'s\\n1'" in said[0], said


@pytest.mark.record_stores("sqlite")
def test_an_export_keeps_every_time_the_api_takes(make_memory: Callable[..., TieredMemory], tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A time the API took (the last second before 2200-01-01 included) is written as it is:
    only a time the import refuses is moved into its range."""
    memory = make_memory(embedder=StaticEmbedder())
    for at in (-2208988800.0, 7258118399.5):
        memory.add("user", f"written at {at}", session_id="s", user_id="u", timestamp=at)
    memory.export_jsonl(tmp_path / "backup.jsonl")
    copy = make_memory("copy", embedder=StaticEmbedder())
    copy.import_jsonl(tmp_path / "backup.jsonl")
    assert [m.timestamp for m in copy.get_messages("s", user_id="u")] == [-2208988800.0, 7258118399.5]
    assert not [r for r in caplog.records if "import_jsonl refuses" in r.getMessage()]
