"""Embeddings across the boundary, both ways.

* :class:`LlamaIndexEmbedder`: a LlamaIndex ``BaseEmbedding`` used by the core in
  place of the bundled all-MiniLM-L6-v2 (``TieredMemory(embedder=LlamaIndexEmbedder(e))``).
* :class:`TieredMemoryEmbedding`: the bundled model as a LlamaIndex ``BaseEmbedding``,
  so an application's own indexes can use the same offline model
  (``Settings.embed_model = TieredMemoryEmbedding()``).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr

from tiered_memory.embedding import SentenceTransformerEmbedder
from tiered_memory.embedding.minilm import BUNDLED_MINILM
from tiered_memory.aio import to_thread
from tiered_memory.errors import ConfigurationError, EmbeddingError, TypedArgumentsModel


class LlamaIndexEmbedder:
    """Wrap a LlamaIndex ``BaseEmbedding`` into the core's ``Embedder`` protocol.

    The wrapped model's class and model name become the embedder's ``name``; the
    core stores it and rebuilds the vector index when it changes, so switching
    models never mixes vectors from two spaces.

    Args:
        embed_model: any ``llama_index.core.embeddings.BaseEmbedding``.

    Example:
        >>> from llama_index.core.embeddings import MockEmbedding
        >>> LlamaIndexEmbedder(MockEmbedding(embed_dim=4)).embed_query("hi")
        [0.5, 0.5, 0.5, 0.5]
    """

    def __init__(self, embed_model: BaseEmbedding) -> None:
        if not isinstance(embed_model, BaseEmbedding):
            raise ConfigurationError(
                f"LlamaIndexEmbedder wraps a llama_index BaseEmbedding, got {type(embed_model).__name__}")
        self.embed_model = embed_model

    @property
    def name(self) -> str:
        return f"llamaindex:{self.embed_model.class_name()}:{self.embed_model.model_name}"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        try:
            return [list(v) for v in self.embed_model.get_text_embedding_batch(list(texts))]
        except Exception as e:
            raise EmbeddingError(f"{self.name} failed: {type(e).__name__}: {e}") from e

    def embed_query(self, text: str) -> list[float]:
        try:
            return list(self.embed_model.get_query_embedding(text))
        except Exception as e:
            raise EmbeddingError(f"{self.name} failed: {type(e).__name__}: {e}") from e


class TieredMemoryEmbedding(TypedArgumentsModel, BaseEmbedding):
    """All-MiniLM-L6-v2 as the ``[minilm]`` extra ships it (or another sentence-transformers
    model) as a LlamaIndex embedding. Loads lazily, once per process, and never needs the
    network. It is not the static table a ``TieredMemory()`` embeds with by default; for a
    memory that embeds as this does, set ``TIERED_MEMORY_EMBEDDER=minilm`` (or pass
    ``embedder=SentenceTransformerEmbedder()``).

    Args:
        model: a sentence-transformers model name or folder; ``None`` is the bundled model.
            ``model_name=`` (LlamaIndex's spelling, and the field ``from_dict`` and unpickling
            rebuild it from) names the model too; giving both, different, is refused.

    A bad argument (``embed_batch_size=0``) is refused with
    :class:`~tiered_memory.errors.InvalidArgumentsError`, which is pydantic's ``ValidationError`` too.
    """

    _embedder: SentenceTransformerEmbedder = PrivateAttr()

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        named = kwargs.get("model_name")
        if model is not None and named is not None and named != model:
            raise ConfigurationError(
                f"TieredMemoryEmbedding got model={model!r} and model_name={named!r}; pass one of them")
        if model is None and named != BUNDLED_MINILM:
            model = named  # the model is what the name says, never a label over the bundled one
        kwargs["model_name"] = model or BUNDLED_MINILM
        super().__init__(**kwargs)
        self._embedder = SentenceTransformerEmbedder(model, batch_size=self.embed_batch_size)

    @classmethod
    def class_name(cls) -> str:
        return "TieredMemoryEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embedder.embed_query(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await to_thread(self._get_query_embedding, query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embedder.embed_query(text)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        # LlamaIndex's default calls the sync hook on the event loop
        return await to_thread(self._get_text_embedding, text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embedder.embed_documents(texts)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await to_thread(self._get_text_embeddings, texts)
