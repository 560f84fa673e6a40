"""The query plans of a user's duplicates on each database (``DuplicateScope.duplicates``).

What the duplicates read returns is conformance (``test_conformance.py``); how each database
reads them is its own: by the index on (user, original), by the session's index, never through
every duplicate of the user or a scan of the table (``bench/duplicate_scope.py`` measures the
cost when a planner chooses otherwise).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from test_conformance import msg


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Any]:
    from tiered_memory.store.sqlite import SQLiteRecordStore

    store = SQLiteRecordStore(tmp_path / "records.sqlite3")
    yield store
    store.close()


@pytest.fixture
def postgres_store(make_postgres_url: Any) -> Iterator[Any]:
    from tiered_memory.store.postgres import PostgresRecordStore

    store = PostgresRecordStore(str(make_postgres_url()), schema="t_" + uuid.uuid4().hex[:12])
    yield store
    store.close()


def copy_messages(conn: Any, rows: list[Any], duplicates: dict[str, str]) -> None:
    """The rows ``insert_messages(rows, indexed=True, duplicates=duplicates)`` writes, by one COPY:
    the plans are about the read, and 105,000 rows through the insert's statements took 21 s
    where the COPY takes 4 (the insert's own path is conformance's)."""
    columns = "id, user_id, session_id, role, content, metadata, timestamp, created_at, indexed, duplicate_of"
    with conn.cursor() as cur, cur.copy(f"COPY messages ({columns}) FROM STDIN") as copy:
        for m in rows:
            copy.write_row((m.id, m.user_id, m.session_id, m.role, m.content, json.dumps(m.metadata),
                            m.timestamp, m.timestamp, True, duplicates.get(m.id)))


def test_sqlite_reads_duplicates_by_index(sqlite_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A search of sessions reads the duplicates of the turns it found, a search of a session
    those of the session: SQLite looks them up by (user, original) and by (user, session),
    never through every duplicate of the user (the session's read took 160 ms, not 0.03, at
    20,000 duplicates when the planner chose the index on originals: bench/duplicate_scope.py);
    a filtered search those its filter takes, through the user's duplicates alone."""
    ran: list[tuple[str, list[Any]]] = []
    real = sqlite_store.query
    monkeypatch.setattr(sqlite_store, "query", lambda sql, params=(): ran.append((sql, list(params))) or real(sql, params))
    sqlite_store.duplicates("u1", originals=["a", "b"])
    sqlite_store.duplicates("u1", "s1")
    sqlite_store.duplicates("u1", filters={"k": "v", "role": "user"})  # the user's duplicates, not every row
    plans = [" ".join(str(r[-1]) for r in real("EXPLAIN QUERY PLAN " + sql, params)) for sql, params in ran]
    assert len(plans) == 3
    assert "messages_duplicate_of (user_id=? AND duplicate_of=?)" in plans[0], plans[0]
    assert "messages_user_session (user_id=? AND session_id=?)" in plans[1], plans[1]
    assert "messages_duplicate_of (user_id=? AND duplicate_of>?)" in plans[2], plans[2]


@pytest.mark.servers
@pytest.mark.slow
def test_postgres_reads_duplicates_by_index_at_100000_turns(postgres_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 100,000 turns of a user (19,996 of them duplicates of 20 texts, a quarter of the turns
    under {"kind": "note"}), analysed: PostgreSQL reads the duplicates of given originals and a
    filter's duplicates through the index on (user, original), a session's through the session's
    index, never by a scan of the table (the plans, with their times, are printed: pytest -s)."""
    rows = [msg(f"m{i:06d}", f"turn {i}" if i < 20 or i % 5 else f"turn {(i // 5) % 20}",
                session=f"s{i // 20}", t=float(i), role="user" if i % 2 else "assistant",
                metadata={"kind": "note" if (i // 20) % 4 == 0 else "chat"}) for i in range(100_000)]
    rows += [msg(f"x{i:05d}", f"other {i}", user="u2", session=f"s{i // 20}") for i in range(5_000)]
    dups = {f"m{i:06d}": f"m{(i // 5) % 20:06d}" for i in range(20, 100_000, 5)}
    postgres_store.write(lambda c: copy_messages(c, rows, dups))
    postgres_store.write(lambda c: c.execute("ANALYZE messages"))
    ran: list[tuple[str, list[Any]]] = []
    real = postgres_store.query
    monkeypatch.setattr(postgres_store, "query", lambda sql, params=(): ran.append((sql, list(params))) or real(sql, params))
    notes = {m.id for m in rows if m.metadata.get("kind") == "note"}
    assert set(postgres_store.duplicates("u1", originals=["m000003", "m000007"])) == {
        d for d, o in dups.items() if o in ("m000003", "m000007")}
    assert set(postgres_store.duplicates("u1", "s100")) == {"m002000", "m002005", "m002010", "m002015"}
    assert set(postgres_store.duplicates("u1", filters={"kind": "note"})) == set(dups) & notes
    plans = ["\n".join(str(r[0]) for r in real("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)) for sql, params in ran]
    for (sql, _), plan in zip(ran, plans):
        print(f"{sql}\n{plan}\n")
    assert "messages_duplicate_of" in plans[0] and "messages_user_session" in plans[1], plans
    assert "messages_duplicate_of" in plans[2], plans[2]
    assert not any("Seq Scan on messages" in p for p in plans), plans
