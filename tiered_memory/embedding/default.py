"""Which embedder a :class:`~tiered_memory.TieredMemory` gets when the caller passes none.

The static table (:class:`~tiered_memory.embedding.static.StaticEmbedder`) unless
``$TIERED_MEMORY_EMBEDDER`` says ``minilm``: the CLI and every memory opened without an
``embedder`` then use all-MiniLM-L6-v2 through sentence-transformers (the ``[minilm]``
extra). A store whose vectors the bundled MiniLM made keeps it without the variable too:
only an ``embedder=`` or the variable re-embeds a store.
"""

from __future__ import annotations

import os

from ..errors import ConfigurationError
from .base import Embedder
from .minilm import BUNDLED_MINILM, SentenceTransformerEmbedder
from .static import StaticEmbedder

EMBEDDER_ENV = "TIERED_MEMORY_EMBEDDER"
CHOICES = ("static", "minilm")


def default_embedder(batch_size: int = 8, recorded: str | None = None) -> Embedder:
    """The default embedder (cheap: neither one loads its model before the first text).

    Args:
        batch_size: texts per forward pass, for MiniLM (the static table has no batches).
        recorded: the embedder a store's vectors were made by (its ``embedder`` meta). Without
            ``$TIERED_MEMORY_EMBEDDER``, a store made by the bundled MiniLM keeps it, so opening
            it without ``embedder=`` (the CLI always does) does not re-embed the whole store.
    """
    fallback = "minilm" if recorded == BUNDLED_MINILM else "static"
    choice = os.environ.get(EMBEDDER_ENV, "").strip().lower() or fallback
    if choice == "static":
        return StaticEmbedder()
    if choice == "minilm":
        return SentenceTransformerEmbedder(batch_size=batch_size)
    raise ConfigurationError(f"{EMBEDDER_ENV}={choice!r}: use one of {', '.join(CHOICES)}, "
                             "or pass embedder= to TieredMemory")
