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


@pytest.mark.parametrize("vector_store", ["chroma", "qdrant"])
def test_a_folder_of_an_embedded_store_is_not_taken_for_the_index_of_a_postgresql_one(
        tmp_path: Path, make_postgres_url: Callable[[], str], vector_store: str) -> None:
    """Moving to PostgreSQL by configuration alone, on the same folder: the folder's records stay
    where they are, and the error says how to move them (not that they were lost)."""
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store=vector_store) as memory:
        memory.add("user", "I live in Lisbon", user_id="ana", session_id="s1")
    before = sorted(p.name for p in (tmp_path / "m").iterdir())
    with pytest.raises(ConfigurationError, match="holds an embedded memory") as info:
        TieredMemory(tmp_path / "m", record_store=make_postgres_url(), vector_store=vector_store,
                     embedder=StaticEmbedder())
    assert "export" in str(info.value) and "import" in str(info.value)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == before
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store=vector_store) as memory:
        assert [h.text for h in memory.search("Lisbon", user_id="ana")] == ["I live in Lisbon"]


def test_a_folder_of_an_embedded_store_is_not_silently_ignored_by_an_all_postgresql_one(
        tmp_path: Path, make_pgvector_url: Callable[[], str]) -> None:
    """Records and vectors both in PostgreSQL need no folder, so the folder's own records would go
    unread: the user who moved by configuration alone would see an empty memory. The same error
    says how to move them."""
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder()) as memory:
        memory.add("user", "I live in Lisbon", user_id="ana", session_id="s1")
    before = sorted(p.name for p in (tmp_path / "m").iterdir())
    url = make_pgvector_url()
    with pytest.raises(ConfigurationError, match="holds an embedded memory") as info:
        TieredMemory(tmp_path / "m", record_store=url, vector_store="pgvector", embedder=StaticEmbedder())
    assert "export" in str(info.value) and "import" in str(info.value)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == before
    with TieredMemory(tmp_path / "other", record_store=url, vector_store="pgvector", embedder=StaticEmbedder()) as m:
        assert m.stats().messages == 0  # a path of no embedded memory: opens as before
