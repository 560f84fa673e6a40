"""Stores written by earlier versions open in this one and lose nothing.

Each folder of ``tests/data/upgrade`` holds what one earlier commit wrote through its public
API (``make_fixture.py`` there, run with that commit on ``PYTHONPATH``): ``records.sql``, the
sqlite3 shell's ``.dump`` of its record store, and ``export.jsonl``, that version's own export.
The vector index is derived data and not kept: opened without one, a memory rebuilds it from
the records. ``2026-11-29-cb6bad5`` is the first release; ``2026-12-04-89339e7`` the last
commit of 2026-12-04.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tiered_memory import Embedder, TieredMemory
from tiered_memory.embedding import embed
from tiered_memory.recall.chunking import message_of
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex

FIXTURES = Path(__file__).parent / "data" / "upgrade"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
FIRST_RELEASE = "2026-11-29-cb6bad5"


def load(version: str, folder: Path) -> Path:
    """A memory folder holding the old version's record store (and no vector index)."""
    folder.mkdir()
    con = sqlite3.connect(folder / "records.sqlite3")
    con.executescript((FIXTURES / version / "records.sql").read_text(encoding="utf-8"))
    con.close()
    return folder


def exported(version: str) -> list[dict[str, Any]]:
    lines = (FIXTURES / version / "export.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def turns(messages: list[Any]) -> list[tuple[Any, ...]]:
    return [(m["id"], m["role"], m["content"], m["metadata"], m["timestamp"]) if isinstance(m, dict)
            else (m.id, m.role, m.content, m.metadata, m.timestamp) for m in messages]


def migrations(folder: Path) -> list[tuple[str, int, float]]:
    con = sqlite3.connect(folder / "records.sqlite3")
    try:
        return sorted(con.execute("SELECT name, version, applied_at FROM schema_migrations").fetchall())
    finally:
        con.close()


@pytest.fixture(params=VERSIONS)
def old(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    return request.param, load(request.param, tmp_path / "old")


def test_every_turn_reads_back_as_the_old_version_exported_it(old: tuple[str, Path]) -> None:
    version, folder = old
    lines = exported(version)
    with TieredMemory(folder) as m:
        sessions = sorted({(x["user_id"], x["session_id"]) for x in lines})
        for user, session in sessions:
            assert turns(m.get_messages(session, user_id=user)) == turns(
                [x for x in lines if (x["user_id"], x["session_id"]) == (user, session)])
        assert m.stats().messages == len(lines)
        # carol's 100-day-old session was consolidated: archived, out of the live turns
        assert m.get_messages("ancient", user_id="carol") == []
        assert [e.session_id for e in m.episodes("carol")] == ["ancient"]


def test_facts_episodes_working_memory_and_items_read_back(old: tuple[str, Path]) -> None:
    from langchain_tiered_memory import TieredMemoryStore

    with TieredMemory(old[1]) as m:
        facts = [f.text for f in m.facts("ana")]
        assert "User prefers green tea and pastéis de nata 🍵" in facts  # as updated
        # stored without a key (an edit did not give one then): in the slot its words name now
        assert {f.text: f.key for f in m.facts("ana")}["User prefers green tea and pastéis de nata 🍵"] == (
            "prefer:green tea and pastéis de nata 🍵")
        assert not any("Miau" in f for f in facts)  # deleted
        assert {c.action for c in m.fact_history("ana")} >= {"add", "edit", "delete"}
        assert [e.session_id for e in m.episodes("ana")] == ["trip"]
        wm = m.working_memory("open", user_id="ana")
        assert [i.text for i in wm.items()] == ["Looking for a hotel near the river in Porto 🏨"]
        assert wm.scratchpad.to_dict() == {"plan": {"city": "Porto", "días": 2}}
        store = TieredMemoryStore(m, fields=["text"])
        item = store.get(("ana", "memories"), "drink")
        assert item is not None and item.value == {"text": "Prefers green tea 🍵", "tags": ["drink"]}
        assert [r.key for r in store.search(("björn",), query="kottbullar", limit=1)] == ["food"]


def written_at(folder: Path) -> float:
    """When the old version wrote the fixture's working memory: make_fixture.py wrote it at the
    time it ran, and its importance decays by the hour (read at today's time, a few days on, the
    goal fell out of the context: a test that failed by the calendar)."""
    con = sqlite3.connect(folder / "records.sqlite3")
    try:
        return float(con.execute("SELECT max(created_at) FROM working_items").fetchone()[0])
    finally:
        con.close()


def test_old_store_is_searched_by_meaning_words_and_sessions(old: tuple[str, Path]) -> None:
    now = written_at(old[1]) + 60.0  # a minute after the old version wrote its last working item
    with TieredMemory(old[1], clock=lambda: now) as m:
        assert "crème brûlée" in m.search("creme brulee", user_id="ana", k=1)[0].text  # words, no accents
        assert "Göteborg" in m.search("Goteborg", user_id="björn", k=1)[0].text
        assert any("vegetarian" in h.text for h in m.search("what does she eat?", user_id="ana", k=3))
        assert m.search_sessions("the Porto trip in May", user_id="ana", k=1)[0].session_id == "trip"
        assert "green tea" in m.search_facts("drinks", user_id="ana", k=1)[0].fact.text
        text = m.build_context("hotel in Porto?", user_id="ana", session_id="open", max_tokens=600).to_text()
        assert "cavaquinho" in text and "hotel near the river" in text
        assert not any("Kraków" in h.text for h in m.search("Kraków", user_id="ana", k=5))  # carol's


def test_old_store_takes_writes_and_reopens_without_migrating_again(old: tuple[str, Path]) -> None:
    _, folder = old
    with TieredMemory(folder) as m:
        new = m.add_many([{"role": "user", "content": "I adopted a dog named Bolinha 🐶"}],
                         user_id="ana", session_id="open")
        assert m.search("my dog", user_id="ana", k=1)[0].id == new[0]
        episode = m.end_session("open", user_id="ana")  # a session the old version left open
        assert episode.session_id == "open" and episode.turn_count >= 3
        assert m.forget_user("björn") == 2
    applied = migrations(folder)
    with TieredMemory(folder) as m:
        assert m.search("Bolinha", user_id="ana", k=1)[0].id == new[0]
        assert m.search("Goteborg", user_id="björn", k=5) == []
    assert migrations(folder) == applied


def test_old_export_imports_into_a_new_store(tmp_path: Path) -> None:
    for version in VERSIONS:
        lines = exported(version)
        with TieredMemory(tmp_path / version) as m:
            assert m.import_jsonl(FIXTURES / version / "export.jsonl").imported == len(lines)
            got = [t for user, session in sorted({(x["user_id"], x["session_id"]) for x in lines})
                   for t in turns(m.get_messages(session, user_id=user))]
            assert sorted(got) == sorted(turns(lines))
            assert "crème brûlée" in m.search("creme brulee", user_id="ana", k=1)[0].text


def test_long_messages_indexed_before_chunking_get_their_chunks(tmp_path: Path, embedder: Embedder) -> None:
    # The first release indexed a long message as one vector; later ones add a vector per
    # chunk, which is how a passage deep inside it is found. Its index, as it left it: one
    # vector per indexed turn (the first release's default embedder, MiniLM).
    folder = load(FIRST_RELEASE, tmp_path / "old")
    con = sqlite3.connect(folder / "records.sqlite3")
    rows = con.execute("SELECT id, user_id, session_id, content, timestamp FROM messages"
                       " WHERE indexed = 1 AND duplicate_of IS NULL").fetchall()
    con.close()
    long_ids = {r[0] for r in rows if len(r[3]) > 1200}
    assert len(long_ids) == 1
    index = ChromaVectorIndex(str(folder / "chroma"))
    vectors = embed(embedder, [r[3] for r in rows])
    index.upsert([VectorItem(id=i, vector=v, user_id=u, session_id=s, timestamp=t)
                  for (i, u, s, _, t), v in zip(rows, vectors)])
    index.close()
    with TieredMemory(folder, embedder=embedder) as m:
        chunks = [message_of(i) for i in m.index.ids() if message_of(i)[1] is not None]
        assert {message for message, _ in chunks} == long_ids and len(chunks) > 1
        assert m.stats().indexed == len(rows) + 1  # and the duplicate: nothing is left pending
