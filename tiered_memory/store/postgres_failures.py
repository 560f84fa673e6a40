"""What a failed PostgreSQL write means: run it again, or which typed error the caller gets.

:class:`~.postgres_db.PostgresDatabase` runs each write in one transaction. A conflict between
workers (a deadlock, a serialization failure) rolled it back whole, so it may run again
(:func:`conflicted`). Otherwise the caller gets a typed error: a value larger than PostgreSQL
can index is the caller's to shorten (``InvalidInputError``), a connection lost while the
transaction committed leaves the write stored or not (a ``StoreError`` that says so), and
anything else is the store's (``StoreError``). In each case but the last, nothing was stored.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError, StoreError, TieredMemoryError

# Conflicts between concurrent workers that are safe to retry as a whole transaction.
_RETRY_SQLSTATES = {"40001", "40P01"}  # serialization_failure, deadlock_detected

#: program_limit_exceeded: a value larger than PostgreSQL can index (a b-tree entry past 2,704
#: bytes, such as a long store item key or namespace; a text whose words make a tsvector past
#: 1 MB), which no retry can store
_TOO_LARGE_SQLSTATE = "54000"


def conflicted(e: BaseException | None) -> bool:
    """Whether the psycopg error ``e`` is a conflict between workers, which rolled the transaction
    back whole: running it again is safe."""
    return getattr(e, "sqlstate", None) in _RETRY_SQLSTATES


def write_failed(e: Exception) -> TieredMemoryError:
    """The typed error of a failed write (its transaction rolled back, nothing of it stored): a
    value too large for PostgreSQL is the caller's to shorten, anything else the store's."""
    if getattr(e, "sqlstate", None) == _TOO_LARGE_SQLSTATE:
        return InvalidInputError(f"a value is too large for PostgreSQL and nothing was written; shorten it "
                                 f"(a store item's key and namespace are indexed whole, and a text's words "
                                 f"in a keyword index of at most 1 MB: {' '.join(str(e).split())})")
    return StoreError(f"record store write failed, nothing of it was stored: {e}")


def commit_failed(e: Exception, conn: Any, committing: bool) -> TieredMemoryError:
    """The typed error of a failed write: :func:`write_failed`, unless the connection was lost
    while committing, when the write may or may not be stored."""
    if conn is not None and conn.broken and committing:
        return StoreError(
            f"the connection to PostgreSQL was lost while a write committed ({' '.join(str(e).split())}): "
            "it may or may not be stored. Check before retrying, or retry messages with their ids "
            "(stored once).")
    return write_failed(e)
