"""The tiered-memory command line: every subcommand, usage errors (exit 2), no tracebacks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from cli_support import run

from tiered_memory.cli import main


@pytest.fixture
def dump(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [
        {"type": "message", "id": f"m{i}", "user_id": user, "session_id": f"{user}-s1", "role": role,
         "content": text, "metadata": {"n": i}, "timestamp": 1_700_000_000 + i}
        for i, (user, role, text) in enumerate([
            ("ana", "user", "I am training for a triathlon in September."),
            ("ana", "assistant", "Great goal! How is your swimming?"),
            ("ana", "user", "Swimming is my weakest leg; I can do 800 metres."),
            ("ben", "user", "I collect vintage typewriters, mostly Olivettis."),
        ])
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_demo_tells_the_story_of_the_tiers_and_its_claims_hold():
    code, out, err = run("demo")
    assert code == 0, out + err  # the demo checks its own claims: exit 1 names the one that failed
    assert "not as expected" not in out and "claims did not hold" not in out
    chapters = [line.split(". ", 1)[1] for line in out.splitlines() if line[:3].rstrip(". ").isdigit()]
    assert [c.split()[0] for c in chapters] == [
        "Two", "The", "Recall,", "end_session", "Facts:", "Working", "build_context", "consolidate:",
        "Isolation:", "Restart:"]
    assert "28 messages stored" in out and "why: meaning: cosine" in out
    assert "evicted, a whole turn" in out and "invalidate 'User lives in Lisbon'" in out
    assert "dropped" in out and "over budget" in out and "0 leaks" in out


def test_import_search_stats_export_forget_rebuild(tmp_path, dump, embedder):
    mem = str(tmp_path / "mem")
    code, out, err = run("--path", mem, "import", str(dump))
    assert code == 0, err
    assert "imported 4 messages" in out

    code, out, _ = run("search", "which sport am I training for?", "--user", "ana", "--path", mem)
    assert code == 0 and "triathlon" in out.splitlines()[0]
    assert "typewriter" not in out

    code, out, _ = run("--path", mem, "search", "swimming", "--user", "ana", "-k", "1", "--json")
    hit = json.loads(out.splitlines()[0])
    assert code == 0 and len(out.splitlines()) == 1 and hit["id"] == "m2" and hit["metadata"] == {"n": 2}

    code, out, _ = run("--path", mem, "search", "swimming", "--user", "ana", "--sessions", "--json")
    found = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [f["session_id"] for f in found] == ["ana-s1"] and found[0]["best"]["id"] == "m2"
    code, out, _ = run("--path", mem, "search", "typewriters", "--user", "ben", "--sessions")
    assert code == 0 and out.splitlines()[0].startswith("1. ") and "[ben-s1]" in out and "Olivettis" in out

    code, out, _ = run("--path", mem, "stats", "--json")
    stats = json.loads(out)
    assert code == 0 and (stats["users"], stats["messages"], stats["vectors"]) == (2, 4, 4)

    exported = tmp_path / "ana.jsonl"
    code, out, _ = run("--path", mem, "export", str(exported), "--user", "ana")
    assert code == 0 and "exported 3 lines" in out
    assert [json.loads(line)["id"] for line in exported.read_text().splitlines()] == ["m0", "m1", "m2"]

    code, out, _ = run("--path", mem, "rebuild-index")
    assert code == 0 and "4 vectors" in out

    code, out, err = run("--path", mem, "forget-user", "ana")
    assert code == 2 and "--yes" in err
    code, out, _ = run("--path", mem, "forget-user", "ana", "--yes")
    assert code == 0 and "3 messages removed" in out
    code, out, _ = run("--path", mem, "stats")
    assert code == 0 and "messages: 1" in out


def test_import_of_a_malformed_file_reports_lines_and_imports_nothing(tmp_path, dump, embedder):
    """A refused import into a new folder left that folder behind, an empty memory (a store, an
    index and a lock), so the next `stats` there read an empty memory instead of saying there
    is none: what the import made is removed, and the message says so. A folder that was there
    before is the user's and stays, with what it held."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(dump.read_text() + "{oops\n", encoding="utf-8")
    mem = tmp_path / "new" / "mem"  # its parent is made too
    code, out, err = run("--path", str(mem), "import", str(bad), "--no-progress")
    assert code == 2 and "line 5" in err and "nothing imported" in err
    assert f"{tmp_path / 'new'}, made for this import, was removed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "chats.jsonl"]
    code, out, err = run("--path", str(mem), "stats", "--json")
    assert code == 2 and "no memory at" in err

    code, out, _ = run("--path", str(mem), "import", str(dump), "--no-progress")
    assert code == 0 and "imported 4 messages" in out
    code, out, err = run("--path", str(mem), "import", str(bad), "--no-progress")
    assert code == 2 and "nothing imported" in err and "removed" not in err
    code, out, _ = run("--path", str(mem), "stats", "--json")
    assert json.loads(out)["messages"] == 4
    code, out, _ = run("--path", str(tmp_path / "m2"), "import", str(bad), "--skip-invalid", "--no-progress")
    assert code == 0 and "imported 4 messages" in out and "line 5" in out


