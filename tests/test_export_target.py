"""An export never lands on the memory's own files: ``export_jsonl`` writes a temporary file and
moves it over its target, so a target inside the memory folder (``records.sqlite3``, its WAL, the
``.lock``, the vector index) would replace the store itself with JSONL, or the lock that keeps a
second process out. Such a target is refused before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import InvalidInputError, StaticEmbedder, TieredMemory
from tiered_memory.cli import main
from tiered_memory.readonly import ReadOnlyMemory

OWN_FILES = ["records.sqlite3", "records.sqlite3-wal", ".lock", "chroma/chroma.sqlite3"]


def _memory(folder: Path) -> TieredMemory:
    memory = TieredMemory(folder, embedder=StaticEmbedder())
    memory.add("user", "I live in Lisbon", user_id="ana", session_id="s1")
    return memory


def _intact(folder: Path) -> None:
    with TieredMemory(folder, embedder=StaticEmbedder()) as memory:
        assert memory.stats().messages == 1
        assert memory.search("Lisbon", user_id="ana")[0].text == "I live in Lisbon"


@pytest.mark.parametrize("own", OWN_FILES)
def test_an_export_onto_a_file_of_the_memory_is_refused_and_the_memory_is_kept(tmp_path: Path, own: str) -> None:
    folder = tmp_path / "mem"
    with _memory(folder) as memory:
        with pytest.raises(InvalidInputError, match="the memory's own"):
            memory.export_jsonl(folder / own)
        with pytest.raises(InvalidInputError, match="the memory's own"):  # the same file by another name
            memory.export_jsonl(tmp_path / "mem" / ".." / "mem" / own)
        memory.export_jsonl(folder / "export.jsonl")  # beside them is fine
    _intact(folder)


@pytest.mark.parametrize("own", OWN_FILES)
def test_a_read_only_export_onto_a_file_of_the_memory_is_refused(tmp_path: Path, own: str) -> None:
    folder = tmp_path / "mem"
    _memory(folder).close()
    with ReadOnlyMemory(folder) as memory:
        with pytest.raises(InvalidInputError, match="the memory's own"):
            memory.export_jsonl(folder / own)
    _intact(folder)


def test_the_cli_export_onto_the_store_exits_2_and_keeps_it(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "mem"
    _memory(folder).close()
    code = main(["--path", str(folder), "export", str(folder / "records.sqlite3")])
    assert code == 2 and "the memory's own" in capsys.readouterr().err
    _intact(folder)


def test_a_symlink_to_the_store_is_the_store(tmp_path: Path) -> None:
    folder = tmp_path / "mem"
    link = tmp_path / "looks-like-an-export.jsonl"
    link.symlink_to(folder / "records.sqlite3")
    with _memory(folder) as memory:
        with pytest.raises(InvalidInputError, match="the memory's own"):
            memory.export_jsonl(link)
    _intact(folder)
