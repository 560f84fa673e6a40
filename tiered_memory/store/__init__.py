"""Record stores: the single source of truth. Indexes are derived from them."""

from .base import RecordStore
from .sqlite import SQLiteRecordStore

__all__ = ["RecordStore", "SQLiteRecordStore"]
