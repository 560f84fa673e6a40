"""The folder of an embedded vector index beside a PostgreSQL record store (``record_store=URL``
with the default ``vector_store="chroma"``, or ``"qdrant"``) is checked as the embedded store's
folder is: a file or a folder of someone else's files is a ConfigurationError, and nothing is
written into it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import ConfigurationError, StaticEmbedder, TieredMemory

pytestmark = pytest.mark.servers


@pytest.mark.parametrize("vector_store", ["chroma", "qdrant"])
def test_a_file_as_the_index_folder_is_a_configuration_error(
        tmp_path: Path, make_postgres_url: Callable[[], str], vector_store: str) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigurationError, match="is a file"):
        TieredMemory(tmp_path / "notes.txt", record_store=make_postgres_url(), vector_store=vector_store,
                     embedder=StaticEmbedder())
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("vector_store", ["chroma", "qdrant"])
def test_a_folder_of_other_files_does_not_get_the_index(
        tmp_path: Path, make_postgres_url: Callable[[], str], vector_store: str) -> None:
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(ConfigurationError, match="not a tiered-memory store"):
        TieredMemory(tmp_path, record_store=make_postgres_url(), vector_store=vector_store,
                     embedder=StaticEmbedder())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex"]
