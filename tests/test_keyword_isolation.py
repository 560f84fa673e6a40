"""Keyword ranking of facts, episode key points and store items is the user's own: another
user's rows holding the same words change neither the order nor the scores of a user's
results (on SQLite each word is indexed with its user's tag, so BM25 counts a term's rows
within the user, as it does for turns; PostgreSQL's ``ts_rank`` reads one row at a time)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from langchain_tiered_memory import TieredMemoryStore
from tiered_memory import EpisodeConfig, MemoryConfig, TieredMemory
from tiered_memory.backends import open_layer_store
from tiered_memory.recall.query import keywords
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_layers import ITEM_MIGRATIONS as ITEM_SQLITE, LAYER_MIGRATIONS as LAYER_SQLITE

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

BOBS = ["User met Zorblax at the zoo in spring", "User met Quokkan"]
QUERY = "Zorblax Quokkan"


def others(word: str) -> list[str]:
    """Alice's rows: three naming ``word``. Two stores differ only in that word, so their row
    counts and lengths are the same, and bob's results may differ only by what her rows say."""
    return [f"User's neighbour {word} owns cat number {n}" for n in range(3)]


def write_episodes(memory: TieredMemory, tmp_path: Path, user: str, texts: list[str]) -> None:
    """One episode a text, its one key point, through a scoped import (ids and times as written)."""
    src = tmp_path / f"{user}-{len(texts)}-{id(memory)}.jsonl"
    lines = [json.dumps({"format": "tiered-memory/1", "type": "episode", "points": [text], "episode": {
        "id": f"{user}-ep{n}", "user_id": user, "session_id": "s", "summary": text, "turn_count": 1,
        "start": 1.7e9, "end": 1.7e9, "source_ids": [], "created_at": 1.7e9}}) for n, text in enumerate(texts)]
    src.write_text("\n".join(lines) + "\n")
    assert memory.import_jsonl(src, user_id=user).episodes_imported == len(texts)


def facts(memory: TieredMemory, tmp_path: Path) -> Callable[[str, list[str]], None]:
    def write(user: str, texts: list[str]) -> None:
        for text in texts:
            memory.add_fact(text, user_id=user)
    return write


def episodes(memory: TieredMemory, tmp_path: Path) -> Callable[[str, list[str]], None]:
    return lambda user, texts: write_episodes(memory, tmp_path, user, texts)


def items(memory: TieredMemory, tmp_path: Path) -> Callable[[str, list[str]], None]:
    store = TieredMemoryStore(memory)

    def write(user: str, texts: list[str]) -> None:
        for n, text in enumerate(texts):
            store.put((user, "notes"), f"k{n}", {"text": text})
    return write


def found(kind: str, memory: TieredMemory) -> list[Any]:
    """Bob's results for the query as a user sees them: order, scores, and the keyword signal."""
    if kind == "facts":
        hits = memory.search_facts(QUERY, user_id="bob", k=5)
        return [(h.fact.text, h.score, h.explanation["signals"].get("keyword")) for h in hits]
    if kind == "episodes":
        context = memory.build_context(QUERY, user_id="bob", session_id="s")
        return [(h.episode.id, h.score, h.matched) for h in memory.search_episodes(QUERY, user_id="bob")] + [
            (s.name, [(i.id, i.score) for i in s.items]) for s in context.sections]
    hits = memory.item_store().search(("bob",), query=QUERY, user_id="bob")
    adapter = TieredMemoryStore(memory).search(("bob",), query=QUERY)
    return [(h.item.key, h.score, h.explanation) for h in hits] + [(h.key, h.score) for h in adapter]


@pytest.mark.parametrize("kind, writer", [("facts", facts), ("episodes", episodes), ("items", items)])
def test_another_users_rows_with_the_same_words_never_move_a_users_keyword_ranking(
        make_memory: Callable[..., TieredMemory], tmp_path: Path, kind: str,
        writer: Callable[[TieredMemory, Path], Callable[[str, list[str]], None]]) -> None:
    config = MemoryConfig(episodes=EpisodeConfig(recency_weight=0.0))  # episode scores without the clock
    seen = []
    for name, word in (("same", "Quokkan"), ("other", "Brindlewick")):
        memory = make_memory(name, config=config)
        write = writer(memory, tmp_path)
        write("bob", BOBS)
        before = found(kind, memory)
        write("alice", others(word))
        after = found(kind, memory)
        assert [r[0] for r in after] == [r[0] for r in before]  # the order of bob's own results
        seen.append(after)
    same, other = seen
    assert same == other  # whether alice's rows name bob's words changes nothing bob sees


# ---- SQLite: the index's invariants, and a store of the schema before --------------------------------
TABLES = ("facts", "episode_points", "items")
RAW = {"facts": "INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
                " VALUES (?, ?, 'fact', ?, 1, 0, 0, 0)",
       "episode_points": "INSERT INTO episode_points (id, episode_id, user_id, text) VALUES (?, 'e1', ?, ?)",
       "items": "INSERT INTO items (id, user_id, ns_path, namespace, key, value, text, created_at, updated_at)"
                " VALUES (?1, ?2, ?2, '[]', ?1, '{}', ?3, 0, 0)"}
