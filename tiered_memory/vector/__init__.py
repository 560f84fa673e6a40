"""Vector indexes: derived from the record store, rebuildable from it."""

from .base import VectorIndex, VectorItem

__all__ = ["VectorIndex", "VectorItem"]
