"""The CLI on a memory whose vectors an application's own embedder made: the commands that only
read rows (``stats``, ``sessions``, ``facts``, ``episodes``, ``working``, ``export``) work without
it, reading the record store read-only; the commands that embed (or write) say to pass it as
``--embedder MODULE:FACTORY``; with it, the memory opens whole. Nothing is ever re-embedded."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tiered_memory import TieredMemory
from tiered_memory.cli import main

EMBEDDERS = '''
from tiered_memory import StaticEmbedder

class TeamEmbedder(StaticEmbedder):
    """An application's own embedder (the static table under its own name)."""

    @property
    def name(self):
        return "team-embedder-v2"

def make():
    return TeamEmbedder()

NOT_CALLABLE = 3

def not_an_embedder():
    return "hello"
'''

ROWS = [("ana", "user", "I am training for a triathlon in September."),
        ("ana", "assistant", "Great goal! How is your swimming?"),
        ("ben", "user", "I collect vintage typewriters, mostly Olivettis.")]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


def fingerprint(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith("-shm") and p.name != ".lock"}


def recorded_embedder(folder: Path) -> str:
    with sqlite3.connect(folder / "records.sqlite3") as db:
        value = db.execute("SELECT value FROM meta WHERE key='embedder'").fetchone()[0]
    db.close()
    return str(value)


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A memory folder an application made with its own embedder, ``team_embedders:make``, a
    module in the current folder (the CLI imports from there, as ``python -m`` would)."""
    (tmp_path / "team_embedders.py").write_text(EMBEDDERS, encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        make = importlib.import_module("team_embedders").make
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("team_embedders")  # the CLI must find it itself
    folder = tmp_path / "mem"
    with TieredMemory(folder, embedder=make()) as memory:
        for i, (user, role, text) in enumerate(ROWS):
            memory.add(role, text, session_id=f"{user}-s1", user_id=user, timestamp=1_700_000_000 + i)
        memory.working_memory("ana-s1", user_id="ana").remember("booking a pool lane for Friday", importance=0.9,
                                                                type="goal")
    assert recorded_embedder(folder) == "team-embedder-v2"
    monkeypatch.chdir(tmp_path)
    yield folder
    sys.modules.pop("team_embedders", None)


def test_read_commands_work_without_the_embedder_and_write_nothing(team: Path, tmp_path: Path) -> None:
    before = fingerprint(team)
    code, out, err = run("--path", str(team), "stats", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert (stats["users"], stats["messages"], stats["vectors"], stats["read_only"]) == (2, 3, None, True)
    assert "team-embedder-v2" in err and "--embedder" in err  # the note: why read-only, how to open it whole
    code, out, _ = run("--path", str(team), "stats")
    assert code == 0 and "vectors: not available" in out and "--embedder" in out

    code, out, err = run("--path", str(team), "sessions", "--user", "ana")
    assert code == 0 and out.split()[:2] == ["ana-s1", "2"], err
    for command in (["facts", "--user", "ana"], ["episodes", "--user", "ana"],
                    ["working", "--user", "ana", "--session", "ana-s1"]):
        code, _, err = run("--path", str(team), *command)
        assert code == 0, (command, err)
    dump = tmp_path / "again.jsonl"
    code, _, err = run("--path", str(team), "export", str(dump))
    assert code == 0, err
    assert sum(json.loads(line)["type"] == "message" for line in dump.read_text().splitlines()) == 3
    assert fingerprint(team) == before  # nothing re-embedded, migrated or marked
    assert recorded_embedder(team) == "team-embedder-v2"


@pytest.mark.parametrize("command", [
    ["search", "triathlon", "--user", "ana"],
    ["search", "triathlon", "--user", "ana", "--sessions"],
    ["context", "what am I training for?", "--user", "ana", "--session", "ana-s1"],
    ["working", "--user", "ana", "--session", "ana-s1", "--query", "sport"],
    ["rebuild-index"],
    ["consolidate", "--user", "ana", "--no-progress"],
    ["forget-user", "ben", "--yes"],
])
def test_commands_that_embed_or_write_name_the_embedder_option(team: Path, command: list[str]) -> None:
    before = fingerprint(team)
    code, out, err = run("--path", str(team), *command)
    assert code == 2, out + err
    assert "team-embedder-v2" in err and "--embedder MODULE:FACTORY" in err, err
    assert "StaticEmbedder" not in err  # not the library's hint to re-embed with the default
    assert fingerprint(team) == before
    assert recorded_embedder(team) == "team-embedder-v2"


def test_with_the_embedder_option_the_memory_opens_whole(team: Path) -> None:
    code, out, err = run("--path", str(team), "--embedder", "team_embedders:make", "search", "which sport?",
                         "--user", "ana")
    assert code == 0 and "triathlon" in out.splitlines()[0], err
    code, out, err = run("--path", str(team), "stats", "--json", "--embedder", "team_embedders:make")
    stats = json.loads(out)
    assert code == 0 and stats["vectors"] == 3 and stats["read_only"] is False, err
    assert recorded_embedder(team) == "team-embedder-v2"


@pytest.mark.parametrize("spec, fragment", [
    ("team_embedders", "MODULE:FACTORY"),
    ("team_embedders:", "MODULE:FACTORY"),
    ("no_such_module_here:make", "cannot import 'no_such_module_here'"),
    ("team_embedders:missing", "has no 'missing'"),
    ("team_embedders:NOT_CALLABLE", "not callable"),
    ("team_embedders:not_an_embedder", "returned a str, not an embedder"),
])
def test_a_bad_embedder_option_is_a_usage_error(team: Path, spec: str, fragment: str) -> None:
    before = fingerprint(team)
    code, _, err = run("--path", str(team), "--embedder", spec, "stats")
    assert code == 2 and fragment in err and "--embedder" in err, err
    assert fingerprint(team) == before


LOCKER = """
import fcntl, sys
f = open(sys.argv[1] + "/.lock", "a+")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
"""


def test_beside_the_application_reads_need_no_embedder_and_the_option_ranks_working_memory(team: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(team)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    try:
        code, out, err = run("--path", str(team), "search", "triathlon", "--user", "ana")
        assert code == 0 and "keyword-only" in out and "triathlon" in out, err
        code, out, err = run("--path", str(team), "working", "--user", "ana", "--session", "ana-s1")
        assert code == 0 and "[goal] booking a pool lane" in out, err
        code, _, err = run("--path", str(team), "working", "--user", "ana", "--session", "ana-s1", "--query", "x")
        assert code == 2 and "--embedder MODULE:FACTORY" in err, err
        code, out, err = run("--path", str(team), "--embedder", "team_embedders:make", "working", "--user", "ana",
                           "--session", "ana-s1", "--query", "x")
        assert code == 0 and "[goal] booking a pool lane" in out, err
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
