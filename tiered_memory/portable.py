"""JSONL export and import: the live turns, then the facts (with their history, invalid
ones included, and the history of facts deleted, merged or pruned), the episodes (with
their key points), each session's coverage cursor (the last turn its episodes cover: so
an imported session is not summarised again), the LangGraph store items (live ones, with their
TTL), the archived turns (those ``consolidate`` moved out of the hot table), working memory
(each session's live items and its scratchpad) and the audit log, one JSON object a line.

Vectors are not exported: they are recomputed on import, so a dump moves between
embedding models, vector engines and record stores (SQLite to PostgreSQL). Not in a dump:
working-memory items that were pruned, and expired items. The import is :mod:`.portable_import`
(two passes: every line checked, then read back in batches). The layer lines are written
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

import logging
from pathlib import Path
from typing import Any, Iterator

from .errors import InvalidInputError, StoreError
from .json_values import json_text
from .portable_import import ImportFormatError as ImportFormatError, ImportReport as ImportReport
from .portable_import import import_jsonl as import_jsonl
from .portable_layers import (CursorRecord, archived_line, audit_line, cursor_line, episode_line, fact_line,
                              history_line, item_line, scratchpad_line, working_line)
from .portable_parse import FORMAT as FORMAT, parse_line as parse_line, parse_object
from .portable_values import Ids, importable, row_name
from .store.base import RecordStore
from .store.repositories import LayerRepository
from .validation import check_id, check_path


log = logging.getLogger("tiered_memory")


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
