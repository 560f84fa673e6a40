"""JSONL export and import: the live turns, then the facts (with their history, invalid
ones included, and the history of facts deleted, merged or pruned), the episodes (with
their key points), each session's coverage cursor (the last turn its episodes cover: so
an imported session is not summarised again), the LangGraph store items (live ones, with their
TTL), the archived turns (those ``consolidate`` moved out of the hot table), working memory
(each session's live items and its scratchpad) and the audit log, one JSON object a line.

Vectors are not exported: they are recomputed on import, so a dump moves between
embedding models, vector engines and record stores (SQLite to PostgreSQL). Not in a dump:
working-memory items that were pruned, and expired items. The layer lines are written
and checked by :mod:`.portable_layers` and written back by :mod:`.portable_restore`; every
line is read back as its record by :mod:`.portable_parse` (a line of another ``format``
than :data:`FORMAT`, a later version's, is refused; one without it is read as this one's); a
file of message lines only (every export before them), or without the later kinds of
line, reads as before. Every line written is one the import takes (:mod:`.portable_values`).

An id is a global key. On import, a record whose id is already stored is skipped and
counted (``skipped_existing``, ``facts_skipped``, ``episodes_skipped``, ``items_skipped``,
``archived_skipped``, ``working_skipped``; ``histories_skipped`` for the history of a fact
whose id a fact row or the history holds), whichever user holds it: nothing stored is
overwritten, and another user's record is never touched. So is an item whose namespace
and key are already stored, the scratchpad of a session that has one
(``scratchpads_skipped``), and an audit entry (it has no id) whose every field the log
already holds (``audit_skipped``). A cursor only moves forward: one this store has at that
turn or past it, or whose turn it does not hold for that user and session, is skipped
(``cursors_skipped``). Archived turns go back to the archive, not to the live turns. Working
memory enters a session as ``remember`` writes it: past this memory's ``capacity``, the least
important items are evicted (audited), and an item this store evicted is skipped, not
brought back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import InvalidInputError, StoreError, VectorIndexError
from .guard import vector_errors_typed
from .json_values import json_text
from .layers.items import ItemStore
from .layers.longterm import Layers
from .parts import Parts
from .portable_layers import (CursorRecord, EpisodeRecord, FactRecord, HistoryRecord, ItemRecord, archived_line,
                              audit_line, cursor_line, episode_line, fact_line, history_line, item_line,
                              scratchpad_line, working_line)
from .portable_parse import FORMAT as FORMAT, Record, parse_line as parse_line, parse_object, parse_record
from .portable_values import Ids, importable, row_name
from .portable_restore import (audit_key, restore_archived, restore_audit, restore_cursors, restore_episodes,
                               restore_facts, restore_items, restore_scratchpads, restore_working)
from .recall.forgetting import pay_before_storing
from .recall.indexing import store_and_index, write_chunks
from .records import ArchivedTurn, AuditEntry, SessionPad, WorkingItem
from .store.base import RecordStore
from .store.repositories import LayerRepository
from .types import StoredMessage
from .validation import check_callback, check_id, check_path


log = logging.getLogger("tiered_memory")


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


def export_lines(store: RecordStore, user_id: str | None, rows: LayerRepository | None, now: float, *,
                 max_chars: int, max_metadata_bytes: int, left_out: list[str] | None = None,
                 ids: Ids | None = None) -> Iterator[str]:
    """Messages, then facts, episodes, session cursors, items live at ``now``, archived turns,
    working memory and the audit log (those where the store keeps layers: ``rows``). Reads only.

    Each line is one :func:`import_jsonl` takes with these limits: an id or a time another
    writer left is written as :func:`~.portable_values.importable` says; a row whose line the
    import would still refuse is left out, with a warning naming it (and added to ``left_out``).
    ``ids``: how this export writes ids another writer left (see :class:`~.portable_values.Ids`).
    """
    ids = ids if ids is not None else Ids()
    for obj in _line_objects(store, user_id, rows, now):
        line = importable(obj, ids)
        try:
            parse_object(line, max_chars=max_chars, max_metadata_bytes=max_metadata_bytes, layers=rows is not None)
        except InvalidInputError as e:
            row = f"{line['type']} {row_name(line)!r}"
            log.warning("export: left out the %s, whose stored values import_jsonl would refuse: %s", row, e)
            if left_out is not None:
                left_out.append(row)
            continue
        yield json_text(line)


def _line_objects(store: RecordStore, user_id: str | None, rows: LayerRepository | None, now: float
                  ) -> Iterator[dict[str, Any]]:
    cursors = rows.session_cursors(user_id) if rows is not None else {}
    through: dict[tuple[str, str], tuple[int, str]] = {}  # per session, its last covered live turn (seq, id)
    for m in store.iter_messages(user_id):
        key = (m.user_id, m.session_id)
        if m.seq <= cursors.get(key, 0) and m.seq > through.get(key, (0, ""))[0]:
            through[key] = (m.seq, m.id)
        yield {
            "format": FORMAT, "type": "message", "id": m.id, "user_id": m.user_id,
            "session_id": m.session_id, "role": m.role, "content": m.content,
            "metadata": m.metadata, "timestamp": m.timestamp,
        }
    if rows is None:
        return
    users = [user_id] if user_id is not None else sorted(rows.layer_users())
    for user in users:
        history: dict[str, list[Any]] = {}  # each entry with its place in the user's history
        for n, change in enumerate(rows.fact_history(user)):
            history.setdefault(change.fact_id, []).append((n, change))
        for fact in rows.facts_of(user, include_invalid=True):
            yield fact_line(fact, history.pop(fact.id, []), FORMAT)
        for fact_id, changes in history.items():  # facts deleted, merged or pruned
            yield history_line(user, fact_id, changes, FORMAT)
    for user in users:
        for ep in rows.episodes_of(user):
            yield episode_line(ep, rows.episode_points(ep.id), FORMAT)
    for (user, session), (_, last) in sorted(through.items()):  # no covered turn live: nothing left to cover
        yield cursor_line(CursorRecord(user_id=user, session_id=session, through=last), FORMAT)
    for item, ttl, expires in rows.item_rows(user_id, live_at=now):
        yield item_line(item, ttl, expires, FORMAT)
    for turn in rows.archived_turns(user_id):
        yield archived_line(turn, FORMAT)
    for working in rows.live_working_items(user_id):
        yield working_line(working, FORMAT)
    for pad in rows.scratchpads_of(user_id):
        yield scratchpad_line(pad, FORMAT)
    for user in [user_id] if user_id is not None else sorted(rows.audit_users()):
        for entry in rows.audit_log(user):
            yield audit_line(entry, FORMAT)


def export_jsonl(store: RecordStore, path: str | Path, user_id: str | None = None,
                 rows: LayerRepository | None = None, *, now: float, max_chars: int, max_metadata_bytes: int) -> int:
    """Write messages, facts, episodes, items, archived turns and working memory (one user's,
    or everyone's) to ``path``; returns the number of lines. Reads only (:func:`export_lines`):
    every line is one :func:`import_jsonl` takes with these limits, and the rows left out for
    want of one are counted in a last warning."""
    if user_id is not None:
        check_id(user_id, "user_id")
    path = check_path(path)
    if path.is_dir():
        raise InvalidInputError(f"cannot write {path}: it is a folder; name a file such as {Path(path) / 'export.jsonl'}")
    n, left_out, ids = 0, list[str](), Ids()
    tmp = Path(str(path) + ".tmp")
    try:
        opened = open(tmp, "w", encoding="utf-8")
    except OSError as e:
        raise InvalidInputError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        with opened as f:
            while True:
                for line in export_lines(store, user_id, rows, now, max_chars=max_chars,
                                         max_metadata_bytes=max_metadata_bytes, left_out=left_out, ids=ids):
                    f.write(line + "\n")
                    n += 1
                if not ids.collided():
                    break
                # an id written for one another writer left is a stored id too: again, with every such id known
                f.seek(0)
                f.truncate()
                n, left_out, ids = 0, [], Ids(stored=ids.pictured)
        tmp.replace(path)
    except OSError as e:  # a full disk: the old export (if any) is left as it was
        tmp.unlink(missing_ok=True)
        raise StoreError(f"writing {path} failed: {e.strerror or e}; nothing was replaced") from e
    if left_out:
        log.warning("export to %s left out %d row(s) whose stored values import_jsonl would refuse (each named "
                    "above): %s", path, len(left_out), ", ".join(left_out[:5]) + (" ..." if len(left_out) > 5 else ""))
    return n


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


def import_jsonl(
    parts: Parts, path: str | Path, *, skip_invalid: bool = False,
    progress: Callable[[int], None] | None = None, user_id: str | None = None, layers: Layers | None = None,
    items: ItemStore | None = None,
) -> ImportReport:
    """Import a JSONL export. Every line is checked first; with any invalid line nothing
    is imported (``ImportFormatError`` lists them by line) unless ``skip_invalid``.

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
    number of the other lines.

    Raises:
        ImportFormatError: an invalid line (without ``skip_invalid``); nothing was written.
        VectorIndexError: the vector index failed (whatever a custom one raises); what was
            stored stays, and the import run again writes the rest. A message whose id held a
            deleted message whose vectors the index could not delete yet is stored, not yet
            indexed (they go first), as ``add_many`` does.
    """
    if user_id is not None:
        check_id(user_id, "user_id")
    path = check_path(path)
    check_callback(progress, "progress", 1)
    report = ImportReport()
    records = _read(parts, path, report, user_id=user_id, layers=layers is not None)
    if report.invalid and not skip_invalid:
        raise ImportFormatError(report.invalid)
    rows = [r for r in records if isinstance(r, StoredMessage)]
    existing = set()
    for user in {r.user_id for r in rows}:
        existing |= set(parts.store.get_by_ids(user, [r.id for r in rows if r.user_id == user]))
    taken = parts.store.existing_ids([r.id for r in rows if r.id not in existing])
    if layers is not None:  # a turn archived since the export is not brought back to the live turns
        taken |= set(layers.rows.archive_owners([r.id for r in rows if r.id not in existing and r.id not in taken]))
    new = [r for r in rows if r.id not in existing and r.id not in taken]
    report.skipped_existing = len(rows) - len(new)
    with parts.lock:
        def write(part: list[StoredMessage], _start: int, last: bool) -> None:
            # an id deleted before whose vectors the index still owes: those go before the new ones
            failure: Exception | None
            try:
                pay_before_storing(parts.store.owed_rows, parts.index, turns=[r.id for r in part])
            except VectorIndexError as e:  # stored pending, indexed by the next payment (as add_many does)
                parts.store.insert_messages(part, sync=last)
                failure = e
            else:
                failure = store_and_index(part, store=parts.store, index=parts.index, embedder=parts.embedder,
                                          threshold=parts.config.dedup_threshold, sync=last)
            if failure is not None:
                with vector_errors_typed(_FAILED.format(what=f"{report.imported + len(part)} messages, the last "
                                                        f"{len(part)} of them stored but not yet indexed")):
                    raise failure
            report.imported += len(part)

        # messages per transaction and per progress update
        write_chunks(new, parts.config.write_chunk, write, store=parts.store, progress=progress)
        with vector_errors_typed(_FAILED.format(what="its messages and the records restored before")):
            _restore_layers(parts, records, report, layers, items)
    if progress is not None and len(records) > len(rows):
        progress(len(records) - len(rows))  # the lines of every other kind, done
    return report


# a vector index that failed mid-import (a custom one may raise anything), as add_many says it
_FAILED = ("the vector index failed during the import ({{error}}); it stored {what}, which the next open "
           "indexes (store items too): import the file again once the index works, which "
           "skips what is stored and writes the rest")


def _restore_layers(parts: Parts, records: list[Record], report: ImportReport, layers: Layers | None,
                    items: ItemStore | None) -> None:
    """Every record but the messages, kind by kind, counted in ``report``."""
    if layers is not None:
        report.cursors_imported, report.cursors_skipped = restore_cursors(  # before the episodes move them
            parts, layers, [r for r in records if isinstance(r, CursorRecord)])
        (report.facts_imported, report.facts_skipped), (report.histories_imported, report.histories_skipped) = \
            restore_facts(layers, [r for r in records if isinstance(r, FactRecord)],
                          [r for r in records if isinstance(r, HistoryRecord)])
        report.episodes_imported, report.episodes_skipped = restore_episodes(
            parts, layers, [r for r in records if isinstance(r, EpisodeRecord)])
        report.archived_imported, report.archived_skipped = restore_archived(
            parts, layers, [r for r in records if isinstance(r, ArchivedTurn)])
        report.working_imported, report.working_skipped = restore_working(
            parts, layers, [r for r in records if isinstance(r, WorkingItem)])
        report.scratchpads_imported, report.scratchpads_skipped = restore_scratchpads(
            parts, layers, [r for r in records if isinstance(r, SessionPad)])
        report.audit_imported, report.audit_skipped = restore_audit(
            parts, layers, [r for r in records if isinstance(r, AuditEntry)])
    if items is not None:
        report.items_imported, report.items_skipped = restore_items(
            items, [r for r in records if isinstance(r, ItemRecord)])


def _read(parts: Parts, path: str | Path, report: ImportReport, *, user_id: str | None,
          layers: bool) -> list[Record]:
    """Every valid line's record; the invalid ones go to ``report.invalid``."""
    records: list[Record] = []
    first_seen: dict[tuple[str, str, str], int] = {}
    try:
        opened = open(path, "rb")
    except OSError as e:
        raise InvalidInputError(f"cannot read {path}: {e.strerror or e}") from e
    with opened as f:
        for n, raw_bytes in enumerate(f, start=1):
            try:
                # a file saved by a Windows tool starts with a byte order mark, which is not text
                raw = raw_bytes.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                report.invalid.append((n, f"not UTF-8 ({e.reason} at byte {e.start})"))
                continue
            if not raw.strip():
                continue
            try:
                record = parse_record(raw, max_chars=parts.config.max_content_chars,
                                      max_metadata_bytes=parts.config.max_metadata_bytes, layers=layers)
            except InvalidInputError as e:
                report.invalid.append((n, str(e)))
                continue
            kind, record_id, owner = _identity(record)
            if user_id is not None and owner != user_id:
                report.invalid.append((n, f"belongs to another user ({owner!r}); this import is "
                                          f"scoped to {user_id!r}"))
                continue
            per_session = kind in ("scratchpad", "cursor")
            key = (kind, owner if per_session else "", record_id)  # other ids are global
            if key in first_seen:  # would fail half-way through the import otherwise
                what = f"the {kind} of session {record_id!r}" if per_session else f"id {record_id!r}"
                report.invalid.append((n, f"{what} is also on line {first_seen[key]}"))
                continue
            first_seen[key] = n
            records.append(record)
    return records
