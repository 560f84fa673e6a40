"""Importing a JSONL export (:func:`import_jsonl`), in memory that does not grow with the file.

Two passes. The first checks every line (:mod:`.portable_parse`: a later format, another
user's line in a scoped import, an id on two lines) and keeps of each valid line only its
number, its kind and where it starts, and each record's identity for the repeat check, in a
:class:`~.store.line_index.LineIndex`: a scratch index of the file on disk, which holds nothing
of the memory and is deleted as the import ends. With an invalid line
nothing is written, unless ``skip_invalid``. A file that is not a regular one (a
pipe: ``import <(gunzip -c dump.jsonl.gz)``, ``/dev/stdin``) is read once: the first pass copies
it to a temporary file, which the second reads.

The second pass reads the valid lines back kind by kind, in the order the import writes them
(:data:`GROUPS`: the messages, then the sessions' cursors, facts, episodes, archived turns,
working memory, scratchpads, the audit log and items), ``MemoryConfig.write_chunk`` records at a
time: messages one transaction each, every other kind one restore call a batch. The audit log is
read back in the order of its entries' times (the first pass notes each line's, and the scratch
index sorts them on disk), the order the import writes it in, so a batch stored is a prefix of the
log and an interrupted import, run again, appends the rest in order. Facts with their history are
read back in batches too, and restored in one transaction all the same (the order a store keeps a
history in is each entry's place in the file's, across facts, and the facts and their history are
one write, so an interrupted import stored none of them): :mod:`.layers.fact_restore` holds them on
disk and sorts the history there. A line the second pass reads otherwise than the first (the file
changed meanwhile) stops the import: what it stored stays, and importing again skips it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterator, TypeVar

from .errors import InvalidInputError, VectorIndexError
from .guard import vector_errors_typed
from .layers.items import ItemStore
from .layers.longterm import Layers
from .parts import Parts
from .portable_layers import CursorRecord, EpisodeRecord, FactRecord, HistoryRecord, ItemRecord
from .portable_parse import Record, parse_record
from .portable_restore import (AuditKey, audit_key, restore_archived, restore_audit, restore_cursors, restore_episodes,
                               restore_facts, restore_items, restore_scratchpads, restore_working)
from .recall.forgetting import pay_before_storing
from .recall.indexing import store_and_index
from .records import ArchivedTurn, AuditEntry, SessionPad, WorkingItem
from .store.line_index import LineIndex
from .types import StoredMessage
from .validation import check_callback, check_id, check_path


class ImportFormatError(InvalidInputError):
    """One or more JSONL lines are invalid; ``errors`` lists ``(line_number, message)``."""

    def __init__(self, errors: list[tuple[int, str]]) -> None:
        shown = "; ".join(f"line {n}: {m}" for n, m in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} invalid line(s), nothing imported: {shown}{more}")
        self.errors = errors


@dataclass
class ImportReport:
    """What an import wrote: ``imported`` and ``skipped_existing`` count messages."""

    imported: int = 0
    skipped_existing: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    facts_imported: int = 0
    facts_skipped: int = 0
    histories_imported: int = 0  # histories of facts no longer stored
    histories_skipped: int = 0
    episodes_imported: int = 0
    episodes_skipped: int = 0
    cursors_imported: int = 0  # sessions' coverage cursors moved forward
    cursors_skipped: int = 0
    items_imported: int = 0
    items_skipped: int = 0
    archived_imported: int = 0
    archived_skipped: int = 0
    working_imported: int = 0
    working_skipped: int = 0
    scratchpads_imported: int = 0
    scratchpads_skipped: int = 0
    audit_imported: int = 0  # audit log entries
    audit_skipped: int = 0


#: the kinds of record, in the order the import writes them (a fact's history goes with the facts)
GROUPS: tuple[tuple[type, ...], ...] = (
    (StoredMessage,), (CursorRecord,), (FactRecord, HistoryRecord), (EpisodeRecord,), (ArchivedTurn,),
    (WorkingItem,), (SessionPad,), (AuditEntry,), (ItemRecord,))
BY_TIME = 7  # the group read back by each line's time (the audit log's)
R = TypeVar("R")  # a kind of record


def _group(record: Record) -> int:
    return next(n for n, kinds in enumerate(GROUPS) if isinstance(record, kinds))


def _identity(record: Record) -> tuple[str, str, str]:
    """(kind, id, owner) of a line's record: ids are unique per kind of record."""
    if isinstance(record, FactRecord):
        return "fact", record.fact.id, record.fact.user_id
    if isinstance(record, HistoryRecord):  # one line per fact id: its record or its history
        return "fact", record.fact_id, record.user_id
    if isinstance(record, EpisodeRecord):
        return "episode", record.episode.id, record.episode.user_id
    if isinstance(record, ItemRecord):
        return "item", record.item.id, record.item.user_id
    if isinstance(record, SessionPad):  # one per user and session
        return "scratchpad", record.session_id, record.user_id
    if isinstance(record, CursorRecord):  # one per user and session
        return "cursor", record.session_id, record.user_id
    if isinstance(record, ArchivedTurn):  # one line per turn id: live or archived
        return "message", record.id, record.user_id
    if isinstance(record, WorkingItem):
        return "working", record.id, record.user_id
    if isinstance(record, AuditEntry):  # no id: told apart by every field
        return "audit", repr(audit_key(record)), record.user_id
    return "message", record.id, record.user_id


