"""Embedding adapters in both directions.

- :class:`LangChainEmbedder`: any LangChain ``Embeddings`` as the core's embedder.
  The core's :class:`~tiered_memory.Embedder` protocol is duck-typed on
  ``embed_documents``/``embed_query``, so a LangChain model already works as is;
  this wrapper adds a stable ``name`` (the core rebuilds its vector index when the
  embedder's name changes) and wraps failures in :class:`~tiered_memory.EmbeddingError`.
- :class:`TieredMemoryEmbeddings`: the core's default embedder (or any core
  embedder) as a LangChain ``Embeddings``, e.g. for a LangGraph store's ``index``
  config or a LangChain vector store.
"""

from __future__ import annotations

from typing import Any, Iterable

from langchain_core.embeddings import Embeddings

from tiered_memory import Embedder, default_embedder
from tiered_memory.aio import to_thread
from tiered_memory.embedding import embedder_name
from tiered_memory.errors import ConfigurationError, EmbeddingError, InvalidInputError

__all__ = ["LangChainEmbedder", "TieredMemoryEmbeddings"]


def check_embedder(value: object, what: str, takes: str) -> None:
    """Refuse, when an adapter is built, what has no ``embed_documents`` and ``embed_query``: a
    model's name (``HuggingFaceEmbeddings(model_name=...)`` is the LangChain habit) would otherwise
    fail at the first embedding, as an ``AttributeError`` or a model failure."""
    if not isinstance(value, Embedder):
        hint = (f"; a model's name goes in {takes}" if isinstance(value, str) else "")
        raise ConfigurationError(f"{what} needs an object with embed_documents and embed_query, "
                                 f"got {type(value).__name__}{hint}")


def _texts(texts: Any) -> list[str]:
    """``texts`` as a list of str (pure); anything else is the caller's mistake, an
    ``InvalidInputError``, not an ``EmbeddingError`` (which says the model failed)."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        raise InvalidInputError(f"embed_documents takes a list of str, got {type(texts).__name__}")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise InvalidInputError(f"embed_documents: text {i} is a {type(text).__name__}, not a str")
    return out


class LangChainEmbedder:
    """Use a LangChain ``Embeddings`` as the core's embedder.

    Args:
        embeddings: any LangChain embeddings model.
        name: identifies the model in the store; default derived from the model
            (its ``model``/``model_name`` and class). Changing it rebuilds the index.

    Example:
        >>> memory = TieredMemory(path, embedder=LangChainEmbedder(OpenAIEmbeddings()))  # doctest: +SKIP
    """

    def __init__(self, embeddings: Embeddings, *, name: str | None = None) -> None:
        check_embedder(embeddings, "LangChainEmbedder",
                       "the LangChain model, e.g. HuggingFaceEmbeddings(model_name=...)")
        self.embeddings = embeddings
        model = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
        self.name = name or (f"langchain:{type(embeddings).__name__}"
                             + (f":{model}" if isinstance(model, str) else ""))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        try:
            return [list(map(float, v)) for v in self.embeddings.embed_documents(list(texts))]
        except Exception as e:
            raise EmbeddingError(f"{self.name} failed to embed {len(texts)} texts: {e}") from e

    def embed_query(self, text: str) -> list[float]:
        try:
            return list(map(float, self.embeddings.embed_query(text)))
        except Exception as e:
            raise EmbeddingError(f"{self.name} failed to embed a query: {e}") from e

    def __repr__(self) -> str:
        return f"LangChainEmbedder({self.name!r})"


class TieredMemoryEmbeddings(Embeddings):
    """The core's embedder as LangChain ``Embeddings``.

    Args:
        embedder: a core embedder; default the one a ``TieredMemory()`` opened without
            ``embedder=`` uses (:func:`~tiered_memory.default_embedder`: the static table shipped
            in the wheel, or all-MiniLM-L6-v2 when ``$TIERED_MEMORY_EMBEDDER`` is ``minilm``),
            loaded on first use.

    A text that is not a ``str`` raises :class:`~tiered_memory.errors.InvalidInputError`.

    Example:
        >>> from langgraph.store.memory import InMemoryStore
        >>> embed = TieredMemoryEmbeddings()  # the static table: 256 dimensions (MiniLM: 384)
        >>> store = InMemoryStore(index={"dims": len(embed.embed_query("x")), "embed": embed})
    """

    def __init__(self, embedder: Embedder | None = None) -> None:
        if embedder is not None:
            check_embedder(embedder, "TieredMemoryEmbeddings", "SentenceTransformerEmbedder(model)")
        self.embedder: Embedder = embedder or default_embedder()

    @property
    def name(self) -> str:
        return embedder_name(self.embedder)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(map(float, v)) for v in self.embedder.embed_documents(_texts(texts))]

    def embed_query(self, text: str) -> list[float]:
        if not isinstance(text, str):
            raise InvalidInputError(f"embed_query takes a str, got {type(text).__name__}")
        return list(map(float, self.embedder.embed_query(text)))

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await to_thread(self.embed_query, text)