def test_a_refused_import_into_an_empty_folder_leaves_it_empty(tmp_path, dump):
    """A folder made beforehand (`mkdir mem`, a deployment's volume) held an empty memory after a
    refused import (records.sqlite3, chroma, .lock), which `stats` then read as a memory with
    nothing in it: what the import made in it is removed, and the folder stays as it was."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(dump.read_text() + "{oops\n", encoding="utf-8")
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / ".gitkeep").write_text("")
    code, _, err = run("--path", str(mem), "import", str(bad), "--no-progress")
    assert code == 2 and "line 5" in err and "nothing imported" in err
    assert f"the memory made in {mem} for this import was removed" in err
    assert sorted(p.name for p in mem.iterdir()) == [".gitkeep"]
    code, _, err = run("--path", str(mem), "stats")
    assert code == 2 and "no memory at" in err


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="a pipe named by a path: /dev/fd")
def test_an_export_read_from_a_pipe_is_imported(tmp_path, dump, monkeypatch):
    """`tiered-memory import <(gunzip -c dump.jsonl.gz)` or `import /dev/stdin < dump.jsonl` said
    "cannot read /dev/fd/63: no such file": the CLI took whatever was not a regular file for a
    missing one, and counted the lines for its progress bar with a first read, which a pipe
    cannot give twice. A pipe is read once, by the import itself (import_jsonl reads a file once)."""
    monkeypatch.setenv("TIERED_MEMORY_EMBEDDER", "static")
    r, w = os.pipe()
    os.write(w, dump.read_bytes())  # four lines: well within a pipe's buffer, so no writer thread
    os.close(w)
    try:
        code, out, err = run("--path", str(tmp_path / "mem"), "import", f"/dev/fd/{r}", "--no-progress")
    finally:
        os.close(r)
    assert code == 0, err
    assert "imported 4 messages" in out


@pytest.mark.parametrize("argv, fragment", [
    ([], "required"),
    (["fly"], "invalid choice"),
    (["search", "x"], "--user"),
    (["search", "x", "--user", "u", "-k", "many"], "invalid int"),
])
def test_argument_errors_exit_2(argv, fragment, capsys):
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_usage_errors_exit_2_with_a_clear_message(tmp_path, embedder, monkeypatch):
    nowhere = str(tmp_path / "nowhere")
    code, _, err = run("--path", nowhere, "stats")
    assert code == 2 and "no memory at" in err
    monkeypatch.setenv("TIERED_MEMORY_RECORD_STORE", "sqlite")  # the default, named: still a folder store
    code, _, err = run("--path", nowhere, "stats")
    assert code == 2 and "no memory at" in err
    monkeypatch.delenv("TIERED_MEMORY_RECORD_STORE")
    assert not os.path.exists(nowhere)  # a read command creates nothing

    code, _, err = run("--path", nowhere, "import", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such file" in err
    code, _, err = run("--path", nowhere, "import", str(tmp_path))  # said "no such file" of a folder
    assert code == 2 and f"cannot read {tmp_path}: it is a folder; name the .jsonl file" in err

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code, _, err = run("--path", str(a_file), "stats")
    assert code == 2 and "is a file" in err

    code, _, err = run("--path", str(tmp_path / "m"), "import", str(a_file), "--no-progress")
    assert code == 2 and "line 1" in err and "was removed" in err
    from tiered_memory import TieredMemory

    TieredMemory(tmp_path / "m", embedder=embedder).close()

    code, _, err = run("--path", str(tmp_path / "m"), "search", "q", "--user", "u", "-k", "0")
    assert code == 2 and "-k must be at least 1" in err

    code, _, err = run("--path", str(tmp_path / "m"), "search", "q", "--user", "")
    assert code == 2 and "user_id" in err

    code, _, err = run("--path", str(tmp_path / "m"), "search", "q", "--user", "u", "--sessions", "--session", "s")
    assert code == 2 and "leave out --session" in err


def test_runtime_failures_exit_1_with_the_error_type(make_memory, tmp_path):
    held = make_memory("held")
    held.add("user", "held open", session_id="s", user_id="u")
    code, _, err = run("--path", str(tmp_path / "held"), "stats")
    assert code == 1 and "StoreLockedError" in err and "already open in this process" in err and "close()" in err

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "records.sqlite3").write_bytes(b"garbage" * 100)
    code, _, err = run("--path", str(corrupt), "stats")
    assert code == 1 and "CorruptStoreError" in err


def test_module_entry_points_run_without_tracebacks(tmp_path):
    env = {**os.environ, "TIERED_MEMORY_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "tiered_memory", "--help"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "rebuild-index" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "tiered_memory.cli", "stats"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "no memory at" in proc.stderr and str(tmp_path / "home") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_cli_looks_inside_every_tier(tmp_path, embedder):
    from tiered_memory import TieredMemory

    folder = tmp_path / "mem"
    with TieredMemory(folder, embedder=embedder) as memory:
        memory.add_many([
            {"role": "user", "content": "I just moved to Lisbon and I am allergic to peanuts.",
             "timestamp": 1_700_000_000},
            {"role": "assistant", "content": "Noted, no peanuts.", "timestamp": 1_700_000_060},
        ], session_id="s1", user_id="ana")
        memory.end_session("s1", user_id="ana")
        memory.add_many([{"role": "user", "content": "I moved to Porto last week.", "timestamp": 1_700_100_000}],
                        session_id="s2", user_id="ana")
        memory.end_session("s2", user_id="ana")
        memory.working_memory("s3", user_id="ana").remember("booking a table for Friday", importance=0.9,
                                                            type="goal")
        memory.working_memory("s3", user_id="ana").scratchpad["step"] = 2
        memory.add("user", "I collect typewriters", session_id="b1", user_id="ben")
    mem = str(folder)

    code, out, err = run("--path", mem, "sessions", "--user", "ana")
    assert code == 0, err
    assert [line.split()[:2] for line in out.splitlines()] == [["s1", "2"], ["s2", "1"]]
    code, out, _ = run("--path", mem, "sessions", "--user", "ana", "--json")
    assert [json.loads(line)["session_id"] for line in out.splitlines()] == ["s1", "s2"]

    code, out, _ = run("--path", mem, "facts", "--user", "ana")
    assert code == 0 and "User lives in Porto" in out and "User is allergic to peanuts" in out
    lisbon = out[out.index("User lives in Lisbon"):]
    assert "invalid since" in lisbon.splitlines()[1] and "invalidate" in lisbon  # with its history
    code, out, _ = run("--path", mem, "facts", "--user", "ana", "--json", "--valid")
    facts = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "User lives in Lisbon" not in {f["text"] for f in facts}
    assert all(f["valid"] and f["history"][0]["action"] == "add" for f in facts)

    code, out, _ = run("--path", mem, "episodes", "--user", "ana", "--session", "s1")
    assert code == 0 and out.startswith("s1  1 turn  ") and "Lisbon" in out
    code, out, _ = run("--path", mem, "episodes", "--user", "ben", "--json")
    assert code == 0 and out == ""  # ben has no episode, and sees none of ana's

    code, out, _ = run("--path", mem, "working", "--user", "ana", "--session", "s3")
    assert code == 0 and "[goal] booking a table for Friday" in out and 'scratchpad: {"step": 2}' in out
    code, out, _ = run("--path", mem, "working", "--user", "ana", "--session", "s3", "--json")
    assert json.loads(out)["scratchpad"] == {"step": 2}

    code, out, err = run("--path", mem, "context", "where do I live?", "--user", "ana", "--session", "s3",
                       "--max-tokens", "60")
    assert code == 0 and out.splitlines()[0].endswith("of 60 tokens"), err
    assert "[session] Current session notes" in out and "dropped" in out
    code, out, _ = run("--path", mem, "context", "where do I live?", "--user", "ana", "--session", "s3",
                       "--max-tokens", "60", "--json")
    ctx = json.loads(out)
    assert ctx["max_tokens"] == 60 and ctx["tokens"] <= 60 and ctx["dropped"]
    assert all(d["reason"].startswith("over budget") for d in ctx["dropped"])
    assert ctx["messages"][0]["role"] == "system"

    code, _, err = run("--path", mem, "context", "q", "--user", "ana", "--session", "s3", "--max-tokens", "0")
    assert code == 2 and "--max-tokens must be at least 1" in err
    assert main(["--path", mem, "working", "--user", "ana"]) == 2  # argparse: --session is required


def test_the_demo_is_styled_on_a_rich_terminal_and_plain_elsewhere():
    from rich.console import Console

    from tiered_memory.demo import Story, rich_console

    assert rich_console(io.StringIO()) is None  # not a terminal: plain text
    screen = io.StringIO()
    plain: list[str] = []
    story = Story(plain.append, Console(file=screen, force_terminal=True, color_system="standard", width=100))
    story.title("The buffer keeps the newest whole turns")
    story.check(False, "a claim")
    assert plain == []  # everything went to the console
    assert "\x1b[" in screen.getvalue() and "1. The buffer keeps the newest whole turns" in screen.getvalue()
    assert story.failed == ["a claim"] and "not as expected: a claim" in screen.getvalue()


# what a terminal acts on instead of showing: escape sequences (ESC, the one-byte CSI), carriage
# return, backspace, bell, and the bidirectional overrides that reorder what is shown
def test_an_empty_path_is_a_usage_error_not_the_default_memory(tmp_path, embedder, monkeypatch):
    from tiered_memory import TieredMemory

    home = tmp_path / "home"  # the default memory, which `--path "$UNSET"` must not reach
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(home))
    with TieredMemory(home, embedder=embedder) as memory:
        memory.add("user", "I live in Lisbon", session_id="s1", user_id="ana")
    for command in (["forget-user", "ana", "--yes"], ["stats"], ["import", str(tmp_path / "x.jsonl")]):
        code, _, err = run("--path", "", *command)
        assert code == 2 and "--path is empty" in err, command
    with TieredMemory(home, embedder=embedder) as memory:
        assert memory.stats().messages == 1


def test_an_unreachable_postgres_is_one_line_on_stderr_without_the_password(tmp_path):
    pytest.importorskip("psycopg")  # the [postgres] extra (absent in make test-notorch)
    env = {**os.environ, "TIERED_MEMORY_RECORD_STORE": "postgresql://bob:s3cret-pw@127.0.0.1:1/db?connect_timeout=2",
           "TIERED_MEMORY_EMBEDDER": "static"}  # libpq's connect_timeout: 2 s, not the store's 10 s
    (tmp_path / "m").mkdir()  # the index's folder, so the CLI goes on to the server
    proc = subprocess.run([sys.executable, "-m", "tiered_memory", "--path", str(tmp_path / "m"), "stats"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and "StoreError" in proc.stderr and "bob:***@127.0.0.1" in proc.stderr
    assert "within 2s" in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout
    assert len(proc.stderr.splitlines()) == 1, proc.stderr  # not the connection pool's retries too


@pytest.mark.servers
@pytest.mark.parametrize("command", [["stats"], ["search", "Lisbon", "--user", "ana"],
                                     ["export", "dump.jsonl"], ["facts", "--user", "ana"]])
def test_a_read_on_postgres_with_no_index_folder_makes_none(tmp_path, postgres_url, monkeypatch, embedder, command):
    """With the records in PostgreSQL and the vectors in the folder (Chroma, the default), a read
    command naming a folder that is not there made it: a new, empty index, which the start-up
    repair then filled by embedding every stored message, so `stats` wrote a whole index. It
    is now refused as a read of a folder that holds no memory is, naming what to pass."""
    from tiered_memory import TieredMemory

    monkeypatch.setenv("TIERED_MEMORY_RECORD_STORE", postgres_url)
    with TieredMemory(tmp_path / "app", embedder=embedder) as memory:
        memory.add("user", "I live in Lisbon", session_id="s1", user_id="ana")
    monkeypatch.chdir(tmp_path)
    code, _, err = run("--path", str(tmp_path / "elsewhere"), *command)
    assert code == 2 and "no vector index at" in err and "TIERED_MEMORY_VECTOR_STORE" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app"]
    code, out, err = run("--path", str(tmp_path / "app"), "stats", "--json")
    assert code == 0 and json.loads(out)["messages"] == 1, err


def test_working_help_says_its_scores_use_the_default_decay_not_the_applications(capsys):
    """``working`` ranks with the default WorkingConfig (decay_per_hour 0.05) unless ``--config``
    names the application's (tests/test_cli_config.py). An application with another decay rate
    saw other scores there, and nothing said why; the command's help says so now."""
    assert run("working", "--help")[0] == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "WorkingConfig.decay_per_hour, 0.05" in text and "application" in text and "--config" in text


_OPENED: list[str] | None = None  # while a test counts: the paths opened, by the audit hook below


def _count_opens(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, os.PathLike)):
        _OPENED.append(os.fspath(args[0]))


def test_import_opens_the_file_once(tmp_path, dump):
    """The CLI counted the file's lines (for the progress bar) in a read of its own before the
    import's two passes: the bar's total is now the import's first pass's count."""
    global _OPENED
    sys.addaudithook(_count_opens)  # (a hook stays for the process: it counts only while the test runs)
    _OPENED = []
    try:
        code, out, err = run("--path", str(tmp_path / "mem"), "--embedder", "tiered_memory:StaticEmbedder",
                             "import", str(dump))
        opened = [p for p in _OPENED if os.path.realpath(p) == os.path.realpath(dump)]
    finally:
        _OPENED = None
    assert code == 0 and "imported 4 messages" in out, err
    assert len(opened) == 1, f"{dump} was opened {len(opened)} times"
