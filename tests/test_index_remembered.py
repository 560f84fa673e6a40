"""Which index an open that names none (no ``vector_store=``, no ``TIERED_MEMORY_VECTOR_STORE``)
opens: the one the records were last indexed into, when a setting can make it, else a
ConfigurationError naming it (``vector.identity.remembered_index``, pure; the engines'
side is in tests/test_core_qdrant.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered_memory import ConfigurationError, TieredMemory
from tiered_memory.vector.identity import remembered_index

FOLDER = Path("/data/mem")


@pytest.mark.parametrize("recorded, records_in_folder, postgres, opens", [
    (None, True, False, "chroma"),  # a new store, or one of an earlier version: the default
    ("chroma at the memory folder's chroma, collection tiered_memory", True, False, "chroma"),
    ("qdrant at the memory folder's qdrant, collection tiered_memory", True, False, "qdrant"),
    ("qdrant at /data/mem/qdrant, collection tiered_memory", False, True, "qdrant"),  # records in PostgreSQL
    ("chroma at /data/other/chroma, collection tiered_memory", False, True, "chroma"),  # a worker's own folder
    ("pgvector at the record store's schema, collection vectors", False, True, "pgvector"),
])
def test_an_index_a_setting_can_make_is_opened_again(recorded: str | None, records_in_folder: bool,
                                                     postgres: bool, opens: str) -> None:
    assert remembered_index(recorded, records_in_folder=records_in_folder, postgres=postgres) == opens


@pytest.mark.parametrize("recorded, records_in_folder, postgres, named", [
    ("qdrant at http://vectors.internal:6333, collection notes", True, False, "qdrant+http(s)://"),
    ("chroma at vectors.internal:8000, collection notes", False, True, "http(s)://"),
    ("chroma at /data/other/chroma, collection mine", True, False, "vector_store=<that index>"),
    ("a MyVectorIndex", True, False, "vector_store=<that index>"),
    ("pgvector at the record store's schema, collection vectors", True, False, "vector_store="),
])
def test_an_index_elsewhere_is_a_configuration_error_naming_it(recorded: str, records_in_folder: bool,
                                                               postgres: bool, named: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        remembered_index(recorded, records_in_folder=records_in_folder, postgres=postgres)
    said = str(e.value)
    assert recorded in said and named in said and "vector_store='chroma'" in said, said


def test_a_folder_indexed_elsewhere_is_refused_without_a_vector_store_and_left_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered_memory import StaticEmbedder
    from tiered_memory.vector.chroma import ChromaVectorIndex

    monkeypatch.delenv("TIERED_MEMORY_VECTOR_STORE", raising=False)
    elsewhere = ChromaVectorIndex(str(tmp_path / "elsewhere"))
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store=elsewhere) as m:
        m.add("user", "I live in Lisbon", session_id="s", user_id="u")
    elsewhere.close()
    with pytest.raises(ConfigurationError, match="elsewhere.*vector_store="):
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder())
    assert not (tmp_path / "m" / "chroma").exists()  # no second index made
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), vector_store="chroma") as m:  # asked for
        assert m.search("Lisbon", user_id="u")[0].text == "I live in Lisbon"
