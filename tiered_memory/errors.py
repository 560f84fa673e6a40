"""The one error tree of tiered-memory.

::

    TieredMemoryError
    ├── UsageError                    (the caller can fix it)
    │   ├── InvalidInputError         (bad role, content, ids, metadata, timestamp)
    │   │   ├── ContentTooLargeError
    │   │   └── InvalidArgumentsError (an adapter that is a pydantic model refused its arguments;
    │   │                              pydantic's ValidationError too)
    │   ├── ConfigurationError        (bad path, options, missing extra)
    │   │   ├── MissingDependencyError
    │   │   └── EmbedderRequiredError (the store's vectors are a custom embedder's; none given)
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

import contextlib
from typing import Any, Iterator, Mapping, Sequence, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticCustomError, ValidationError


class TieredMemoryError(Exception):
    """Base class of every error raised by tiered-memory."""


class UsageError(TieredMemoryError, ValueError):
    """The call was wrong; the message says how to fix it."""


class InvalidInputError(UsageError):
    """A message, id, metadata or timestamp was rejected before anything was written."""


class ContentTooLargeError(InvalidInputError):
    """Content exceeds ``MemoryConfig.max_content_chars``."""


class InvalidArgumentsError(InvalidInputError, ValidationError):
    """An adapter that is a pydantic model, as its framework's classes are (the LangChain
    retriever and classic memory, the LlamaIndex memory block), refused its arguments (given to
    its constructor or to pydantic's ``model_validate*``). It is pydantic's ``ValidationError`` as well, with the same ``errors()`` and
    message, so both ``except ValidationError`` (what LangChain and LlamaIndex code writes around
    such a constructor) and ``except InvalidInputError`` catch it. Made by :func:`typed_arguments`,
    on every path :class:`TypedArgumentsModel` validates by."""


@contextlib.contextmanager
def typed_arguments(model: str) -> Iterator[None]:
    """Around a pydantic model's construction: its ``ValidationError``, or an
    ``InvalidInputError`` a check before pydantic raised, comes out as :class:`InvalidArgumentsError`
    (``model`` is the class name pydantic's message starts with)."""
    try:
        yield
    except InvalidArgumentsError:
        raise
    except ValidationError as e:  # the same error, retyped: nothing to chain
        raise _retyped(e.title, e.errors()) from None
    except InvalidInputError as e:  # its message names the value; pydantic's would show None
        raise _retyped(model, [{"type": "value_error", "loc": (), "input": None, "ctx": {"error": e}}],
                       hide_input=True) from e


_Model = TypeVar("_Model", bound="TypedArgumentsModel")


class TypedArgumentsModel(BaseModel):
    """The first base of the adapters that are pydantic models (``class
    TieredMemoryBlock(TypedArgumentsModel, BaseMemoryBlock[str])``): each way pydantic validates
    arguments into one refuses them with :class:`InvalidArgumentsError` (:func:`typed_arguments`),
    the constructor and pydantic's own entry points alike, which raise pydantic's plain
    ``ValidationError`` even when the model's ``__init__`` raised the typed one (pydantic calls
    that ``__init__`` and wraps what it raises). ``model_copy(update=...)`` validates nothing, as
    in pydantic."""

    def __init__(self, /, **data: Any) -> None:
        with typed_arguments(type(self).__name__):
            super().__init__(**data)

    @classmethod
    def model_validate(cls: type[_Model], *args: Any, **kwargs: Any) -> _Model:
        with typed_arguments(cls.__name__):
            return super().model_validate(*args, **kwargs)

    @classmethod
    def model_validate_json(cls: type[_Model], *args: Any, **kwargs: Any) -> _Model:
        with typed_arguments(cls.__name__):
            return super().model_validate_json(*args, **kwargs)

    @classmethod
    def model_validate_strings(cls: type[_Model], *args: Any, **kwargs: Any) -> _Model:
        with typed_arguments(cls.__name__):
            return super().model_validate_strings(*args, **kwargs)


def _retyped(title: str, details: Sequence[Mapping[str, Any]], *, hide_input: bool = False) -> InvalidArgumentsError:
    """pydantic's error ``details`` (``ValidationError.errors()``) as an :class:`InvalidArgumentsError`."""
    lines: Any = [{k: v for k, v in d.items() if k in ("type", "loc", "input", "ctx")} for d in details]
    try:
        return InvalidArgumentsError.from_exception_data(title, lines, hide_input=hide_input)
    except KeyError:  # a custom error type, which pydantic knows only with its message
        lines = [{**line, "type": PydanticCustomError(str(d["type"]), str(d.get("msg", d["type"])))}
                 for line, d in zip(lines, details)]
        return InvalidArgumentsError.from_exception_data(title, lines, hide_input=hide_input)


class ConfigurationError(UsageError):
    """The memory was configured with something unusable."""


class EmbedderRequiredError(ConfigurationError):
    """A store whose vectors an application's own embedder made was opened without an embedder
    (and without ``$TIERED_MEMORY_EMBEDDER``): only that embedder keeps them, and re-embedding
    every memory with the default must be asked for. ``recorded`` is the embedder's name."""

    def __init__(self, message: str, *, recorded: str) -> None:
        super().__init__(message)
        self.recorded = recorded


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
