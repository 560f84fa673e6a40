"""Which embedder a :class:`~tiered_memory.TieredMemory` gets when the caller passes none.

The static table (:class:`~tiered_memory.embedding.static.StaticEmbedder`) unless
``$TIERED_MEMORY_EMBEDDER`` says ``minilm``: the CLI and every memory opened without an
``embedder`` then use all-MiniLM-L6-v2 through sentence-transformers (the ``[minilm]``
extra). Without the variable, a store keeps the built-in embedder that made its vectors, and a
store whose vectors another embedder made is refused: only an ``embedder=`` or the variable
re-embeds a store.
"""

from __future__ import annotations

import os

from ..errors import ConfigurationError, EmbedderRequiredError
from .base import Embedder
from .minilm import BUNDLED_MINILM, SentenceTransformerEmbedder
from .static import BUNDLED_NAME, StaticEmbedder

EMBEDDER_ENV = "TIERED_MEMORY_EMBEDDER"
CHOICES = ("static", "minilm")


def reopen_with(recorded: str) -> str:
    """How to open a store again with the embedder named ``recorded`` (its ``embedder`` meta),
    for a message: the variable for a built-in one, else ``embedder=`` (pure)."""
    builtin = {BUNDLED_NAME: "static", BUNDLED_MINILM: "minilm"}.get(recorded)
    return f"{EMBEDDER_ENV}={builtin}" if builtin else f"embedder=<the embedder {recorded[:200]!r}>"


def default_embedder(batch_size: int = 8, recorded: str | None = None) -> Embedder:
    """The default embedder (cheap: neither one loads its model before the first text).

    Args:
        batch_size: texts per forward pass, for MiniLM (the static table has no batches).
        recorded: the embedder a store's vectors were made by (its ``embedder`` meta). Without
            ``$TIERED_MEMORY_EMBEDDER``, a store made by the bundled MiniLM keeps it, so opening
            it without ``embedder=`` (the CLI always does) does not re-embed the whole store.

    Raises:
        ConfigurationError: an unknown ``$TIERED_MEMORY_EMBEDDER``.
        EmbedderRequiredError: without the variable, a store whose vectors another embedder made
            (only the application that made them can pass it: re-embedding every memory with
            the default, perhaps at a provider's cost, must be asked for).
    """
    choice = os.environ.get(EMBEDDER_ENV, "").strip().lower()
    if not choice and recorded not in (None, BUNDLED_NAME, BUNDLED_MINILM):
        raise EmbedderRequiredError(
            f"this memory's vectors were made by the embedder {recorded[:200]!r}: open it with "
            "embedder=<that embedder> to keep them, or with embedder=StaticEmbedder() (or "
            f"{EMBEDDER_ENV}=static) to re-embed every memory with the default", recorded=recorded)
    choice = choice or ("minilm" if recorded == BUNDLED_MINILM else "static")
    if choice == "static":
        return StaticEmbedder()
    if choice == "minilm":
        return SentenceTransformerEmbedder(batch_size=batch_size)
    raise ConfigurationError(f"{EMBEDDER_ENV}={choice!r}: use one of {', '.join(CHOICES)}, "
                             "or pass embedder= to TieredMemory")
