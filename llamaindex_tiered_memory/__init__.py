"""LlamaIndex adapter of tiered-memory: long-term memory as one ``Memory`` block.

Example:
    >>> from llama_index.core.memory import Memory
    >>> from tiered_memory import TieredMemory
    >>> from llamaindex_tiered_memory import TieredMemoryBlock, offline_tokenizer
    >>> block = TieredMemoryBlock(memory=TieredMemory("/tmp/tm"), user_id="u1")  # doctest: +SKIP
    >>> chat = Memory.from_defaults(session_id="s1", memory_blocks=[block],
    ...                             tokenizer_fn=offline_tokenizer())  # doctest: +SKIP
"""

from tiered_memory.errors import MissingDependencyError

try:
    import llama_index.core  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
    raise MissingDependencyError("llama-index-core", "llamaindex") from e

from .block import TieredMemoryBlock, offline_tokenizer
from .embeddings import LlamaIndexEmbedder, TieredMemoryEmbedding
from .llm import LlamaIndexLLM
from .sessions import WriteThroughMemory, aend_session, end_session

__all__ = [
    "LlamaIndexEmbedder",
    "LlamaIndexLLM",
    "TieredMemoryBlock",
    "TieredMemoryEmbedding",
    "WriteThroughMemory",
    "aend_session",
    "end_session",
    "offline_tokenizer",
]
