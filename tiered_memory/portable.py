"""JSONL export and import. Vectors are not exported: they are recomputed on import,
so a dump moves between embedding models and vector engines."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import InvalidInputError, StoreError
from .parts import Parts
from .recall.indexing import store_and_index, write_chunks
from .types import StoredMessage
from .validation import check_id, check_message_id, normalize_message


FORMAT = "tiered-memory/1"


class ImportFormatError(InvalidInputError):
    """One or more JSONL lines are invalid; ``errors`` lists ``(line_number, message)``."""

    def __init__(self, errors: list[tuple[int, str]]) -> None:
        shown = "; ".join(f"line {n}: {m}" for n, m in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} invalid line(s), nothing imported: {shown}{more}")
        self.errors = errors


@dataclass
class ImportReport:
    imported: int = 0
    skipped_existing: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)


def export_lines(parts: Parts, user_id: str | None) -> Iterator[str]:
    for m in parts.store.iter_messages(user_id):
        yield json.dumps({
            "format": FORMAT, "type": "message", "id": m.id, "user_id": m.user_id,
            "session_id": m.session_id, "role": m.role, "content": m.content,
            "metadata": m.metadata, "timestamp": m.timestamp,
        }, ensure_ascii=False)


def export_jsonl(parts: Parts, path: str | Path, user_id: str | None = None) -> int:
    """Write messages (one user's, or everyone's) to ``path``; returns the count."""
    if user_id is not None:
        check_id(user_id, "user_id")
    if Path(path).is_dir():
        raise InvalidInputError(f"cannot write {path}: it is a folder; name a file such as {Path(path) / 'export.jsonl'}")
    n = 0
    tmp = Path(str(path) + ".tmp")
    try:
        opened = open(tmp, "w", encoding="utf-8")
    except OSError as e:
        raise InvalidInputError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        with opened as f:
            for line in export_lines(parts, user_id):
                f.write(line + "\n")
                n += 1
        tmp.replace(path)
    except OSError as e:  # a full disk: the old export (if any) is left as it was
        tmp.unlink(missing_ok=True)
        raise StoreError(f"writing {path} failed: {e.strerror or e}; nothing was replaced") from e
    return n


def parse_line(raw: str, *, max_chars: int, max_metadata_bytes: int) -> dict[str, Any]:
    """Validate one JSONL line (pure); raises InvalidInputError."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"not JSON ({e.msg})") from e
    except (ValueError, RecursionError) as e:  # an int of 4,300+ digits; arrays nested past the stack
        raise InvalidInputError(f"not JSON this library can read ({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(obj, dict) or obj.get("type") != "message":
        raise InvalidInputError("expected an object with type 'message'")
    for key in ("user_id", "session_id"):
        check_id(obj.get(key), key)
    check_message_id(obj.get("id"))
    msg = normalize_message(
        {k: obj.get(k) for k in ("role", "content", "metadata", "timestamp")},
        max_chars=max_chars, max_metadata_bytes=max_metadata_bytes, now=0.0,
    )
    if obj.get("timestamp") is None:
        raise InvalidInputError("timestamp is required")
    return {"id": obj["id"], "user_id": obj["user_id"], "session_id": obj["session_id"],
            "role": msg.role, "content": msg.content, "metadata": dict(msg.metadata or {}),
            "timestamp": msg.timestamp}


def import_jsonl(
    parts: Parts, path: str | Path, *, skip_invalid: bool = False,
    progress: Callable[[int], None] | None = None, user_id: str | None = None,
) -> ImportReport:
    """Import a JSONL export. Every line is checked first; with any invalid line nothing
    is imported (``ImportFormatError`` lists them by line) unless ``skip_invalid``.

    By default each line goes to the user it names (a whole-store restore). With
    ``user_id``, the import is scoped to that user: a line of any other user is
    invalid, so a crafted file cannot plant messages in someone else's memory.
    """
    if user_id is not None:
        check_id(user_id, "user_id")
    report = ImportReport()
    rows: list[StoredMessage] = []
    first_seen: dict[str, int] = {}
    try:
        opened = open(path, "rb")
    except OSError as e:
        raise InvalidInputError(f"cannot read {path}: {e.strerror or e}") from e
    with opened as f:
        for n, raw_bytes in enumerate(f, start=1):
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                report.invalid.append((n, f"not UTF-8 ({e.reason} at byte {e.start})"))
                continue
            if not raw.strip():
                continue
            try:
                d = parse_line(raw, max_chars=parts.config.max_content_chars,
                               max_metadata_bytes=parts.config.max_metadata_bytes)
            except InvalidInputError as e:
                report.invalid.append((n, str(e)))
                continue
            if user_id is not None and d["user_id"] != user_id:
                report.invalid.append((n, f"belongs to another user ({d['user_id']!r}); this import is "
                                          f"scoped to {user_id!r}"))
                continue
            if d["id"] in first_seen:  # would fail half-way through the import otherwise
                report.invalid.append((n, f"id {d['id']!r} is also on line {first_seen[d['id']]}"))
                continue
            first_seen[d["id"]] = n
            rows.append(StoredMessage(**d))
    if report.invalid and not skip_invalid:
        raise ImportFormatError(report.invalid)
    existing = set()
    for user in {r.user_id for r in rows}:
        existing |= set(parts.store.get_by_ids(user, [r.id for r in rows if r.user_id == user]))
    taken = parts.store.existing_ids([r.id for r in rows if r.id not in existing])
    new = [r for r in rows if r.id not in existing and r.id not in taken]
    report.skipped_existing = len(rows) - len(new)
    with parts.lock:
        def write(part: list[StoredMessage], _start: int, last: bool) -> None:
            failure = store_and_index(part, store=parts.store, index=parts.index, embedder=parts.embedder,
                                      threshold=parts.config.dedup_threshold, sync=last)
            if failure is not None:
                raise failure
            report.imported += len(part)

        # messages per transaction and per progress update
        write_chunks(new, parts.config.write_chunk, write, store=parts.store, progress=progress)
    return report
