"""Opening a folder twice: the same process is told which object holds it and to close()
it (a re-run notebook cell), an unreferenced earlier object does not block, and a second
process still gets StoreLockedError."""

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


def test_another_process_still_gets_store_locked_error(tmp_path: Path, embedder: Any) -> None:
    child = textwrap.dedent(f"""
        import sys
        from tiered_memory import StoreLockedError, TieredMemory

        class Tiny:  # no model load needed to open a folder
            name = "tiny"
            def embed_documents(self, texts): return [[1.0, 0.0] for _ in texts]
            def embed_query(self, text): return [1.0, 0.0]

        try:
            TieredMemory({str(tmp_path / "m")!r}, embedder=Tiny())
        except StoreLockedError as e:
            print("LOCKED:", e)
            sys.exit(0)
        print("opened")
        sys.exit(1)
    """)
    with TieredMemory(tmp_path / "m", embedder=embedder):
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                              cwd=str(Path(__file__).resolve().parent.parent))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "open in another process" in proc.stdout and "this process" not in proc.stdout
