"""What the export/import tests share (tests/test_portable_layers.py and
tests/test_portable_sessions.py): memories to fill, an export read back, a move to the other
record store, a refused import, and the rows a store holds."""

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


def export(m: TieredMemory, path: Path, user_id: str | None = None) -> list[dict[str, Any]]:
    m.export_jsonl(path, user_id=user_id)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


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


def layer_rows(m: TieredMemory) -> LayerStore:
    rows = open_layer_store(m.store)
    assert isinstance(rows, LayerStore)
    return rows


def table(m: TieredMemory, name: str, user: str) -> list[tuple[Any, ...]]:
    """Every column of the user's rows (vectors aside), as the store holds them."""
    columns = {"messages_archive": "id, user_id, session_id, role, content, metadata, timestamp, episode_id,"
                                   " archived_at",
               "working_items": "id, user_id, session_id, type, text, importance, metadata, created_at,"
                                " access_count, last_access, deleted_at",
               "scratchpads": "user_id, session_id, data, updated_at"}[name]
    return sorted(layer_rows(m).query(f"SELECT {columns} FROM {name} WHERE user_id=?", (user,)))


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


def refused_line(m: TieredMemory, tmp_path: Path, line: dict[str, Any]) -> None:
    """A file of that one ``line`` is read as its type, refused for a field, and nothing is
    written to ``m``."""
    dump = tmp_path / "bad.jsonl"
    dump.write_text(json.dumps({"format": "tiered-memory/1", **line}) + "\n", encoding="utf-8")
    with pytest.raises(ImportFormatError) as e:
        m.import_jsonl(dump)
    assert "expected an object with type" not in str(e.value)  # read as its type, refused for a field
    assert m.facts("ana", include_invalid=True) == [] and m.episodes("ana") == []
    assert all(table(m, t, "ana") == [] for t in ("messages_archive", "working_items", "scratchpads"))
