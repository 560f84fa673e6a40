"""The CLI commands that move a memory as JSONL (:mod:`.portable`): ``export`` and ``import``.

The file is opened once, by the import (a pipe, ``import <(gunzip -c dump.jsonl.gz)`` or
``/dev/stdin``, too): the progress bar's total is the count of valid lines its first pass gives.

An import that made the memory (its folder, or the store in a folder that held none) and then
imported nothing (an invalid line, without ``--skip-invalid``) removes what it made, so the read
commands find no empty memory there; a folder that was there before stays, as it was.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any, Callable, TextIO

from .cli_open import EXIT_OK, CliUsageError, open_memory as _open


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``export`` and ``import`` on the CLI's subparsers."""
    e = sub.add_parser("export", parents=[common], help="write messages, facts (with their history), episodes, store"
                       " items, archived turns, working memory and the audit log as JSONL")
    e.add_argument("file", help="output .jsonl file")
    e.add_argument("--user", default=None, help="only this user (default: everyone)")

    i = sub.add_parser("import", parents=[common], help="import a JSONL export (vectors are recomputed)")
    i.add_argument("file", help="input .jsonl file")
    i.add_argument("--skip-invalid", action="store_true",
                   help="import the valid lines and report the invalid ones (default: import nothing)")
    i.add_argument("--no-progress", action="store_true", help="no progress bar")
    i.add_argument("--user", metavar="USER_ID", default=None,
                   help="import only into this user; lines of other users are invalid "
                        "(default: each line goes to the user it names)")


def _cmd_export(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    with _open(args, err) as memory:
        n = memory.export_jsonl(args.file, user_id=args.user)
    out(f"exported {_counted(n, 'line')} (messages, facts, episodes, items, archived turns, working memory, "
        f"the audit log) to {args.file}")
    return EXIT_OK


def _cmd_import(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    source = Path(args.file)
    if source.is_dir():
        raise CliUsageError(f"cannot read {source}: it is a folder; name the .jsonl file an export wrote")
    if not source.exists():
        raise CliUsageError(f"cannot read {source}: no such file")
    from tqdm import tqdm
    from .backends import configured_vector_store, is_embedded_index
    from .memory import default_path
    from .portable import ImportFormatError

    folder = Path(args.path) if args.path else default_path()
    made = _first_missing(folder)
    before = _store_entries(folder)
    try:
        with _open(args, err, create=True) as memory:
            bar = tqdm(unit="line", desc="importing", file=err, disable=True if args.no_progress else None)

            def checked(n: int) -> None:  # the total, from the import's first pass: no read of our own
                bar.total = n
                bar.refresh()
            try:
                report = memory.import_jsonl(source, skip_invalid=args.skip_invalid, progress=bar.update,
                                             user_id=args.user, checked=checked)
            finally:
                bar.close()
    except ImportFormatError as e:
        # nothing was imported: the folder made for it would be an empty memory that the read
        # commands then find. Only where all of it is in that folder (an index on a server
        # may hold a collection marked as this folder's)
        if not is_embedded_index(configured_vector_store(None)):
            raise
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
            left = "could not be removed: delete it by hand" if made.exists() else "was removed"
            raise CliUsageError(f"{e}; {made}, made for this import, {left}") from e
        if before & _MEMORY:
            raise  # the folder held a memory: the refused import left it as it was
        new = sorted(_store_entries(folder) - before)
        for name in new:
            if (folder / name).is_dir():
                shutil.rmtree(folder / name, ignore_errors=True)
            else:
                (folder / name).unlink(missing_ok=True)
        stuck = [name for name in new if (folder / name).exists()]
        raise CliUsageError(f"{e}; the memory made in {folder} for this import "
                            + (f"could not all be removed: delete {', '.join(stuck)} by hand" if stuck
                               else "was removed")) from e
    present = (report.skipped_existing + report.facts_skipped + report.episodes_skipped + report.items_skipped
               + report.archived_skipped + report.working_skipped + report.scratchpads_skipped
               + report.histories_skipped + report.audit_skipped + report.cursors_skipped)
    n = report.histories_imported
    gone = f" (and the history of {_counted(n, 'deleted fact')})" if n else ""
    out(f"imported {_counted(report.imported, 'message')}, {_counted(report.facts_imported, 'fact')}{gone}, "
        f"{_counted(report.episodes_imported, 'episode')} and {_counted(report.items_imported, 'item')}; "
        f"{_counted(report.archived_imported, 'archived turn')}, "
        f"{_counted(report.working_imported, 'working-memory item')}, "
        f"{_counted(report.scratchpads_imported, 'scratchpad')} and "
        f"{_counted(report.audit_imported, 'audit entry', 'audit entries')} from {source} ({present} already "
        f"present, {_counted(len(report.invalid), 'invalid line')} skipped)")
    for line, message in report.invalid[:20]:
        out(f"  line {line}: {message}")
    return EXIT_OK


def _first_missing(folder: Path) -> Path | None:
    """The outermost of ``folder`` and its parents that does not exist yet: what making
    ``folder`` creates (``None``: it exists)."""
    missing = None
    for p in (folder.absolute(), *folder.absolute().parents):
        if p.exists():
            return missing
        missing = p
    return missing


# the entries that make a folder a memory (beside the lock and SQLite's side files)
_MEMORY = frozenset({"records.sqlite3", "chroma", "qdrant"})


def _store_entries(folder: Path) -> set[str]:
    """The names of the memory's own entries in ``folder`` (:data:`.memory_folder.STORE_ENTRIES`;
    none if it is not a folder)."""
    from .memory_folder import STORE_ENTRIES

    return {p.name for p in folder.iterdir() if p.name in STORE_ENTRIES} if folder.is_dir() else set()


def _counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and its noun, singular for one: "1 fact", "2 facts" (pure)."""
    return f"{n} {one if n == 1 else many or one + 's'}"


COMMANDS: dict[str, Callable[[argparse.Namespace, Callable[[str], None], TextIO], int]] = {
    "export": _cmd_export,
    "import": _cmd_import,
}
