"""The CLI's output read by a command that stops early (``tiered-memory ... | head -1``): the
reader's leaving is no error, so nothing is said on stderr and the exit code is 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tiered_memory import StaticEmbedder, TieredMemory


def test_a_reader_that_stops_early_is_no_error(tmp_path: Path) -> None:
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder()) as memory:
        memory.add_many([{"role": "user", "content": f"note {i} about Lisbon and its tiled streets"}
                         for i in range(1500)], user_id="ana", session_id="s1")
    env = {**os.environ, "TIERED_MEMORY_EMBEDDER": "static"}
    # 1,500 hits of two lines each pass a pipe's buffer, so the CLI still writes once the reader is gone
    proc = subprocess.Popen([sys.executable, "-m", "tiered_memory", "--path", str(tmp_path / "m"), "search",
                             "Lisbon", "--user", "ana", "-k", "1500"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.startswith(b"1. ") and err == ""
