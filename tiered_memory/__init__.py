"""tiered-memory: long-term, tiered memory for LLM agents (framework-free core)."""

from .config import BudgetConfig, BufferConfig, MemoryConfig, RetrievalConfig
from .context import ContextItem, Dropped, MemoryContext, Section
from .embedding import Embedder, SentenceTransformerEmbedder
from .errors import (
    ConfigurationError,
    ContentTooLargeError,
    CorruptStoreError,
    EmbeddingError,
    InvalidInputError,
    LLMError,
    LLMOutputError,
    MissingDependencyError,
    NotFoundError,
    RuntimeFailure,
    StoreError,
    StoreLockedError,
    TieredMemoryError,
    UsageError,
    VectorIndexError,
)
from .memory import TieredMemory
from .types import MemoryHit, Message, Stats, StoredMessage

__version__ = "0.1.0"

__all__ = [
    "BudgetConfig",
    "BufferConfig",
    "ConfigurationError",
    "ContentTooLargeError",
    "ContextItem",
    "CorruptStoreError",
    "Dropped",
    "Embedder",
    "EmbeddingError",
    "InvalidInputError",
    "LLMError",
    "LLMOutputError",
    "MemoryConfig",
    "MemoryContext",
    "MemoryHit",
    "Message",
    "MissingDependencyError",
    "NotFoundError",
    "RetrievalConfig",
    "RuntimeFailure",
    "Section",
    "SentenceTransformerEmbedder",
    "Stats",
    "StoreError",
    "StoreLockedError",
    "StoredMessage",
    "TieredMemory",
    "TieredMemoryError",
    "UsageError",
    "VectorIndexError",
    "__version__",
]
