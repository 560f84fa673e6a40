"""How a CLI command opens the memory folder it names: as :class:`~tiered_memory.TieredMemory`,
or, for a read command while another process holds the folder, its record store read-only
(:class:`~tiered_memory.readonly.ReadOnlyMemory`); and the embedder it opens it with
(``--embedder MODULE:FACTORY``, :func:`load_embedder`).

Read-only only then: a free folder opens as the application opens it, with its vector index
(hybrid search, the vector count, the start-up repair and any pending migration). A write
command, or ``context`` (it needs the vector index and counts accesses), is still refused
with :class:`~tiered_memory.errors.StoreLockedError`, which then names the commands that work.

A memory whose vectors an application's own embedder made opens with it given as
``--embedder``. Without it, nothing is re-embedded: the commands that only read rows
(:data:`ROW_COMMANDS`, ``working`` without ``--query``) read the record store read-only, as
beside a holder; the others get :class:`~tiered_memory.errors.EmbedderRequiredError`, which
:func:`embedder_hint` words for the CLI.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

from .config import MemoryConfig
from .embedding import Embedder
from .errors import EmbedderRequiredError, EmbeddingError, StoreLockedError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130  # the CLI's exit codes (see cli.py)


class CliUsageError(Exception):
    """A usage problem found by the CLI itself (exit code 2)."""


# what reads a folder another process holds: its record store, read-only (readonly.py)
READ_COMMANDS = ("stats", "sessions", "facts", "episodes", "working", "search", "export")
# what reads rows only (and ``working`` without --query): no embedder needed
ROW_COMMANDS = ("stats", "sessions", "facts", "episodes", "export")


def load_embedder(spec: str) -> Embedder:
    """The embedder ``--embedder MODULE:FACTORY`` names: ``FACTORY()`` of the module, imported
    as ``python -m`` would (the current folder first, then ``sys.path``).

    Raises:
        CliUsageError: a spec not of that form, a module that cannot be imported, a name it
            lacks or cannot call, or a result that is not an embedder.
        EmbeddingError: the factory failed.
    """
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise CliUsageError(f"--embedder takes MODULE:FACTORY (my_app.embeddings:make_embedder), got {spec!r}")
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise CliUsageError(f"--embedder {spec}: cannot import {module_name!r} ({e}); run from the folder "
                            "that holds it, or add its folder to PYTHONPATH") from e
    finally:
        if added:
            sys.path.remove(here)
    factory = getattr(module, name, None)
    if factory is None:
        raise CliUsageError(f"--embedder {spec}: module {module_name!r} has no {name!r}")
    if not callable(factory):
        raise CliUsageError(f"--embedder {spec}: {name!r} is not callable; name a function (or class) "
                            "that returns the embedder")
    try:
        made = factory()
    except Exception as e:
        raise EmbeddingError(f"--embedder {spec}: {name}() failed: {e}") from e
    if not isinstance(made, Embedder):
        raise CliUsageError(f"--embedder {spec}: {name}() returned a {type(made).__name__}, not an embedder "
                            "(an object with embed_documents and embed_query)")
    return made


def embedder_hint(e: EmbedderRequiredError, command: str) -> str:
    """:class:`EmbedderRequiredError` as the CLI says it (pure): the option that opens the memory."""
    return (f"this memory's vectors were made by the embedder {e.recorded[:200]!r}, which the CLI cannot "
            f"make by itself: pass it as --embedder MODULE:FACTORY (a function, importable from here, that "
            f"returns that embedder) to run {command}. {', '.join(ROW_COMMANDS)} and working (without "
            "--query) read the records without it")


def _reads_rows_only(args: argparse.Namespace) -> bool:
    return args.command in ROW_COMMANDS or (args.command == "working" and args.query is None)


def open_memory(args: argparse.Namespace, err: TextIO, *, create: bool = False) -> Any:
    """The memory at ``--path``, with ``--config FILE``'s MemoryConfig (else the defaults); for a
    read command, its record store read-only when another process holds the folder (a note on
    ``err`` says so)."""
    from .memory import TieredMemory, default_path
    from .backends import configured_record_store, configured_vector_store, is_embedded_index, is_postgres_url
    from .folder_lock import FolderLock
    from .cli_config import load_config

    # a bad config file is the first thing to fix, whatever the folder holds
    config = load_config(args.config) if getattr(args, "config", None) else None
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
    embedder = load_embedder(args.embedder) if getattr(args, "embedder", None) else None
    try:
        return TieredMemory(folder, config=config, embedder=embedder)
    except EmbedderRequiredError as e:
        if on_server or not _reads_rows_only(args):
            raise
        return _rows_only(folder, config, e, err)
    except StoreLockedError as e:
        # held in this process: the message names the object to close; on a server: not ours to read
        if on_server or FolderLock.holder_here(folder) is not None or not (folder / "records.sqlite3").is_file():
            raise
        if args.command not in READ_COMMANDS:
            why = _NEEDS_THE_FOLDER.get(args.command, f"{args.command} writes: stop the application first")
            raise StoreLockedError(f"{e} The CLI's read commands ({', '.join(READ_COMMANDS)}) still work beside it, "
                                   f"read-only; {why}.") from e
    from .readonly import ReadOnlyMemory

    memory = ReadOnlyMemory(folder, config, embedder=embedder)
    print(f"note: {folder} is open in another process; reading its records read-only (nothing is written; "
          "its vector index is that process's: no vector count, and search is keyword-only)", file=err)
    return memory


def _rows_only(folder: Path, config: MemoryConfig | None, e: EmbedderRequiredError, err: TextIO) -> Any:
    """The records of a memory whose embedder the CLI cannot make, read-only: nothing re-embedded."""
    from .readonly import ReadOnlyMemory

    why = f"read without the embedder that made them, {e.recorded[:200]!r}: pass --embedder MODULE:FACTORY"
    memory = ReadOnlyMemory(folder, config, why=why)
    print(f"note: reading the records of {folder} read-only: its vectors were made by the embedder "
          f"{e.recorded[:200]!r}, which the CLI cannot make by itself (--embedder MODULE:FACTORY opens it whole)",
          file=err)
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
