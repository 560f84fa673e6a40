"""User isolation, property-based: many users, random operations, one shared store.

A hypothesis state machine adds messages, facts and episodes for users whose
ids differ only by case, a trailing space, a LIKE wildcard, a quote, a path or
an accent; every message carries a *codeword* unique to its user. No read
(search, build_context, export, get_messages, facts, episodes) may ever show
another user's codeword or ids, and after ``forget_user`` the user's id,
codeword and message ids appear nowhere: not in any table of the record store
(found by enumerating ``sqlite_master`` or PostgreSQL's catalog, so tables added
later are covered), not in any FTS index, not in the Chroma collection. The
machine runs on the embedded SQLite store and on PostgreSQL.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from tiered_memory import TieredMemory
from tiered_memory.store.sqlite import SQLiteRecordStore

BASE_IDS = ["alice", "Alice", "alice ", "al%", "a_ice", "bob", "bob'--", "c/../d", "用户", "e\u0301",
            "x; DROP TABLE messages; --"]
PHRASES = [
    "I moved to Lisbon last spring", "my sister works as a nurse", "we booked a flight to Nairobi",
    "I am allergic to peanuts", "the project deadline is Friday", "my favourite band is Radiohead",
    "I prefer tea over coffee", "our dog is called Biscuit",
]


def codeword(user_id: str) -> str:
    """A token unique to a user, findable by FTS and by substring."""
    return "cw" + hashlib.sha1(user_id.encode()).hexdigest()[:12]


def traces(memory: TieredMemory, user_id: str, ids: set[str]) -> list[str]:
    """Every place in the record store and vector index that still mentions the user."""
    word = codeword(user_id)
    found: list[str] = []

    def scan(name: str, rows: Iterable[tuple[Any, ...]]) -> None:
        for row in rows:
            for value in row:
                if not isinstance(value, str):
                    continue
                if value == user_id:
                    found.append(f"{name}: a row with the user id")
                elif word in value:
                    found.append(f"{name}: the user's text")
                elif any(i in value for i in ids):
                    found.append(f"{name}: a reference to one of the user's message ids")

    if isinstance(memory.store, SQLiteRecordStore):
        con = memory.store.conn
        with memory.store.lock:
            tables = con.execute("SELECT name, sql FROM sqlite_master WHERE type='table'").fetchall()
            for name, sql in tables:
                if sql and "USING FTS5" in sql.upper().replace("  ", " "):
                    # every token of the index, whatever tag or prefix it carries (the stemmer
                    # may trim the codeword's end, so its start is looked for)
                    con.execute(f'CREATE VIRTUAL TABLE IF NOT EXISTS temp."v_{name}" USING fts5vocab(main, "{name}", row)')
                    hits = con.execute(f'SELECT count(*) FROM temp."v_{name}" WHERE instr(term, ?) > 0',
                                       (word[:10],)).fetchone()[0]
                    if hits:
                        found.append(f"FTS index {name}: {hits} terms holding the codeword")
                    continue
                scan(name, con.execute(f'SELECT * FROM "{name}"'))
    else:  # PostgreSQL: every table of the schema; the tsvector columns are read as text
        for (name,) in memory.store.query(
                "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
                " AND relkind = 'r'"):
            scan(name, memory.store.query(f'SELECT * FROM "{name}"'))
    col = memory.index.collection  # type: ignore[attr-defined]
    left = col.get(where={"user_id": user_id}, include=[])["ids"]
    if left:
        found.append(f"Chroma: {len(left)} vectors with the user's id")
    if ids:
        left_ids = col.get(ids=sorted(ids), include=[])["ids"]
        if left_ids:
            found.append(f"Chroma: {len(left_ids)} of the user's message vectors")
    return found


class Isolation(RuleBasedStateMachine):
    """The model: which message ids and sessions each user owns."""

    memory: TieredMemory
    folder: Path
    examples = itertools.count()
    every_user: set[str] = set()  # across examples: all of them share the store
    owner: dict[str, str] = {}  # message id -> user id, across examples

    def __init__(self) -> None:
        super().__init__()
        self.n = next(self.examples)
        self.owned: dict[str, set[str]] = {}
        self.sessions: dict[tuple[str, str], list[str]] = {}
        self.forgotten: set[str] = set()

    def uid(self, base: str) -> str:
        user = f"x{self.n}-{base}"
        Isolation.every_user.add(user)
        return user

    def foreign(self, user: str, text: str) -> list[str]:
        return [u for u in Isolation.every_user if u != user and codeword(u) in text]

    def check_ids(self, user: str, ids: list[str]) -> None:
        for i in ids:
            other = Isolation.owner.get(i.split(":", 1)[-1])
            assert other in (None, user), f"{user!r} was shown {other!r}'s message {i}"

    # ---- writes ----------------------------------------------------------
    @rule(base=st.sampled_from(BASE_IDS), session=st.sampled_from(["s1", "s2"]),
          phrases=st.lists(st.sampled_from(PHRASES), min_size=1, max_size=3))
    def add(self, base: str, session: str, phrases: list[str]) -> None:
        user = self.uid(base)
        msgs = [{"role": "user" if j % 2 == 0 else "assistant", "content": f"{p} ({codeword(user)})"}
                for j, p in enumerate(phrases)]
        ids = self.memory.add_many(msgs, session_id=session, user_id=user)
        self.owned.setdefault(user, set()).update(ids)
        self.sessions.setdefault((user, session), []).extend(ids)
        Isolation.owner.update({i: user for i in ids})
        self.forgotten.discard(user)

    @rule(base=st.sampled_from(BASE_IDS), phrase=st.sampled_from(PHRASES))
    def add_fact(self, base: str, phrase: str) -> None:
        user = self.uid(base)
        fact = self.memory.add_fact(f"User says {phrase} {codeword(user)}", user_id=user)
        assert fact.user_id == user
        self.forgotten.discard(user)

    @rule(base=st.sampled_from(BASE_IDS), session=st.sampled_from(["s1", "s2"]))
    def end_session(self, base: str, session: str) -> None:
        user = self.uid(base)
        if (user, session) not in self.sessions:
            return
        episode = self.memory.end_session(session, user_id=user)
        assert not self.foreign(user, repr(episode))

    # ---- reads -----------------------------------------------------------
    @rule(base=st.sampled_from(BASE_IDS), lure=st.sampled_from(BASE_IDS), phrase=st.sampled_from(PHRASES))
    def search(self, base: str, lure: str, phrase: str) -> None:
        user = self.uid(base)
        # the query names another user's codeword, to lure keyword and vector matches
        hits = self.memory.search(f"{phrase} {codeword(self.uid(lure))}", user_id=user, k=20)
        assert {h.id for h in hits} <= self.owned.get(user, set())  # empty once forgotten
        assert not [h for h in hits if self.foreign(user, h.text)]
        found = self.memory.search_sessions(f"{phrase} {codeword(self.uid(lure))}", user_id=user, k=5)
        assert {h.id for f in found for h in f.hits} <= self.owned.get(user, set())
        assert {f.session_id for f in found} <= {s for (u, s) in self.sessions if u == user}

    @rule(base=st.sampled_from(BASE_IDS), lure=st.sampled_from(BASE_IDS), session=st.sampled_from(["s1", "s2"]))
    def build_context(self, base: str, lure: str, session: str) -> None:
        user = self.uid(base)
        ctx = self.memory.build_context(f"what about {codeword(self.uid(lure))}?", user_id=user, session_id=session)
        text = ctx.to_text() + json.dumps(ctx.to_messages(), ensure_ascii=False)
        assert not self.foreign(user, text), f"context of {user!r} shows {self.foreign(user, text)}"
        self.check_ids(user, [i.id for s in ctx.sections for i in s.items] + [i.id for i in ctx.recent])
        assert [i.id for i in ctx.recent] == self.sessions.get((user, session), [])[-len(ctx.recent):] \
            if ctx.recent else True

    @rule(base=st.sampled_from(BASE_IDS), session=st.sampled_from(["s1", "s2"]))
    def get_messages(self, base: str, session: str) -> None:
        user = self.uid(base)
        got = [m.id for m in self.memory.get_messages(session, user_id=user)]
        assert got == self.sessions.get((user, session), [])

    @rule(base=st.sampled_from(BASE_IDS))
    def export(self, base: str) -> None:
        user = self.uid(base)
        out = self.folder / f"export-{self.n}.jsonl"
        count = self.memory.export_jsonl(out, user_id=user)
        lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
        messages = [x for x in lines if x["type"] == "message"]
        assert count == len(lines) and len(messages) == len(self.owned.get(user, set()))
        assert {x["id"] for x in messages} == self.owned.get(user, set())
        # facts, episodes and items too: each line is this user's, and names no other user's codeword
        assert {(x.get("fact") or x.get("episode") or x.get("item") or x)["user_id"] for x in lines} <= {user}
        assert not [x for x in lines if x["type"] != "message" and self.foreign(user, json.dumps(x, ensure_ascii=False))]

    @rule(base=st.sampled_from(BASE_IDS), lure=st.sampled_from(BASE_IDS))
    def facts_and_episodes(self, base: str, lure: str) -> None:
        user = self.uid(base)
        query = f"Lisbon nurse {codeword(self.uid(lure))}"
        found: list[Any] = [*self.memory.facts(user, include_invalid=True), *self.memory.episodes(user),
                            *self.memory.search_facts(query, user_id=user, k=20),
                            *self.memory.search_episodes(query, user_id=user, k=20),
                            *self.memory.fact_history(user)]
        for obj in found:
            assert getattr(obj, "user_id", user) == user
            assert not self.foreign(user, repr(obj)), f"{user!r} was shown {obj!r}"

    # ---- erasure ---------------------------------------------------------
    @rule(base=st.sampled_from(BASE_IDS))
    def forget_user(self, base: str) -> None:
        user = self.uid(base)
        ids = self.owned.pop(user, set())
        removed = self.memory.forget_user(user)
        assert removed == len(ids)
        self.sessions = {k: v for k, v in self.sessions.items() if k[0] != user}
        left = traces(self.memory, user, ids)
        assert not left, f"forget_user({user!r}) left: {left}"
        self.forgotten.add(user)

@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def shared_memory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  embedder: Any) -> Iterator[TieredMemory]:
    folder = tmp_path_factory.mktemp("isolation")
    url = request.getfixturevalue("make_postgres_url")() if request.param == "postgres" else None
    with TieredMemory(folder / "store", embedder=embedder, record_store=url) as m:
        Isolation.memory = m
        Isolation.folder = folder
        yield m


def test_no_operation_crosses_users_and_forget_user_leaves_nothing(shared_memory: TieredMemory) -> None:
    run_state_machine_as_test(Isolation, settings=settings(
        max_examples=4, stateful_step_count=14, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    assert len(Isolation.every_user) > 5  # the machine did exercise many users


def test_forget_user_scrubs_the_database_files(tmp_path: Path, embedder: Any) -> None:
    """Deleted text must not linger in free pages or the WAL (secure_delete, FTS optimize)."""
    folder = tmp_path / "store"
    secret = "zanzibarquokka"
    with TieredMemory(folder, embedder=embedder) as m:
        old = time.time() - 90 * 86400  # old enough for consolidate to archive the raw turns
        m.add_many([{"role": "user", "content": f"my password hint is {secret} number {i}", "timestamp": old + i}
                    for i in range(30)], session_id="s", user_id="leaver")
        m.add("user", "an unrelated note from someone else", session_id="s", user_id="stayer")
        m.add_fact(f"User's password hint is {secret}", user_id="leaver")
        m.end_session("s", user_id="leaver")
        m.working_memory("s2", user_id="leaver").remember(f"scratch note {secret}")
        m.consolidate("leaver")
        archived = m.store.query("SELECT count(*) FROM messages_archive WHERE user_id='leaver'")[0][0]  # type: ignore[attr-defined]
        assert archived > 0, "consolidate archived nothing; the archive is not being exercised"
        assert m.facts("leaver") and m.episodes("leaver")
        m.forget_user("leaver")
        assert traces(m, "leaver", set()) == []
    raw = b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())
    assert secret.encode() not in raw, "the forgotten user's text is still in the files on disk"
