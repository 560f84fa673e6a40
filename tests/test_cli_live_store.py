"""The CLI's read commands on a folder another process holds: they read the record store
read-only (no vector index, no write of any kind); its write commands are still refused."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.cli import main

# the application: opens the folder, seeds each tier, then writes on command until told to stop
APP = """
import sys, threading
from tiered_memory import StaticEmbedder, TieredMemory

memory = TieredMemory(sys.argv[1], embedder=StaticEmbedder())
memory.add_many([{"role": "user", "content": "I just moved to Lisbon and I am allergic to peanuts.",
                  "timestamp": 1_700_000_000},
                 {"role": "assistant", "content": "Noted, no peanuts.", "timestamp": 1_700_000_060}],
                session_id="s1", user_id="ana")
memory.end_session("s1", user_id="ana")
memory.working_memory("s2", user_id="ana").remember("booking a table for Friday", importance=0.9, type="goal")
memory.working_memory("s2", user_id="ana").scratchpad["step"] = 2
memory.add("user", "I collect typewriters", session_id="b1", user_id="ben")
memory.flush()
print("ready", flush=True)
written, stop, writer = 0, threading.Event(), None

def write():
    global written
    while not stop.is_set():
        memory.add("user", f"note {written} about the harbour", session_id="live", user_id="ana")
        written += 1

for line in sys.stdin:
    if line.strip() == "write":
        writer = threading.Thread(target=write)
        writer.start()
        print("writing", flush=True)
    elif line.strip() == "stop":
        stop.set()
        if writer is not None:
            writer.join()
        memory.close()
        print(f"closed {written}", flush=True)
        break
