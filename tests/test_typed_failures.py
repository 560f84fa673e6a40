"""Failures of the environment reach the caller as the library's typed errors, with what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import ConfigurationError, InvalidInputError, StoreError, StoreLockedError, TieredMemory


@pytest.mark.parametrize("path", [123, 1.5, b"/tmp/x", ["a"]])
def test_a_path_that_is_not_a_path_is_a_configuration_error(path: Any) -> None:
    with pytest.raises(ConfigurationError, match="path must be"):
        TieredMemory(path)


def test_export_to_a_folder_is_refused_and_writes_nothing(memory: TieredMemory, tmp_path: Path) -> None:
    memory.add("user", "hi", session_id="s", user_id="u")
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(InvalidInputError, match="it is a folder"):
        memory.export_jsonl(target)
    assert list(target.iterdir()) == [] and not (tmp_path / "out.tmp").exists()


def test_a_lock_that_is_a_folder_is_a_typed_error(tmp_path: Path, embedder: Any) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / ".lock").mkdir()
    with pytest.raises(StoreLockedError, match="remove it"):
        TieredMemory(tmp_path / "m", embedder=embedder)


def test_an_os_error_inside_a_call_becomes_a_store_error(make_memory: Callable[..., TieredMemory],
                                                         tmp_path: Path) -> None:
    memory = make_memory("io")
    memory.add("user", "hi", session_id="s", user_id="u")
    # the export's temporary file cannot be created: a file stands where its folder should be
    blocker = tmp_path / "blocked"
    blocker.write_text("not a folder")
    with pytest.raises((StoreError, InvalidInputError)) as info:
        memory.export_jsonl(blocker / "x.jsonl")
    assert not isinstance(info.value, OSError)
