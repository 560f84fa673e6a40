"""Which embedder a :class:`~tiered_memory.TieredMemory` gets when the caller passes none.

The static table (:class:`~tiered_memory.embedding.static.StaticEmbedder`) unless
``$TIERED_MEMORY_EMBEDDER`` says ``minilm``: the CLI and every memory opened without an
``embedder`` then use all-MiniLM-L6-v2 through sentence-transformers (the ``[minilm]``
extra), for instance to keep the vectors of a store built before the static default.
"""

from __future__ import annotations

import os

from ..errors import ConfigurationError
from .base import Embedder
from .minilm import SentenceTransformerEmbedder
from .static import StaticEmbedder

EMBEDDER_ENV = "TIERED_MEMORY_EMBEDDER"
CHOICES = ("static", "minilm")


def default_embedder(batch_size: int = 8) -> Embedder:
    """The default embedder (cheap: neither one loads its model before the first text).

    Args:
        batch_size: texts per forward pass, for MiniLM (the static table has no batches).
    """
    choice = os.environ.get(EMBEDDER_ENV, "").strip().lower() or "static"
    if choice == "static":
        return StaticEmbedder()
    if choice == "minilm":
        return SentenceTransformerEmbedder(batch_size=batch_size)
    raise ConfigurationError(f"{EMBEDDER_ENV}={choice!r}: use one of {', '.join(CHOICES)}, "
                             "or pass embedder= to TieredMemory")