SEARCH = {"facts": "keyword_facts", "episode_points": "keyword_points", "items": "keyword_items"}
TEXTS = {"bob": ["Bob plays the violin on Sundays", "Bob's violin teacher lives in 北京烤鸭店", "Bob grows tomatoes"],
         "alice": ["Alice's violin is old", "Alice plays violin and cello", "Alice sold a violin"]}


def write_raw(store: SQLiteRecordStore) -> None:
    """Each user's texts into each layer table, as another writer would (the triggers index them)."""
    with store.transaction() as c:
        for table in TABLES:
            for user, texts in TEXTS.items():
                for n, text in enumerate(texts):
                    c.execute(RAW[table], (f"{table[0]}-{user}-{n}", user, text))


def terms(store: SQLiteRecordStore, table: str) -> set[str]:
    """The terms of ``table``'s FTS5 index, after FTS5's own checks (it raises on an index that
    does not match the ``keywords`` column, its content)."""
    with store.lock:
        store.conn.execute(f"INSERT INTO {table}_fts({table}_fts, rank) VALUES ('integrity-check', 1)")
        store.conn.execute(f"INSERT INTO {table}_fts({table}_fts) VALUES ('integrity-check')")
    with store.transaction() as c:
        c.execute(f"CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, {table}_fts, 'row')")
    try:
        return {r[0] for r in store.query("SELECT term FROM temp.vocab")}
    finally:
        with store.transaction() as c:
            c.execute("DROP TABLE temp.vocab")


def searched(store: SQLiteRecordStore, table: str, user: str, query: str) -> list[str]:
    return [i for i, _ in getattr(open_layer_store(store), SEARCH[table])(user, keywords(query), 10)]


def step_before_tags(steps: list[Any]) -> int:
    """Where the migration to per-user keywords is in a list of migrations."""
    return next(n for n, step in enumerate(steps) if getattr(step, "__qualname__", "").startswith("tagged_index"))


@pytest.mark.parametrize("table", TABLES)
def test_every_word_a_layer_table_indexes_carries_its_users_tag_whoever_writes(tmp_path: Path, table: str) -> None:
    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    try:
        open_layer_store(store)
        write_raw(store)
        bob, alice = store.tag("bob"), store.tag("alice")
        assert bob and alice and bob != alice
        assert {t for t in terms(store, table) if not t.startswith((bob, alice))} == set()
        assert {f"{bob}violin", f"{alice}violin", f"{bob}北京", f"{bob}烤鸭"} <= terms(store, table)
        assert searched(store, table, "bob", "烤鸭") == [f"{table[0]}-bob-1"]
        assert set(searched(store, table, "alice", "violins")) == {f"{table[0]}-alice-{n}" for n in range(3)}
        with store.transaction() as c:  # a text changed, a row given to another user, a row deleted
            c.execute(f"UPDATE {table} SET text = 'Alice tunes a viola' WHERE id = ?", (f"{table[0]}-alice-0",))
            c.execute(f"UPDATE {table} SET user_id = 'bob' WHERE id = ?", (f"{table[0]}-alice-1",))
            c.execute(f"DELETE FROM {table} WHERE id = ?", (f"{table[0]}-alice-2",))
        assert searched(store, table, "alice", "violin") == [] and searched(store, table, "alice", "viola")
        assert f"{table[0]}-alice-1" in searched(store, table, "bob", "cello")
        store.forget_user("alice")
        assert {t for t in terms(store, table) if t.startswith(alice)} == set()
    finally:
        store.close()


def test_a_store_of_the_schema_before_keeps_each_users_matches_and_loses_the_shared_counts(tmp_path: Path) -> None:
    """Facts, key points and items indexed untagged (every user's words counted together) are
    indexed again when the store opens: each user finds the same rows, now by tagged words."""
    path = tmp_path / "s.sqlite3"
    store = SQLiteRecordStore(path)
    store.migrate("layers", LAYER_SQLITE[:step_before_tags(LAYER_SQLITE)])
    store.migrate("items", ITEM_SQLITE[:step_before_tags(ITEM_SQLITE)])
    write_raw(store)
    words = ["violin", "tomatoes", "cello", "北京"]
    before = {(table, user, word): {r[0] for r in store.query(
        f"SELECT t.id FROM {table}_fts JOIN {table} t ON t.rowid = {table}_fts.rowid"
        f" WHERE {table}_fts MATCH ? AND t.user_id = ?", (f'"{word}"', user))}
        for table in TABLES for user in TEXTS for word in words}
    store.close()
    store = SQLiteRecordStore(path)
    try:
        open_layer_store(store)
        for (table, user, word), ids in before.items():
            assert set(searched(store, table, user, word)) == ids, (table, user, word)
        tags = (store.tag("bob"), store.tag("alice"))
        for table in TABLES:
            assert {t for t in terms(store, table) if not t.startswith(tags)} == set()  # (checked as it reads)
        with store.transaction() as c:
            c.execute("DELETE FROM facts WHERE id = 'f-bob-0'")
        assert "f-bob-0" not in searched(store, "facts", "bob", "violin") and terms(store, "facts")
    finally:
        store.close()
