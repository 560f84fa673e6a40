"""Opening a folder twice: the same process is told which object holds it and to close()
it (a re-run notebook cell), and an unreferenced earlier object does not block. That a
second process still gets "open in another process" is tests/test_core_persistence.py's
test_second_process_on_the_same_folder_gets_store_locked."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tiered_memory import StoreLockedError, TieredMemory


def test_a_second_open_in_the_same_process_names_the_holder_and_close(tmp_path: Path, embedder: Any) -> None:
    first = TieredMemory(tmp_path / "m", embedder=embedder)
    try:
        first.add("user", "kept while the second open is refused", session_id="s", user_id="u")
        with pytest.raises(StoreLockedError) as info:
            TieredMemory(tmp_path / "m", embedder=embedder)
        message = str(info.value)
        assert "already open in this process" in message and "close()" in message
        assert f"{id(first):#x}" in message and "TieredMemory" in message
        assert f"{Path(__file__).name}:" in message  # where the holder was opened: this test
        assert first.stats().messages == 1  # the holder is unaffected
    finally:
        first.close()
    with TieredMemory(tmp_path / "m", embedder=embedder) as again:  # close() is all it takes
        assert again.stats().messages == 1


def test_an_unreferenced_earlier_memory_does_not_block_a_reopen(tmp_path: Path, embedder: Any) -> None:
    memory = TieredMemory(tmp_path / "m", embedder=embedder)
    memory.add("user", "written before the object was dropped", session_id="s", user_id="u")
    memory.working_memory("s", user_id="u")  # creates the layers, a reference cycle
    gc.disable()  # the reopen itself must collect the cycle
    try:
        del memory
        memory = TieredMemory(tmp_path / "m", embedder=embedder)
    finally:
        gc.enable()
    try:
        assert [m.content for m in memory.get_messages("s", user_id="u")] == [
            "written before the object was dropped"]
    finally:
        memory.close()


def test_in_a_notebook_the_message_names_the_cell_that_opened_the_folder(tmp_path: Path) -> None:
    """A re-run cell ``memory = TieredMemory(path)`` in IPython (the shell Jupyter runs)."""
    child = textwrap.dedent(f"""
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.run_cell("from tiered_memory import StaticEmbedder, TieredMemory")
        cell = "memory = TieredMemory({str(tmp_path / 'm')!r}, embedder=StaticEmbedder())"
        assert shell.run_cell(cell, store_history=True).success
        again = shell.run_cell(cell, store_history=True)
        print("ERROR:", again.error_in_exec)
        shell.run_cell("memory.close()")
        print("REOPENED:", shell.run_cell(cell, store_history=True).success)
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          cwd=str(Path(__file__).resolve().parent.parent))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    error = next(line for line in proc.stdout.splitlines() if line.startswith("ERROR:"))
    assert "already open in this process" in error and "opened at notebook cell In[1], line 1" in error
    assert "close()" in error
    assert "REOPENED: True" in proc.stdout  # close() on the old object was all it took
