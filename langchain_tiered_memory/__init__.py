"""LangChain adapters for tiered-memory: a thin layer over :class:`tiered_memory.TieredMemory`.

Pick the integration that matches your app:

- :func:`with_tiered_memory` (:class:`TieredMemoryRunnable`) for LCEL chains: recalls
  for the current input, so the first turn of a new session gets long-term memory;
- :class:`TieredChatMessageHistory` (+ :func:`history_factory`) for
  ``RunnableWithMessageHistory``;
- :class:`TieredMemoryMiddleware` for ``langchain.agents.create_agent``, and
  :class:`TieredMemoryStore` (a LangGraph ``BaseStore``) for ``store=``;
- :class:`TieredConversationMemory`, the classic ``memory=`` of ``ConversationChain``
  and ``LLMChain``, for apps still on classic chains;
- :class:`TieredMemoryRetriever` to recall memories as ``Document``\\ s in any chain;
- :class:`LangChainEmbedder` / :class:`TieredMemoryEmbeddings` to swap embedding
  models in either direction, and :class:`LangChainLLM` to give the core any chat model.

Names are imported on first use, so ``import langchain_tiered_memory`` stays cheap
and a missing optional package is reported only by the integration that needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tiered_memory.errors import missing

try:
    import langchain_core  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise missing("langchain-core", "langchain") from e

if TYPE_CHECKING:  # pragma: no cover
    from .classic import TieredConversationMemory
    from .embeddings import LangChainEmbedder, TieredMemoryEmbeddings
    from .history import TieredChatMessageHistory, history_factory, history_factory_config
    from .llm import LangChainLLM
    from .messages import from_stored, to_core
    from .middleware import TieredMemoryMiddleware
    from .store_checks import ItemValueError, NamespaceLabelError
    from .retriever import TieredMemoryRetriever
    from .runnable import TieredMemoryRunnable, with_tiered_memory
    from .store import TieredMemoryStore

# public name -> (module, the distribution that module needs beyond langchain-core)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "ItemValueError": ("store_checks", "langgraph"),
    "LangChainEmbedder": ("embeddings", None),
    "LangChainLLM": ("llm", None),
    "NamespaceLabelError": ("store_checks", "langgraph"),
    "TieredChatMessageHistory": ("history", None),
    "TieredConversationMemory": ("classic", "langchain-classic"),
    "TieredMemoryEmbeddings": ("embeddings", None),
    "TieredMemoryMiddleware": ("middleware", "langchain"),
    "TieredMemoryRetriever": ("retriever", None),
    "TieredMemoryRunnable": ("runnable", None),
    "TieredMemoryStore": ("store", "langgraph"),
    "from_stored": ("messages", None),
    "history_factory": ("history", None),
    "history_factory_config": ("history", None),
    "to_core": ("messages", None),
    "with_tiered_memory": ("runnable", None),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, needs = _EXPORTS[name]
    try:
        mod = importlib.import_module(f".{module}", __name__)
    except ImportError as e:
        if needs and e.name and e.name.split(".")[0] == needs.replace("-", "_"):
            raise missing(needs, "langchain") from e
        raise
    value = getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
