"""Opening a folder twice: the same process is told which object holds it and to close()
it (a re-run notebook cell), and an unreferenced earlier object does not block. That a
second process still gets "open in another process" is tests/test_core_persistence.py's
test_second_process_on_the_same_folder_gets_store_locked."""

from __future__ import annotations

import gc
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
