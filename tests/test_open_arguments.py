"""What ``TieredMemory(...)`` is given, checked when it opens: a setting that names no backend is a
``ConfigurationError`` that shows no password, an argument of the wrong kind is a
``ConfigurationError`` naming what it must be, and neither leaves a file behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered_memory import ConfigurationError, StaticEmbedder, TieredMemory

SECRET = "pg-s3cret-pw"

NOT_URLS = [
    f"host=db.internal user=app password={SECRET} dbname=app",  # a libpq key/value string
    f"postgresql//app:{SECRET}@db.internal/app",  # a URL missing its colon
    f"app:{SECRET}@db.internal:5432/app",  # a URL missing its scheme
    f"postgresql:app:{SECRET}@db.internal",
]


@pytest.mark.parametrize("setting", NOT_URLS)
@pytest.mark.parametrize("key", ["record_store", "vector_store"])
@pytest.mark.parametrize("via", ["argument", "environment"])
def test_a_setting_that_is_no_url_is_refused_without_showing_its_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, key: str, via: str) -> None:
    kwargs: dict[str, Any] = {key: setting}
    if via == "environment":
        monkeypatch.setenv(f"TIERED_MEMORY_{key.upper()}", setting)
        kwargs = {}
    with pytest.raises(ConfigurationError, match=f"{key} must be") as info:
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), **kwargs)
    assert SECRET not in str(info.value)
    assert not (tmp_path / "m").exists()



WRONG_KINDS = [
    ({"vector_store": Path("vectors")}, "vector_store must be"),  # a folder where an index goes
    ({"vector_store": 5}, "vector_store must be"),
    ({"record_store": Path("records.sqlite3")}, "record_store must be"),
    ({"record_store": object()}, "record_store must be"),
    ({"embedder": "minilm"}, "embedder must be"),  # a name where an embedder goes
    ({"token_counter": "cl100k"}, "token_counter must be"),
    ({"clock": 1_700_000_000.0}, "clock must be"),
    ({"llm": "gpt-4o"}, "llm must have"),  # a model's name where a model goes
]


# ids without object addresses: every pytest-xdist worker must collect the same names
@pytest.mark.parametrize(("kwargs", "problem"), WRONG_KINDS,
                         ids=[f"{next(iter(kw))}={type(v).__name__}" for kw, _ in WRONG_KINDS for v in kw.values()])
def test_an_argument_of_the_wrong_kind_is_a_configuration_error_before_anything_is_made(
        tmp_path: Path, kwargs: dict[str, Any], problem: str) -> None:
    kwargs = {"embedder": StaticEmbedder(), **kwargs}
    with pytest.raises(ConfigurationError, match=problem):
        TieredMemory(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


def test_an_empty_path_is_refused_not_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an empty folder: "" would have made the memory here
    with pytest.raises(ConfigurationError, match="path is empty"):
        TieredMemory("", embedder=StaticEmbedder())
    assert list(tmp_path.iterdir()) == []


def test_setting_an_llm_no_adapter_wraps_is_refused_and_keeps_the_one_before(tmp_path: Path) -> None:
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder()) as memory:
        with pytest.raises(ConfigurationError, match="llm must have"):
            memory.llm = "gpt-4o"
        assert memory.llm is None


def test_folder_settings_name_only_a_folder_that_holds_the_whole_memory(tmp_path: Path) -> None:
    from tiered_memory import FolderSettings, MemoryConfig
    from tiered_memory.vector.chroma import ChromaVectorIndex

    config = MemoryConfig(max_content_chars=5000)
    with TieredMemory(tmp_path / "m", config=config, embedder=StaticEmbedder()) as memory:
        assert memory.folder_settings == FolderSettings(path=tmp_path / "m", config=config, vector_store="chroma")
    index = ChromaVectorIndex(str(tmp_path / "elsewhere"))  # an engine passed as an object cannot travel
    with TieredMemory(tmp_path / "n", embedder=StaticEmbedder(), vector_store=index) as memory:
        assert memory.folder_settings is None


def test_folder_settings_name_the_folder_a_relative_path_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "app").mkdir()
    monkeypatch.chdir(tmp_path / "app")
    with TieredMemory("mem", embedder=StaticEmbedder()) as memory:
        monkeypatch.chdir(tmp_path)  # a later working directory names another folder "mem"
        settings = memory.folder_settings
        assert settings is not None and settings.path == (tmp_path / "app" / "mem").resolve()


def test_a_folder_name_chroma_cannot_take_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """A folder whose name is not UTF-8 (Python reads such a byte, as from a Latin-1 file name,
    as a lone surrogate: ``caf\\udce9``) is a name Linux has and SQLite and Qdrant open, but
    the embedded Chroma cannot: the open failed with a ``VectorIndexError`` ("could not open
    Chroma collection ... surrogates not allowed") after it had made the folder and its
    records.sqlite3, and every later open failed the same. Now it is a ``ConfigurationError``
    naming the fix, and nothing is made; Qdrant's local mode still takes the name."""
    folder = tmp_path / "caf\udce9"
    with pytest.raises(ConfigurationError, match="UTF-8.*vector_store='qdrant'"):
        TieredMemory(folder, embedder=StaticEmbedder())
    assert not folder.exists()
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store="qdrant") as memory:
        memory.add("user", "I live in Lisbon", user_id="u", session_id="s")
        assert memory.search("Lisbon", user_id="u")[0].text == "I live in Lisbon"