class _Lines(LineIndex):
    """The first pass's findings (:class:`~.store.line_index.LineIndex`: on disk), and how many
    valid lines each group has."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = [0] * len(GROUPS)

    def add(self, n: int, kind: int, at: int, key: float = 0.0) -> None:
        self.counts[kind] += 1
        super().add(n, kind, at, key)


def _check(parts: Parts, f: IO[bytes], spool: IO[bytes] | None, lines: _Lines, report: ImportReport, *,
           user_id: str | None, layers: bool) -> None:
    """The first pass: every line checked; the valid ones noted in ``lines``, the invalid ones in
    ``report.invalid``; each line copied to ``spool`` when there is one."""
    at = 0
    for n, raw_bytes in enumerate(f, start=1):
        start, at = at, at + len(raw_bytes)
        if spool is not None:
            spool.write(raw_bytes)
        try:
            record = _parse(parts, raw_bytes, n, layers=layers)
        except InvalidInputError as e:
            report.invalid.append((n, str(e)))
            continue
        if record is None:
            continue
        kind, record_id, owner = _identity(record)
        if user_id is not None and owner != user_id:
            report.invalid.append((n, f"belongs to another user ({owner!r}); this import is "
                                      f"scoped to {user_id!r}"))
            continue
        per_session = kind in ("scratchpad", "cursor")
        first = lines.first_line("\x00".join((kind, owner if per_session else "", record_id)), n)  # other ids are global
        if first is not None:  # would fail half-way through the import otherwise
            what = f"the {kind} of session {record_id!r}" if per_session else f"id {record_id!r}"
            report.invalid.append((n, f"{what} is also on line {first}"))
            continue
        lines.add(n, _group(record), start, record.at if isinstance(record, AuditEntry) else 0.0)
    lines.flush()


def _parse(parts: Parts, raw_bytes: bytes, n: int, *, layers: bool) -> Record | None:
    """Line ``n``'s record; ``None`` for a blank line. Raises InvalidInputError."""
    try:
        # a file saved by a Windows tool starts with a byte order mark, which is not text
        raw = raw_bytes.decode("utf-8-sig" if n == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"not UTF-8 ({e.reason} at byte {e.start})") from e
    if not raw.strip():
        return None
    return parse_record(raw, max_chars=parts.config.max_content_chars,
                        max_metadata_bytes=parts.config.max_metadata_bytes, layers=layers)


