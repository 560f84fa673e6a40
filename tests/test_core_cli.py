"""The tiered-memory command line: every subcommand, usage errors (exit 2), no tracebacks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from tiered_memory.cli import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()


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


def test_demo_prints_sensible_results(embedder):
    code, out, err = run("demo")
    assert code == 0, err
    assert "Loaded 28 messages: 2 users, 6 sessions" in out
    assert "peanut allergy" in out  # the top answer to the restaurant question
    assert "finds 0 of Maria's messages" in out
    assert "same top answer: yes" in out
    assert "tokens" in out and "score" in out


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

    code, out, _ = run("--path", mem, "stats", "--json")
    stats = json.loads(out)
    assert code == 0 and (stats["users"], stats["messages"], stats["vectors"]) == (2, 4, 4)

    exported = tmp_path / "ana.jsonl"
    code, out, _ = run("--path", mem, "export", str(exported), "--user", "ana")
    assert code == 0 and "exported 3 messages" in out
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
    bad = tmp_path / "bad.jsonl"
    bad.write_text(dump.read_text() + "{oops\n", encoding="utf-8")
    mem = str(tmp_path / "mem")
    code, out, err = run("--path", mem, "import", str(bad), "--no-progress")
    assert code == 2 and "line 5" in err and "nothing imported" in err
    code, out, _ = run("--path", mem, "stats", "--json")
    assert json.loads(out)["messages"] == 0
    code, out, _ = run("--path", mem, "import", str(bad), "--skip-invalid", "--no-progress")
    assert code == 0 and "imported 4 messages" in out and "line 5" in out


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

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code, _, err = run("--path", str(a_file), "stats")
    assert code == 2 and "is a file" in err

    code, _, err = run("--path", str(tmp_path / "m"), "import", str(a_file), "--no-progress")
    assert code == 2 and "line 1" in err

    code, _, err = run("--path", str(tmp_path / "m"), "search", "q", "--user", "u", "-k", "0")
    assert code == 2 and "-k must be at least 1" in err

    code, _, err = run("--path", str(tmp_path / "m"), "search", "q", "--user", "")
    assert code == 2 and "user_id" in err


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
