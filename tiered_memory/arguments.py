"""What :class:`~tiered_memory.TieredMemory` is given, checked before anything is opened or
written: an engine object has its protocol's methods (:func:`check_engine`), an embedder,
token counter and clock are of their kind (:func:`check_parts`), and a refused setting is shown
without a password (:func:`shown_setting`). Pure functions; each raises ``ConfigurationError``.
"""

from __future__ import annotations

import os
import re

from .embedding import Embedder
from .errors import ConfigurationError
from .vector.base import shown_url


def check_engine(engine: object, protocol: type, name: str, settings: str) -> None:
    """``engine``, given as ``name``, has every method of ``protocol`` (checked before anything is
    opened: a folder path or a number given where an engine goes failed later, an AttributeError
    after the record store was made).

    Raises:
        ConfigurationError: a method is missing.
    """
    methods = sorted(n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_"))
    lacks = [m for m in methods if not callable(getattr(engine, m, None))]
    if lacks:
        hint = " (the folder goes in path=)" if isinstance(engine, os.PathLike) else ""
        raise ConfigurationError(
            f"{name} must be a {protocol.__name__} (an object with the methods {', '.join(methods)}) or "
            f"{settings}; got {type(engine).__name__}{hint}, which has no {', '.join(lacks[:3])}"
            f"{', ...' if len(lacks) > 3 else ''}")


def check_parts(embedder: object, token_counter: object, clock: object) -> None:
    """What a memory is given beside its engines, each ``None`` (the default) or of its kind.

    Raises:
        ConfigurationError: an embedder without ``embed_documents`` and ``embed_query`` (a name
            such as ``"minilm"`` goes in ``TIERED_MEMORY_EMBEDDER``), or a counter or clock that
            is not a function.
    """
    if embedder is not None and not isinstance(embedder, Embedder):
        raise ConfigurationError(
            f"embedder must be an object with embed_documents and embed_query (StaticEmbedder(), a LangChain "
            f"Embeddings, ...), got {type(embedder).__name__}; to choose the bundled one by name, set "
            "TIERED_MEMORY_EMBEDDER=static or minilm")
    for name, fn in (("token_counter", token_counter), ("clock", clock)):
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"{name} must be a function (or None for the default), got {type(fn).__name__}")


def shown_setting(value: str) -> str:
    """A setting as an error may show it: a URL without its password or query, a name as it is,
    and anything with a ``:``, ``@`` or ``=`` by its length only (a libpq ``password=`` string, or
    a URL missing its ``://``, ``user:password@host``) (pure)."""
    if "://" in value:
        return shown_url(value)
    if len(value) <= 64 and not re.search("[:@=]", value):  # (' chroma\n' from an env file is shown)
        return repr(value)
    return f"a string of {len(value)} characters (not shown: it may hold a password)"
