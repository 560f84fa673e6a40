"""A store spanning months for the consolidation tests: sessions with their episodes and a few
hundred facts (near-duplicates and stale ones among them), written directly with old timestamps,
and the raw row counts the tests check. ``NOW`` is when this module was imported."""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

from time_support import DAY
from tiered_memory import TieredMemory

NOW = time.time()
OBJECTS = ["green tea", "jazz records", "mountain biking", "Rust programming", "sourdough baking", "chess openings",
           "Lisbon", "marathon training", "vintage cameras", "Korean dramas", "orchids", "sailing", "poetry",
           "board games", "espresso", "climbing", "birdwatching", "pottery", "astronomy", "salsa dancing",
           "woodworking", "knitting", "surfing", "opera", "origami"]
TEMPLATES = ["User enjoys {o}", "User owns a book about {o}", "User's sister dislikes {o}",
             "User wants to learn more about {o} next year", "User spent money on {o} in March",
             "User wrote a blog post on {o}", "User's team at work discussed {o}",
             "User gave a talk about {o}", "User avoids {o} on weekdays", "User met a friend through {o}"]


def store_transaction(memory: TieredMemory) -> Any:
    """One transaction on the memory's record store (SQLite or PostgreSQL), ``?`` placeholders."""
    return memory._layers.rows.transaction()


def count(memory: TieredMemory, sql: str, *params: Any) -> int:
    return int(memory._layers.rows.query(sql, params)[0][0])


def build_store(memory: TieredMemory, user: str = "u1", *, sessions: int = 200, templates: int = 6,
                seed: int = 7) -> dict[str, Any]:
    """Sessions over ~10 months with their episodes, plus ~200 facts, written directly with timestamps;
    their vectors are then derived by ``rebuild_index`` (one embedding pass)."""
    rnd = random.Random(seed)
    memory.working_memory("s-live", user_id=user).remember("current task", importance=0.9)
    info: dict[str, Any] = {"sessions": {}, "episodes": [], "popular": [], "uncovered": []}
    msgs = []
    for s in range(sessions):
        ts = NOW - (s * 1.5 + 0.5) * DAY
        msgs.append((f"sess-{s}", [
            {"role": "user", "content": f"Session {s}: let's review the {OBJECTS[s % 25]} plan, item {s}.",
             "timestamp": ts}]))
    with store_transaction(memory) as db:  # raw turns written directly (fast), then indexed by rebuild_index below
        for sid, rows in msgs:
            info["sessions"][sid] = [uuid.uuid4().hex for _ in rows]
            db.executemany(
                "INSERT INTO messages (id, user_id, session_id, role, content, metadata, timestamp, created_at)"
                " VALUES (?,?,?,?,?,'{}',?,?)",
                [(mid, user, sid, r["role"], r["content"], r["timestamp"], r["timestamp"])
                 for mid, r in zip(info["sessions"][sid], rows)])
    with store_transaction(memory) as db:
        seqs = dict(db.execute(f"SELECT id, {memory._layers.rows.message_order} FROM messages WHERE user_id=?",
                               (user,)).fetchall())
        for s, (sid, rows) in enumerate(msgs):
            if s in (1, 2, 3):  # left for the "sessions" step
                info["uncovered"].append(sid)
                continue
            ids = info["sessions"][sid]
            eid = uuid.uuid4().hex
            popular = s % 20 == 0
            body = {"entities": [], "decisions": [], "open_questions": [],
                    "key_facts": [f"User's project {s} depends on {OBJECTS[s // 20]}"] if popular else []}
            db.execute(
                "INSERT INTO episodes (id, user_id, session_id, summary, body, turn_count, start_ts, end_ts,"
                " source_ids, metadata, created_at, access_count) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (eid, user, sid, f"Reviewed the {OBJECTS[s % 25]} plan {s}", json.dumps(body), 1,
                 rows[0]["timestamp"], rows[-1]["timestamp"], json.dumps(ids), '{"method": "extractive"}',
                 rows[-1]["timestamp"], 5 if popular else rnd.randint(0, 2)))
            db.execute("INSERT INTO session_cursor VALUES (?,?,?)", (user, sid, max(seqs[i] for i in ids)))
            info["episodes"].append((eid, sid, rows[-1]["timestamp"]))
            if popular:
                info["popular"].append(eid)
        texts = [t.format(o=o) for t in TEMPLATES[:templates] for o in OBJECTS]  # 150 distinct facts
        dups = [t.upper() + "." for t in texts[::5]]  # 30 near-duplicates (the model is uncased)
        stale = [f"User once asked in passing about {o}" for o in OBJECTS[:20]]
        all_texts = texts + dups + stale
        for n, text in enumerate(all_texts):
            is_stale = n >= len(texts) + len(dups)
            updated = NOW - (400 * DAY if is_stale else rnd.uniform(0, 200) * DAY)
            db.execute(
                "INSERT INTO facts (id, user_id, type, text, confidence, source_ids, metadata, created_at,"
                " updated_at, valid_from) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (uuid.uuid4().hex, user, "fact", text, 0.1 if is_stale else 0.8, "[]", "{}", updated, updated,
                 updated))
    info.update(texts=texts, dups=dups, stale=stale)
    memory.rebuild_index()  # vectors of the turns and facts, derived from the rows, in batches
    return info
