"""The one error tree of tiered-memory.

::

    TieredMemoryError
    ├── UsageError                    (the caller can fix it)
    │   ├── InvalidInputError         (bad role, content, ids, metadata, timestamp)
    │   │   └── ContentTooLargeError
    │   ├── ConfigurationError        (bad path, options, missing extra)
    │   │   └── MissingDependencyError
    │   └── NotFoundError             (unknown memory, fact or episode id)
    └── RuntimeFailure                (the environment failed; retry or repair)
        ├── StoreError                (record store: SQLite / PostgreSQL)
        │   ├── StoreLockedError      (another process holds an embedded store)
        │   └── CorruptStoreError     (unreadable or foreign file at ``path``)
        ├── VectorIndexError          (vector engine failed; records are kept)
        ├── EmbeddingError
        └── LLMError
            └── LLMOutputError        (output failed validation after a retry)

Every backend error is wrapped with ``raise ... from e`` so the cause is kept.
"""

from __future__ import annotations


class TieredMemoryError(Exception):
    """Base class of every error raised by tiered-memory."""


class UsageError(TieredMemoryError, ValueError):
    """The call was wrong; the message says how to fix it."""


class InvalidInputError(UsageError):
    """A message, id, metadata or timestamp was rejected before anything was written."""


class ContentTooLargeError(InvalidInputError):
    """Content exceeds ``MemoryConfig.max_content_chars``."""


class ConfigurationError(UsageError):
    """The memory was configured with something unusable."""


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package!r} is not installed. Install it with: pip install \"tiered-memory[{extra}]\""
        )
        self.package = package
        self.extra = extra


class NotFoundError(UsageError, LookupError):
    """No memory, fact or episode with that id for that user."""


class RuntimeFailure(TieredMemoryError, RuntimeError):
    """Something outside the caller's control failed."""


class StoreError(RuntimeFailure):
    """The record store failed."""


class StoreLockedError(StoreError):
    """Another process has this embedded store open."""


class CorruptStoreError(StoreError):
    """The file at ``path`` is not a tiered-memory store or is damaged."""


class VectorIndexError(RuntimeFailure):
    """The vector engine failed. Records already committed are kept and re-indexed on repair."""


class EmbeddingError(RuntimeFailure):
    """The embedding model failed to load or to embed."""


class LLMError(RuntimeFailure):
    """The language model failed (error, timeout)."""


class LLMOutputError(LLMError):
    """The language model's output did not validate, even after one retry."""


def missing(package: str, extra: str) -> MissingDependencyError:
    """Build the error for an optional dependency that is not installed."""
    return MissingDependencyError(package, extra)
