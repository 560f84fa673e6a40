"""The folder of an embedded memory: which entries are the memory's own (:data:`STORE_ENTRIES`),
making a folder the memory's (:func:`prepare_folder`), keeping an export off its files
(:func:`check_export_target`), and refusing it to a memory whose records are elsewhere
(:func:`check_no_embedded_records`).

Invariants: a folder that holds someone else's files, or is a file, never gets a database
file; an export never replaces the store, its WAL, the lock or the vector index.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigurationError, InvalidInputError

STORE_ENTRIES = frozenset({"records.sqlite3", "records.sqlite3-wal", "records.sqlite3-shm",
                           "records.sqlite3-journal", ".lock", "chroma", "qdrant"})


def foreign_entries(folder: Path) -> list[str]:
    """Names in ``folder`` that are not ours, when it holds no store yet (a user's
    unrelated folder must not be filled with database files)."""
    if (folder / "records.sqlite3").exists():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.name not in STORE_ENTRIES and not p.name.startswith("."))  # .DS_Store, .gitkeep


def check_export_target(folder: Path, target: Path) -> None:
    """Refuse an export ``target`` that is one of the memory folder's own files (the record store,
    its WAL, the lock, the vector index; through a symlink or a hard link too): an export moves a
    finished file over its target, which would replace the store with JSONL, or the lock with a
    file no process holds.

    Raises:
        InvalidInputError: ``target`` is one of them.
    """
    home, where = folder.resolve(), target.resolve()
    own = where.parent == home and where.name in STORE_ENTRIES
    own = own or any(home / entry in where.parents for entry in ("chroma", "qdrant"))
    if not own and where.exists():
        own = any(os.path.samefile(where, home / entry) for entry in STORE_ENTRIES
                  if (home / entry).is_file())
    if own:
        raise InvalidInputError(
            f"cannot write {target}: it is one of the memory's own files, which the export would replace; "
            f"name a file outside them, such as {folder / 'export.jsonl'}")


def check_no_embedded_records(path: Path) -> None:
    """Refuse ``path`` as the folder of a memory whose records are elsewhere (PostgreSQL) when it
    holds an embedded memory's: they would go unread, and the user who moved by configuration
    alone would see an empty memory (or, with an index in the folder, its vectors taken for
    another store's).

    Raises:
        ConfigurationError: ``path`` holds ``records.sqlite3``; the message says how to move them.
    """
    if (path / "records.sqlite3").exists():
        raise ConfigurationError(
            f"{path} holds an embedded memory (records.sqlite3, and the vector index of its records), and this "
            "memory's records are elsewhere (record_store or TIERED_MEMORY_RECORD_STORE). To move its records "
            f"there: tiered-memory --path {path} export FILE, then import FILE with this configuration and a new "
            "path; to keep using them here, open without record_store.")


def prepare_folder(path: Path, *, index_only: bool = False) -> None:
    """Make ``path`` the memory's folder, for an embedded record store or (``index_only``) the
    embedded index of a record store elsewhere: created if missing, never a file, readable and
    writable, and not someone else's folder, nor, for an index only, an embedded memory's (its
    index is its own records', which stay in its ``records.sqlite3``).

    Raises:
        ConfigurationError: one of these is not so (nothing was written into it).
    """
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"path {path} is a file; tiered-memory needs a folder")
    if index_only:
        check_no_embedded_records(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigurationError(f"cannot create memory folder {path}: {e}") from e
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise ConfigurationError(f"memory folder {path} is not readable and writable")
    foreign = foreign_entries(path)
    if foreign:
        raise ConfigurationError(
            f"{path} already holds files that are not a tiered-memory store "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}). "
            "Point `path` at an empty or new folder, or at an existing memory folder.")
