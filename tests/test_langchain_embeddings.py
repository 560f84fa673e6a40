"""Embedding adapters both ways, with the real bundled model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests
from langgraph.store.memory import InMemoryStore

from langchain_tiered_memory import LangChainEmbedder, TieredMemoryEmbeddings
from langchain_tiered_memory.testing import FailingEmbeddings
from tiered_memory import (ConfigurationError, EmbeddingError, InvalidInputError, SentenceTransformerEmbedder,
                           TieredMemory)


def test_bundled_model_as_langchain_embeddings(embedder: SentenceTransformerEmbedder) -> None:
    lc = TieredMemoryEmbeddings(embedder)
    docs = lc.embed_documents(["green tea", "espresso"])
    query = lc.embed_query("green tea")
    assert len(docs) == 2 and len(query) == 384 and isinstance(query[0], float)
    assert np.allclose(docs[0], query, atol=1e-5)
    # usable as a LangGraph store's index
    store = InMemoryStore(index={"dims": 384, "embed": lc, "fields": ["text"]})
    store.put(("u",), "a", {"text": "Loves hiking in the Alps"})
    store.put(("u",), "b", {"text": "Collects vinyl records"})
    assert store.search(("u",), query="mountain trips", limit=1)[0].key == "a"


async def test_async_twins(embedder: SentenceTransformerEmbedder) -> None:
    lc = TieredMemoryEmbeddings(embedder)
    assert await lc.aembed_query("x") == lc.embed_query("x")
    assert await lc.aembed_documents(["x", "y"]) == lc.embed_documents(["x", "y"])


def test_langchain_embeddings_drive_the_core(make_memory: Callable[..., TieredMemory],
                                             embedder: SentenceTransformerEmbedder) -> None:
    wrapped = LangChainEmbedder(TieredMemoryEmbeddings(embedder), name="minilm-via-langchain")
    memory = make_memory(embedder=wrapped)
    memory.add_many([{"role": "user", "content": "My bike is a red Bianchi."},
                     {"role": "user", "content": "I bake sourdough on Sundays."}], session_id="s", user_id="u")
    assert memory.search("bicycle", user_id="u", k=1)[0].text == "My bike is a red Bianchi."
    assert memory.store.get_meta("embedder") == "minilm-via-langchain"


def test_failures_become_embedding_errors() -> None:
    e = LangChainEmbedder(FailingEmbeddings(RuntimeError("provider down")))
    assert e.name == "langchain:FailingEmbeddings"
    with pytest.raises(EmbeddingError, match="provider down"):
        e.embed_documents(["x"])
    with pytest.raises(EmbeddingError, match="provider down"):
        e.embed_query("x")


@pytest.mark.parametrize("call", [
    lambda e: e.embed_query(None),
    lambda e: e.embed_query(["a"]),
    lambda e: e.embed_documents("a string, not a list"),
    lambda e: e.embed_documents(["fine", 3]),
    lambda e: e.embed_documents(None),
])
def test_bad_input_is_invalid_input_not_a_model_failure(embedder: SentenceTransformerEmbedder, call: Any) -> None:
    with pytest.raises(InvalidInputError):
        call(TieredMemoryEmbeddings(embedder))


def test_standard_embeddings_expectations(embedder: SentenceTransformerEmbedder) -> None:
    lc = TieredMemoryEmbeddings(embedder)
    assert lc.embed_documents([]) == []
    assert lc.embed_documents(("a", "b")) == lc.embed_documents(["a", "b"])  # any sequence of str
    assert len(lc.embed_query("")) == len(lc.embed_query("x"))


class _BundledModel:
    """The standard suites' settings: the bundled model (the session's, loaded once)."""

    @pytest.fixture(autouse=True)
    def _embedder(self, embedder: SentenceTransformerEmbedder) -> None:
        self.embedder = embedder

    @property
    def embeddings_class(self) -> type[TieredMemoryEmbeddings]:
        return TieredMemoryEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"embedder": self.embedder}


class TestTieredMemoryEmbeddingsStandardUnit(_BundledModel, EmbeddingsUnitTests):
    pass


class TestTieredMemoryEmbeddingsStandardIntegration(_BundledModel, EmbeddingsIntegrationTests):
    pass


@pytest.mark.parametrize(("wrap", "bad"), [
    (TieredMemoryEmbeddings, "sentence-transformers/all-MiniLM-L6-v2"), (TieredMemoryEmbeddings, 384),
    (LangChainEmbedder, "sentence-transformers/all-MiniLM-L6-v2"), (LangChainEmbedder, 384),
    (LangChainEmbedder, None),  # (None is the default embedder in TieredMemoryEmbeddings, by design)
])
def test_what_cannot_embed_is_refused_when_the_adapter_is_built(wrap: Any, bad: Any) -> None:
    """``TieredMemoryEmbeddings("sentence-transformers/all-MiniLM-L6-v2")`` (a LangChain user's habit:
    ``HuggingFaceEmbeddings(model_name=...)``) was taken, and the first embedding raised
    ``AttributeError: 'str' object has no attribute 'embed_query'``; LangChainEmbedder turned the
    same into an EmbeddingError, 'failed to embed', as if the model had failed. LlamaIndexEmbedder
    refuses it when it is built, and so do both now."""
    with pytest.raises(ConfigurationError, match="embed_documents and embed_query"):
        wrap(bad)


def test_without_an_embedder_it_is_the_core_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``TieredMemoryEmbeddings()`` is "the core's embedder" (its docstring) and "the bundled model"
    (README), which since the static table became the default is what a ``TieredMemory()`` embeds
    with. It built the MiniLM of the ``[minilm]`` extra instead: with ``[embedded,langchain]``
    (no torch) its first embedding raised MissingDependencyError, and with torch a LangGraph index
    it fed held vectors of another model than the memory's. Unset, it is the default embedder,
    and ``TIERED_MEMORY_EMBEDDER`` chooses it as it chooses the memory's."""
    monkeypatch.delenv("TIERED_MEMORY_EMBEDDER", raising=False)
    lc = TieredMemoryEmbeddings()
    with TieredMemory(tmp_path) as memory:  # opened as an application opens it: no embedder=
        assert lc.name == memory.store.get_meta("embedder")
        assert np.allclose(lc.embed_query("green tea"), memory.embedder.embed_query("green tea"), atol=1e-6)
    monkeypatch.setenv("TIERED_MEMORY_EMBEDDER", "minilm")
    assert isinstance(TieredMemoryEmbeddings().embedder, SentenceTransformerEmbedder)
