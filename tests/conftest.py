"""Shared fixtures. The embedding model is loaded once per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from tiered_memory import SentenceTransformerEmbedder, TieredMemory  # noqa: E402

pytest_plugins = ["servers", "llm_server"]  # PostgreSQL + Chroma servers (`servers`); local LLM (`llm`)


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The real bundled all-MiniLM-L6-v2, loaded once for the whole session."""
    e = SentenceTransformerEmbedder()
    e.embed_query("warm up")
    return e


@pytest.fixture
def make_memory(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> Iterator[Callable[..., TieredMemory]]:
    """Open TieredMemory objects on tmp folders (same name = same folder); closed at teardown."""
    opened: list[TieredMemory] = []

    def make(name: str = "mem", **kwargs: object) -> TieredMemory:
        kwargs.setdefault("embedder", embedder)
        m = TieredMemory(tmp_path / name, **kwargs)  # type: ignore[arg-type]
        opened.append(m)
        return m

    yield make
    for m in opened:
        m.close()


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    return make_memory()
