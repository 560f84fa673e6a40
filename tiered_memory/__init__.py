"""tiered-memory: long-term, tiered memory for LLM agents (framework-free core)."""

from .config import (BudgetConfig, BufferConfig, ConsolidationConfig, EpisodeConfig, FactConfig, LLMConfig,
                     MemoryConfig, RetrievalConfig, WorkingConfig)
from .layers.consolidation import ConsolidationReport
from .context.render import ContextItem, Dropped, MemoryContext, Section
from .embedding import Embedder, SentenceTransformerEmbedder, StaticEmbedder, default_embedder, embedder_name
from .layers.episodic import EpisodeHit
from .errors import (
    ConfigurationError,
    ContentTooLargeError,
    CorruptStoreError,
    EmbedderRequiredError,
    EmbeddingError,
    InvalidArgumentsError,
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
from .llm.base import LLM
from .memory import FolderSettings, TieredMemory
from .portable import ImportReport
from .layers.semantic import FactHit
from .records import AuditEntry, Episode, Fact, FactChange, WorkingItem
from .types import MemoryHit, Message, SessionHit, SessionInfo, Stats, StoredMessage
from .layers.working import WorkingMemory

__version__ = "0.1.0"

__all__ = [
    "AuditEntry",
    "BudgetConfig",
    "BufferConfig",
    "ConfigurationError",
    "ConsolidationConfig",
    "ConsolidationReport",
    "ContentTooLargeError",
    "ContextItem",
    "CorruptStoreError",
    "Dropped",
    "Embedder",
    "EmbedderRequiredError",
    "EmbeddingError",
    "Episode",
    "EpisodeConfig",
    "EpisodeHit",
    "Fact",
    "FactChange",
    "FactConfig",
    "FactHit",
    "FolderSettings",
    "ImportReport",
    "InvalidArgumentsError",
    "InvalidInputError",
    "LLM",
    "LLMConfig",
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
    "SessionHit",
    "SessionInfo",
    "StaticEmbedder",
    "Stats",
    "StoreError",
    "StoreLockedError",
    "StoredMessage",
    "TieredMemory",
    "TieredMemoryError",
    "UsageError",
    "VectorIndexError",
    "WorkingConfig",
    "WorkingItem",
    "WorkingMemory",
    "__version__",
    "default_embedder",
    "embedder_name",
]
