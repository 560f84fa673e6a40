"""Record stores: the single source of truth. Indexes are derived from them.

:class:`RecordStore` is the protocol of raw messages; :class:`LayerRepository` (with its
per-layer parts in :mod:`.repositories`) is what the memory layers ask of a store. All
SQL of the package lives in this folder.
"""

from .base import RecordStore
from .repositories import LayerRepository
from .sqlite import SQLiteRecordStore

__all__ = ["LayerRepository", "RecordStore", "SQLiteRecordStore"]