"""

# a process that only holds the folder's lock (an application of an older version, say)
LOCKER = """
import fcntl, sys
f = open(sys.argv[1] + "/.lock", "a+")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
"""


def run(*argv: str) -> tuple[int, str, str]:
    import io

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def start(script: str, folder: Path, ready: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", script, str(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == ready, proc.communicate()[1]
    return proc


def tell(proc: subprocess.Popen[str], command: str) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def fingerprint(folder: Path) -> dict[str, str]:
    """The record store's bytes: the database file and its WAL (none and empty are alike: a
    reader of a WAL database makes an empty one where there is none); the -shm is readers' own."""
    return {name: hashlib.sha256((folder / name).read_bytes() if (folder / name).exists() else b"").hexdigest()
            for name in ("records.sqlite3", "records.sqlite3-wal")}


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERED_MEMORY_EMBEDDER", "static")
    folder = tmp_path / "live"
    proc = start(APP, folder, "ready")
    yield folder, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_read_commands_work_beside_the_application_and_write_nothing(app, tmp_path):
    folder, proc = app
    mem = str(folder)
    before = fingerprint(folder)

    code, out, err = run("--path", mem, "stats", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert (stats["users"], stats["messages"], stats["vectors"], stats["read_only"]) == (2, 3, None, True)
    assert "read-only" in err and "another process" in err
    code, out, _ = run("--path", mem, "stats")
    assert code == 0 and "vectors: not available" in out

    code, out, err = run("--path", mem, "sessions", "--user", "ana")
    assert code == 0 and out.split()[:2] == ["s1", "2"], err
    code, out, _ = run("--path", mem, "facts", "--user", "ana")
    assert code == 0 and "User lives in Lisbon" in out and "User is allergic to peanuts" in out
    code, out, _ = run("--path", mem, "episodes", "--user", "ana")
    assert code == 0 and out.startswith("s1  1 turn  ") and "Lisbon" in out
    code, out, _ = run("--path", mem, "working", "--user", "ana", "--session", "s2", "--query", "dinner table")
    assert code == 0 and "[goal] booking a table for Friday" in out and 'scratchpad: {"step": 2}' in out

    code, out, err = run("--path", mem, "search", "allergic", "--user", "ana")
    assert code == 0, err
    assert "keyword-only" in out.splitlines()[0] and "allergic to peanuts" in out.splitlines()[1]
    code, out, _ = run("--path", mem, "search", "peanuts", "--user", "ana", "--json")
    hit = json.loads(out.splitlines()[0])
    assert code == 0 and "peanuts" in hit["text"] and "keyword-only" in hit["explanation"]["vectors"]
    code, out, _ = run("--path", mem, "search", "typewriters", "--user", "ana")
    assert code == 0 and "typewriters" not in out  # ben's, not ana's
    code, out, _ = run("--path", mem, "search", "peanuts", "--user", "ana", "--sessions")
    assert code == 0 and "keyword-only" in out.splitlines()[0] and "[s1]" in out.splitlines()[1]

    dump = tmp_path / "dump.jsonl"
    code, out, err = run("--path", mem, "export", str(dump))
    assert code == 0, err
    kinds = [json.loads(line)["type"] for line in dump.read_text().splitlines()]
    assert kinds.count("message") == 3 and {"fact", "episode", "working", "scratchpad"} <= set(kinds)

    code, _, err = run("--path", mem, "context", "where do I live?", "--user", "ana", "--session", "s2")
    assert code == 1 and "StoreLockedError" in err and "vector index" in err and "search" in err
    for command in (["import", str(dump), "--no-progress"], ["forget-user", "ana", "--yes"], ["rebuild-index"],
                    ["consolidate", "--user", "ana", "--no-progress"]):
        code, _, err = run("--path", mem, *command)
        assert code == 1 and "StoreLockedError" in err and "another process" in err, command

    assert fingerprint(folder) == before  # not a row, a migration, a meta value or an access count

    assert tell(proc, "write") == "writing"  # the application writes all along now
    for n in range(3):
        again = tmp_path / f"again{n}.jsonl"
        code, _, err = run("--path", mem, "export", str(again), "--user", "ana")
        assert code == 0, err
        ids = [json.loads(line)["id"] for line in again.read_text().splitlines()
               if json.loads(line)["type"] == "message"]
        assert len(ids) == len(set(ids)) >= 2
        code, out, err = run("--path", mem, "stats", "--json")
        assert code == 0 and json.loads(out)["messages"] >= 3, err
    said = tell(proc, "stop")
    assert said.startswith("closed ") and proc.wait(timeout=120) == 0
    written = int(said.split()[1])

    with sqlite3.connect(folder / "records.sqlite3") as db:  # no read counted an access
        assert db.execute("SELECT sum(access_count) FROM messages").fetchone()[0] == 0
        assert db.execute("SELECT sum(access_count) FROM facts").fetchone()[0] == 0
        assert db.execute("SELECT sum(access_count) FROM episodes").fetchone()[0] == 0
    with TieredMemory(folder, embedder=StaticEmbedder()) as memory:  # the application's data is intact
        assert memory.stats().messages == 3 + written
        assert {"User lives in Lisbon", "User is allergic to peanuts"} <= {f.text for f in memory.facts("ana")}

    fresh = str(tmp_path / "fresh")
    code, out, err = run("--path", fresh, "import", str(dump), "--no-progress")
    assert code == 0 and "imported 3 messages" in out and "0 invalid" in out, err
    code, out, _ = run("--path", fresh, "facts", "--user", "ana")
    assert code == 0 and "User lives in Lisbon" in out


def test_a_held_store_of_an_older_schema_is_refused_not_migrated(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERED_MEMORY_EMBEDDER", "static")
    folder = tmp_path / "old"
    with TieredMemory(folder, embedder=StaticEmbedder()) as memory:
        memory.add("user", "I live in Lisbon", session_id="s1", user_id="ana")
    with sqlite3.connect(folder / "records.sqlite3") as db:  # the last migration not yet applied
        db.execute("DELETE FROM schema_migrations WHERE name='core' AND version ="
                   " (SELECT max(version) FROM schema_migrations WHERE name='core')")
    db.close()
    before = fingerprint(folder)
    proc = start(LOCKER, folder, "locked")
    try:
        for command in (["stats"], ["sessions", "--user", "ana"], ["export", str(tmp_path / "d.jsonl")]):
            code, _, err = run("--path", str(folder), *command)
            assert code == 1 and "older" in err and "stop the application" in err, command
        assert not (tmp_path / "d.jsonl").exists()
        assert fingerprint(folder) == before
    finally:
        tell(proc, "")
        proc.wait(timeout=60)


def test_a_read_only_reader_of_a_closed_folder_leaves_it_as_it_found_it(tmp_path):
    """A ``ReadOnlyMemory`` of a folder no process held (the CLI's too, when the application
    closes between its lock check and its open) left ``records.sqlite3-wal`` and ``-shm``
    beside the database: SQLite makes them for a WAL reader and a read-only connection cannot
    remove them. The reader that made them now lets SQLite remove them as it closes; the
    database's bytes are untouched."""
    from tiered_memory.readonly import ReadOnlyMemory

    folder = tmp_path / "quiet"
    with TieredMemory(folder, embedder=StaticEmbedder()) as memory:
        memory.add("user", "I live in Lisbon", session_id="s1", user_id="ana")
    before = sorted(p.name for p in folder.iterdir())
    stored = hashlib.sha256((folder / "records.sqlite3").read_bytes()).hexdigest()
    with ReadOnlyMemory(folder) as reader:
        assert [h.text for h in reader.search("Lisbon", user_id="ana")] == ["I live in Lisbon"]
        assert reader.stats().messages == 1
    assert sorted(p.name for p in folder.iterdir()) == before
    assert hashlib.sha256((folder / "records.sqlite3").read_bytes()).hexdigest() == stored


def test_a_closed_read_only_memory_refuses_a_with_block(tmp_path):
    """``with reader:`` on a closed ``ReadOnlyMemory`` entered, and failed only at its first
    read; it now fails at its start, as ``TieredMemory``'s does."""
    from tiered_memory import UsageError
    from tiered_memory.readonly import ReadOnlyMemory

    folder = tmp_path / "m"
    TieredMemory(folder, embedder=StaticEmbedder()).close()
    reader = ReadOnlyMemory(folder)
    reader.close()
    with pytest.raises(UsageError, match="closed"):
        with reader:
            pass
