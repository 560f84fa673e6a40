"""How a CLI command opens the memory folder it names: as :class:`~tiered_memory.TieredMemory`,
or, for a read command while another process holds the folder, its record store read-only
(:class:`~tiered_memory.readonly.ReadOnlyMemory`).

Read-only only then: a free folder opens as the application opens it, with its vector index
(hybrid search, the vector count, the start-up repair and any pending migration). A write
command, or ``context`` (it needs the vector index and counts accesses), is still refused
with :class:`~tiered_memory.errors.StoreLockedError`, which then names the commands that work.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, TextIO

from .errors import StoreLockedError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130  # the CLI's exit codes (see cli.py)


class CliUsageError(Exception):
    """A usage problem found by the CLI itself (exit code 2)."""


# what reads a folder another process holds: its record store, read-only (readonly.py)
READ_COMMANDS = ("stats", "sessions", "facts", "episodes", "working", "search", "export")


def open_memory(args: argparse.Namespace, err: TextIO, *, create: bool = False) -> Any:
    """The memory at ``--path``; for a read command, its record store read-only when another
    process holds the folder (a note on ``err`` says so)."""
    from .memory import TieredMemory, default_path
    from .backends import configured_record_store, configured_vector_store, is_embedded_index, is_postgres_url
    from .folder_lock import FolderLock

    folder = Path(args.path) if args.path else default_path()
    on_server = is_postgres_url(configured_record_store())  # records in PostgreSQL, not the folder
    if not create and on_server and is_embedded_index(configured_vector_store(None)) and not folder.is_dir():
        # opening would make an empty index there and embed every stored message into it
        raise CliUsageError(
            f"no vector index at {folder}: the records are in PostgreSQL and their vectors in the folder "
            "the application opens. Pass --path to that folder, or set TIERED_MEMORY_VECTOR_STORE to "
            "where the vectors are (pgvector, a server URL).")
    if not create and not on_server and not (folder / "records.sqlite3").exists():
        if folder.exists() and not folder.is_dir():
            raise CliUsageError(f"{folder} is a file, not a memory folder")
        raise CliUsageError(
            f"no memory at {folder}. Pass --path to an existing memory folder, or create one "
            "with 'tiered-memory --path FOLDER import FILE'.")
    try:
        return TieredMemory(folder)
    except StoreLockedError as e:
        # held in this process: the message names the object to close; on a server: not ours to read
        if on_server or FolderLock.holder_here(folder) is not None or not (folder / "records.sqlite3").is_file():
            raise
        if args.command not in READ_COMMANDS:
            why = _NEEDS_THE_FOLDER.get(args.command, f"{args.command} writes: stop the application first")
            raise StoreLockedError(f"{e} The CLI's read commands ({', '.join(READ_COMMANDS)}) still work beside it, "
                                   f"read-only; {why}.") from e
    from .readonly import ReadOnlyMemory

    memory = ReadOnlyMemory(folder)
    print(f"note: {folder} is open in another process; reading its records read-only (nothing is written; "
          "its vector index is that process's: no vector count, and search is keyword-only)", file=err)
    return memory


_NEEDS_THE_FOLDER = {
    "context": "context needs the vector index, which belongs to that process, and counts what it returns as "
               "accessed: stop the application first, or look with search (keyword-only), facts and episodes",
}


def keyword_only_label(memory: Any, args: argparse.Namespace, out: Callable[[str], None]) -> None:
    """The label of a search of a folder read beside its holder (text output; JSON hits
    carry it in their explanation)."""
    if getattr(memory, "read_only", False) and not args.json:
        out("(keyword-only: the folder is open in another process, whose vector index is not read)")
