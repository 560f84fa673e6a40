"""What the core needs of an embedder, and the helpers that turn any embedder's output
into unit float32 vectors. Any object with ``embed_documents`` and ``embed_query`` (a
LangChain ``Embeddings``, for one) is an :class:`Embedder`; embedders that can return
numpy arrays directly (:class:`ArrayEmbedder`) skip the list round trip.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..errors import EmbeddingError
from ..graphemes import cut_point

#: a query is embedded by its first this many characters (a pasted document is represented by its
#: opening; its keywords are cut alike, ``recall.query.MAX_QUERY_TERMS``): a whole document took one
#: model pass per window, seconds on a CPU for a query whose hits its opening finds as well
MAX_QUERY_CHARS = 4000


@runtime_checkable
class Embedder(Protocol):
    """What ``TieredMemory(embedder=...)`` takes: any object with these two methods (a LangChain
    ``Embeddings`` as it is). Give it a stable ``name`` (or ``model_name``): a memory records the
    name its vectors were made by, and a change of name re-embeds them (:func:`embedder_name`)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


@runtime_checkable
class ArrayEmbedder(Embedder, Protocol):
    """An embedder that returns unit float32 arrays itself (the bundled ones). Subclasses
    write the two array methods; the list methods of :class:`Embedder` come from them."""

    def embed_array(self, texts: list[str]) -> np.ndarray: ...

    def query_array(self, text: str) -> np.ndarray: ...

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = self.embed_array(list(texts)).tolist()
        return vectors

    def embed_query(self, text: str) -> list[float]:
        vector: list[float] = self.query_array(text).tolist()
        return vector


def chunk_token_ids(ids: Sequence[int], window: int, overlap: int) -> list[list[int]]:
    """Split token ids into windows of ``window`` with ``overlap`` (pure)."""
    if len(ids) <= window:
        return [list(ids)]
    step = max(1, window - overlap)
    chunks = []
    for start in range(0, len(ids), step):
        chunks.append(list(ids[start : start + window]))
        if start + window >= len(ids):
            break
    return chunks


def normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit: np.ndarray = (vectors / norms).astype(np.float32)
    return unit


def embed(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Unit vectors for ``texts`` from any embedder, as a float32 array."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    if isinstance(embedder, ArrayEmbedder):
        return embedder.embed_array(texts)
    try:
        raw = embedder.embed_documents(list(texts))
    except Exception as e:
        raise EmbeddingError(f"embedding failed: {e}") from e
    return normalize(np.asarray(raw, dtype=np.float32))


def embed_batched(embedder: Embedder, texts: Sequence[str], size: int = 256) -> list[np.ndarray]:
    """One unit vector per text, embedded ``size`` texts at a time (a restore of many records
    does not hand the model one huge batch)."""
    return [v for start in range(0, len(texts), size) for v in embed(embedder, list(texts[start:start + size]))]


def query_text(text: str) -> str:
    """What of a query is embedded (pure): its first :data:`MAX_QUERY_CHARS` characters, cut
    between two characters as a reader sees them.

    Example:
        >>> len(query_text("tea " * 5000)) <= MAX_QUERY_CHARS, query_text("green tea")
        (True, 'green tea')
    """
    return text if len(text) <= MAX_QUERY_CHARS else text[:cut_point(text, MAX_QUERY_CHARS)]


def embed_query(embedder: Embedder, text: str) -> np.ndarray:
    """The unit vector of the query ``text`` (:func:`query_text` of it)."""
    text = query_text(text)
    if isinstance(embedder, ArrayEmbedder):
        return embedder.query_array(text)
    try:
        raw = embedder.embed_query(text)
    except Exception as e:
        raise EmbeddingError(f"embedding failed: {e}") from e
    vector: np.ndarray = normalize(np.asarray([raw], dtype=np.float32))[0]
    return vector


def embedder_name(embedder: Embedder) -> str:
    """The name a memory records for the embedder that made its vectors (pure): its ``name``,
    else its ``model_name``, else its class name. Opening a store with an embedder of another
    name re-embeds it; a shared PostgreSQL store logs a warning and waits for ``rebuild_index()``
    (the README's Troubleshooting)."""
    return str(getattr(embedder, "name", None) or getattr(embedder, "model_name", None) or type(embedder).__name__)
