"""Turning what the user passes as ``llm=`` into an :class:`~.base.LLM`.

The core names no framework. Adapter packages declare themselves as entry points of the
group ``tiered_memory.llm_adapters``: the entry point's *name* is the top-level package
whose classes it wraps (``langchain_core``, ``llama_index``), its *value* an ``adapt(obj)``
function that returns a wrapped model or ``None``. An adapter is imported only when an
object of its framework is resolved, so the core never imports a framework by itself;
``tiered-memory`` ships the LangChain and LlamaIndex adapters this way (see
``pyproject.toml``), and any other package can add one.
"""

from __future__ import annotations

import inspect
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Callable

from ..errors import ConfigurationError, MissingDependencyError
from .base import LLM

ENTRY_POINT_GROUP = "tiered_memory.llm_adapters"
Adapt = Callable[[Any], "LLM | None"]


def _packages_of(obj: object) -> set[str]:
    """The top-level packages of the classes ``obj`` is an instance of."""
    return {c.__module__.split(".", 1)[0] for c in type(obj).__mro__}


def adapter_entry_points() -> list[EntryPoint]:
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def resolve_llm(obj: Any) -> LLM | None:
    """An :class:`~.base.LLM` for ``obj``: itself, or a framework model wrapped by its adapter.

    Raises:
        ConfigurationError: ``obj`` is neither an LLM nor a model any installed adapter wraps.
        MissingDependencyError: the adapter for ``obj``'s framework lacks a package.
    """
    if obj is None:
        return None
    packages = _packages_of(obj)
    for ep in adapter_entry_points():
        if ep.name not in packages:
            continue
        try:
            adapt: Adapt = ep.load()
        except MissingDependencyError:
            raise  # the adapter names the package it lacks
        except ImportError as e:
            raise MissingDependencyError(e.name or ep.module, (ep.extras or ["all"])[0]) from e
        wrapped = adapt(obj)
        if wrapped is not None:
            return wrapped
    if isinstance(obj, LLM) and inspect.iscoroutinefunction(type(obj).complete):
        return obj
    raise ConfigurationError(
        f"llm must have 'async def complete(messages, *, json_mode=False, max_tokens=None) -> str', "
        f"or be a LangChain chat model or a LlamaIndex LLM; got {type(obj).__name__}")
