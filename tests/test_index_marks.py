"""The marks that say a row's vectors are written (a fact's or an episode's ``indexed``, set
once its vectors are in the index) need no sync of their own on SQLite, as a turn's do not
(``SQLiteRecordStore.mark_indexed``): one lost to a power cut leaves the row pending, and the
next open writes its vectors again (an idempotent upsert). The row itself is committed durably.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from tiered_memory import TieredMemory
from tiered_memory.store.sqlite_db import register_functions

TURNS = [{"role": "user", "content": "I started cello lessons with a teacher from Porto."},
         {"role": "assistant", "content": "Lovely: how are the lessons going?"},
         {"role": "user", "content": "Slowly, but I practise every evening after work."}]


def commits(memory: TieredMemory, action: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """Each transaction ``action`` commits on the store's connection, with the ``synchronous``
    level it committed under (SQLite syncs the WAL at a commit under FULL, not under NORMAL):
    the statements the connection ran, replayed from its trace."""
    conn: sqlite3.Connection = memory.store.conn  # type: ignore[attr-defined]
    level = {1: "NORMAL", 2: "FULL"}[conn.execute("PRAGMA synchronous").fetchone()[0]]
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        action()
    finally:
        conn.set_trace_callback(None)
    out: list[tuple[str, list[str]]] = []
    current: list[str] = []
    for sql in seen:
        said = sql.strip().upper().replace(" ", "")
        if said.startswith("PRAGMASYNCHRONOUS="):
            level = said.split("=", 1)[1]
        elif said == "COMMIT":
            out.append((level, current))
            current = []
        else:
            current.append(sql)
    return out


def levels(found: list[tuple[str, list[str]]], statement: str) -> list[str]:
    return [level for level, sql in found if any(statement in s for s in sql)]


def test_a_fact_and_an_episode_are_stored_durably_and_marked_indexed_without_a_sync(memory: TieredMemory) -> None:
    memory.add_fact("User drinks green tea", user_id="other")  # the layer tables made (their migrations)
    found = commits(memory, lambda: memory.add_fact("User plays the cello", user_id="u"))
    assert levels(found, "INSERT INTO facts (") == ["FULL"]
    assert levels(found, "UPDATE facts SET indexed") == ["NORMAL"]
    memory.add_many(TURNS, session_id="s", user_id="u")
    found = commits(memory, lambda: memory.end_session("s", user_id="u"))
    assert levels(found, "INSERT INTO episodes (") == ["FULL"]
    assert levels(found, "UPDATE episodes SET indexed") == ["NORMAL"]
    # the store's default is back for what follows
    assert memory.store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # type: ignore[attr-defined]


def test_a_mark_lost_to_a_power_cut_is_redone_by_the_next_open(make_memory: Callable[..., TieredMemory]) -> None:
    m = make_memory("m")
    fact = m.add_fact("User plays the cello", user_id="u")
    m.add_many(TURNS, session_id="s", user_id="u")
    episode = m.end_session("s", user_id="u")
    wanted = m.index.ids("u")
    assert f"fact:{fact.id}" in wanted and any(i.startswith(f"ep:{episode.id}:") for i in wanted)
    path = m.store.path  # type: ignore[attr-defined]
    m.close()
    with sqlite3.connect(path) as raw:  # the marks' commits lost: the rows read pending again
        register_functions(raw)
        raw.execute("UPDATE facts SET indexed = FALSE")
        raw.execute("UPDATE episodes SET indexed = FALSE")
    raw.close()
    again = make_memory("m")
    assert again.store.query("SELECT count(*) FROM facts WHERE NOT indexed")[0][0] == 0  # type: ignore[attr-defined]
    assert again.store.query("SELECT count(*) FROM episodes WHERE NOT indexed")[0][0] == 0  # type: ignore[attr-defined]
    assert again.index.ids("u") == wanted  # written again over themselves: nothing doubled, nothing missing
    hit = again.search_facts("which instrument does the user play?", user_id="u", k=1)[0]
    assert hit.fact.id == fact.id and "vector" in hit.explanation["signals"]