def _batches(parts: Parts, f: IO[bytes], lines: _Lines, group: int, path: Path, *,
             layers: bool) -> Iterator[list[Record]]:
    """The second pass over one group: its records, ``write_chunk`` at a time, in the file's
    order (by time for :data:`BY_TIME`)."""
    size = parts.config.write_chunk
    batch: list[Record] = []
    for n, at in lines.of(group, by_key=group == BY_TIME):
        f.seek(at)
        try:
            record = _parse(parts, f.readline(), n, layers=layers)
        except InvalidInputError:
            record = None
        if record is None or _group(record) != group:
            raise InvalidInputError(f"{path} changed during the import: line {n} no longer reads as it did; what "
                                    "was stored stays, and importing the file again skips it")
        batch.append(record)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tuple[IO[bytes], IO[bytes] | None]]:
    """The file, and a temporary file to copy it to when it can be read only once (``None``
    for a regular file, read again where it is)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InvalidInputError(f"cannot read {path}: {e.strerror or e}") from e
    with f, (contextlib.nullcontext(None) if stat.S_ISREG(os.fstat(f.fileno()).st_mode)
             else tempfile.TemporaryFile()) as spool:
        yield f, spool


def import_jsonl(
    parts: Parts, path: str | Path, *, skip_invalid: bool = False,
    progress: Callable[[int], None] | None = None, user_id: str | None = None, layers: Layers | None = None,
    items: ItemStore | None = None, checked: Callable[[int], None] | None = None,
) -> ImportReport:
    """Import a JSONL export. Every line is checked first; with any invalid line nothing
    is imported (``ImportFormatError`` lists them by line) unless ``skip_invalid``. The file is
    read in two passes, the second in batches of ``write_chunk`` (see the module's docstring),
    so the memory it takes does not grow with the file.

    By default each line goes to the user it names (a whole-store restore). With
    ``user_id``, the import is scoped to that user: a line of any other user is
    invalid, so a crafted file cannot plant messages, facts or episodes in someone
    else's memory. Messages are written first, then the sessions' cursors (never moved back),
    facts (with their history, as they were: no resolution; and the history of facts no longer
    stored), episodes (as they were: no summarising), archived turns (into the archive), working
    memory (items re-embedded; past this memory's capacity a session evicts as ``remember``
    does), the audit log and items; ``layers`` and ``items`` are
    ``None`` where the record store keeps no memory layers.
    ``progress`` is called with the messages of each committed chunk, then once with the
    number of the other lines. ``checked`` is called once, after the first pass and before
    anything is written, with the number of valid lines.

    Raises:
        ImportFormatError: an invalid line (without ``skip_invalid``); nothing was written.
        InvalidInputError: the file cannot be read, or changed during the import (what was
            stored stays).
        VectorIndexError: the vector index failed (whatever a custom one raises); what was
            stored stays, and the import run again writes the rest. A message whose id held a
            deleted message whose vectors the index could not delete yet is stored, not yet
            indexed (they go first), as ``add_many`` does.
    """
    if user_id is not None:
        check_id(user_id, "user_id")
    path = check_path(path)
    check_callback(progress, "progress", 1)
    check_callback(checked, "checked", 1)
    report = ImportReport()
    lines = _Lines()
    try:
        with _opened(path) as (f, spool):
            _check(parts, f, spool, lines, report, user_id=user_id, layers=layers is not None)
            if report.invalid and not skip_invalid:
                raise ImportFormatError(report.invalid)
            if checked is not None:
                checked(sum(lines.counts))
            source = spool if spool is not None else f

            def read(group: int) -> Iterator[list[Record]]:
                return _batches(parts, source, lines, group, path, layers=layers is not None)

            with parts.lock:
                _write_messages(parts, read(0), report, layers, progress)
                with vector_errors_typed(_FAILED.format(what="its messages and the records restored before")):
                    _restore_layers(parts, read, lines.counts, report, layers, items)
    finally:
        lines.close()
    others = sum(lines.counts[1:])
    if progress is not None and others:
        progress(others)  # the lines of every other kind, done
    return report


# a vector index that failed mid-import (a custom one may raise anything), as add_many says it
_FAILED = ("the vector index failed during the import ({{error}}); it stored {what}, which the next open "
           "indexes (store items too): import the file again once the index works, which "
           "skips what is stored and writes the rest")


def _write_messages(parts: Parts, batches: Iterator[list[Record]], report: ImportReport, layers: Layers | None,
                    progress: Callable[[int], None] | None) -> None:
    """Each batch's messages not stored yet (by id, of any user, archived ones too), in one
    transaction each that does not wait for the disk; :meth:`~.store.base.RecordStore.sync`
    after the last makes them all durable, as a synced last commit would (after an error too:
    the messages it reports as stored are on disk)."""
    written = False
    try:
        for batch in batches:
            rows = [r for r in batch if isinstance(r, StoredMessage)]
            existing = set()
            for user in {r.user_id for r in rows}:
                existing |= set(parts.store.get_by_ids(user, [r.id for r in rows if r.user_id == user]))
            held = existing | set(parts.store.existing_ids([r.id for r in rows if r.id not in existing]))
            if layers is not None:  # a turn archived since the export is not brought back to the live turns
                held |= set(layers.rows.archive_owners([r.id for r in rows if r.id not in held]))
            new = [r for r in rows if r.id not in held]
            report.skipped_existing += len(rows) - len(new)
            if new:
                written = True
                _write(parts, new, report)
                if progress is not None:
                    progress(len(new))
    except BaseException:
        if written:
            with contextlib.suppress(Exception):  # the error on its way out is the one to report
                parts.store.sync()
        raise
    if written:
        parts.store.sync()


def _write(parts: Parts, part: list[StoredMessage], report: ImportReport) -> None:
    # an id deleted before whose vectors the index still owes: those go before the new ones
    failure: Exception | None
    try:
        pay_before_storing(parts.store.owed_rows, parts.index, turns=[r.id for r in part])
    except VectorIndexError as e:  # stored pending, indexed by the next payment (as add_many does)
        parts.store.insert_messages(part, sync=False)
        failure = e
    else:
        failure = store_and_index(part, store=parts.store, index=parts.index, embedder=parts.embedder,
                                  threshold=parts.config.dedup_threshold, sync=False)
    if failure is not None:
        with vector_errors_typed(_FAILED.format(what=f"{report.imported + len(part)} messages, the last "
                                                f"{len(part)} of them stored but not yet indexed")):
            raise failure
    report.imported += len(part)


def _restore_layers(parts: Parts, read: Callable[[int], Iterator[list[Record]]], counts: list[int],
                    report: ImportReport, layers: Layers | None, items: ItemStore | None) -> None:
    """Every record but the messages, kind by kind and batch by batch, counted in ``report``."""
    def each(group: int, kind: type[R]) -> Iterator[list[R]]:
        for batch in read(group) if counts[group] else ():
            yield [r for r in batch if isinstance(r, kind)]

    def count(name: str, done: tuple[int, int]) -> None:
        for suffix, n in zip(("imported", "skipped"), done):
            setattr(report, f"{name}_{suffix}", getattr(report, f"{name}_{suffix}") + n)

    if layers is not None:
        for cursors in each(1, CursorRecord):  # before the episodes move them
            count("cursors", restore_cursors(parts, layers, cursors))
        if counts[2]:  # batch by batch, into one write in the history's order
            facts, histories = restore_facts(layers, read(2))
            count("facts", facts)
            count("histories", histories)
        for episodes in each(3, EpisodeRecord):
            count("episodes", restore_episodes(parts, layers, episodes))
        for turns in each(4, ArchivedTurn):
            count("archived", restore_archived(parts, layers, turns))
        for working in each(5, WorkingItem):
            count("working", restore_working(parts, layers, working))
        for pads in each(6, SessionPad):
            count("scratchpads", restore_scratchpads(parts, layers, pads))
        logs: dict[str, set[AuditKey]] = {}  # each user's log as the import found it
        for entries in each(BY_TIME, AuditEntry):  # by time: the log's order
            count("audit", restore_audit(parts, layers, entries, logs))
    if items is not None:
        for found in each(8, ItemRecord):
            count("items", restore_items(items, found))
