"""User isolation on the paths the state machine of ``test_isolation.py`` does not reach:
message ids reused across users (ids may be chosen by the caller), the background writes
of access counts, the keyword index's per-user tags, and the adapters' choice of user."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import pytest

from time_support import DAY
from tiered_memory import TieredMemory
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_schema import MIGRATIONS
from tiered_memory.store.text_search import _WORD, FTS5_SPLITTING_LETTERS, LENGTH_PAD
from tiered_memory.types import StoredMessage

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _access_counts(memory: TieredMemory, message_id: str) -> list[tuple[str, int]]:
    mark = "?" if memory.store.__class__.__name__.startswith("SQLite") else "%s"
    return [(r[0], int(r[1])) for r in memory.store.query(  # type: ignore[attr-defined]
        f"SELECT user_id, access_count FROM messages WHERE id = {mark}", (message_id,))]


def test_an_access_noted_for_one_user_never_counts_on_another_users_message_with_the_same_id(
        memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "I keep bees on the roof", "id": "m1"}],
                    session_id="s", user_id="ana")
    assert [h.id for h in memory.search("bees on the roof", user_id="ana")] == ["m1"]  # noted, written later
    memory.forget("m1", user_id="ana")
    # the id is free again, and another user's app chooses it for its own message
    memory.add_many([{"role": "user", "content": "Bo keeps bees in the garden", "id": "m1"}],
                    session_id="s", user_id="bo")
    memory.flush()  # the noted access is written now
    assert _access_counts(memory, "m1") == [("bo", 0)]


SECRET = "the secret is under the blue flowerpot by the shed door"
# each a word to Python, two to FTS5: the second names users 1 to 3 and "secret"
FORGED = " ".join(f"x{sign}{n}qsecret" for sign in ("\u19b0", "\u19c8", "\u1cf2") for n in range(1, 4))


def test_no_text_of_one_user_reaches_another_users_keyword_matches(memory: TieredMemory) -> None:
    # SQLite's keyword index tags each word with its user's number ("2q" + "secret"). A letter
    # Python counts as part of a word but FTS5 splits at (New Tai Lue and Vedic signs, which
    # SQLite's Unicode tables still call marks) must not let a text forge another user's tag
    memory.add_many([{"role": "user", "content": FORGED} for _ in range(30)], session_id="s", user_id="mallory")
    memory.add("user", SECRET, session_id="s", user_id="bo")
    found = memory.store.keyword_search("bo", ["secret"], k=3)
    assert [memory.store.get_by_ids("bo", [i])[i].content for i, _ in found] == [SECRET]


def test_a_store_indexed_before_loses_the_forged_words_when_it_opens(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SQLiteRecordStore(path)
    store.insert_messages([StoredMessage(id=f"m{n}", user_id="mallory" if n else "bo", session_id="s", role="user",
                                         content=FORGED if n else SECRET, metadata={}, timestamp=float(n))
                           for n in range(30)])
    store.close()
    con = sqlite3.connect(path, isolation_level=None)  # the keywords as earlier versions wrote them
    tags = dict(con.execute("SELECT user_id, tag FROM user_tags").fetchall())
    for rowid, user, content in con.execute("SELECT rowid, user_id, content FROM messages").fetchall():
        tag = f"{tags[user]}q"
        old = " ".join([tag] * LENGTH_PAD + [tag + w for w in re.findall(r"[^\W_]+", content)])
        con.execute("UPDATE messages SET keywords=? WHERE rowid=?", (old, rowid))
    split_step = next(n for n, step in enumerate(MIGRATIONS, 1) if FTS5_SPLITTING_LETTERS in str(step))
    con.execute("DELETE FROM schema_migrations WHERE name='core' AND version>=?", (split_step,))
    con.close()
    store = SQLiteRecordStore(path)
    try:
        assert store.keyword_search("bo", ["secret"], k=3)[0][0] == "m0"
    finally:
        store.close()


def test_fts5_splits_no_word_the_keyword_index_writes() -> None:
    """Every character the index reads as part of a word is one FTS5's tokenizer (SQLite's
    own Unicode tables) keeps inside a token, on the SQLite in use."""
    con = sqlite3.connect(":memory:")
    con.execute("CREATE VIRTUAL TABLE f USING fts5(t, tokenize='porter unicode61')")
    letters = [chr(c) for c in range(0x80, 0x110000) if not 0xD800 <= c < 0xE000 and _WORD.fullmatch(chr(c))]
    split = []
    for start in range(0, len(letters), 5000):
        part = letters[start:start + 5000]
        con.execute("DELETE FROM f")
        con.executemany("INSERT INTO f(rowid, t) VALUES (?, ?)", [(n, f"x{c}2qz") for n, c in enumerate(part)])
        split += [part[n] for (n,) in con.execute("SELECT rowid FROM f WHERE f MATCH '\"2qz\"'")]
    assert len(letters) > 100_000 and split == []


def test_an_imported_episode_citing_another_users_turn_never_drops_that_turns_vector(
        memory: TieredMemory, tmp_path: Path) -> None:
    # an episode's source ids are data a scoped import takes as written: consolidate, archiving
    # the turns of an old episode, must remove the vectors of its own user's turns only
    memory.add_many([{"role": "user", "content": "My locker code is 4417", "id": "slack:C1:100"}],
                    session_id="s", user_id="ana")
    old = time.time() - 60 * DAY
    episode = {"id": "ep-1", "user_id": "mallory", "session_id": "m", "summary": "a chat", "turn_count": 1,
               "start": old, "end": old, "source_ids": ["slack:C1:100"], "created_at": old}
    src = tmp_path / "crafted.jsonl"
    src.write_text(json.dumps({"format": "tiered-memory/1", "type": "episode", "episode": episode,
                               "points": ["a chat"]}) + "\n")
    assert memory.import_jsonl(src, user_id="mallory").episodes_imported == 1
    assert memory.consolidate("mallory").compressed == 1
    assert "slack:C1:100" in memory.index.ids()
    hit = memory.search("locker code", user_id="ana")[0]
    assert hit.id == "slack:C1:100" and hit.explanation["signals"]["vector"]["rank"] == 1
