"""Writing the checked records of a JSONL import back into the memory layers, as they were.

Each function takes the records of one kind (already checked by :mod:`.portable_layers`)
and returns ``(written, skipped)``: a record whose id a row already holds, of any user, is
skipped, so nothing stored is overwritten and another user's record is never touched.
:func:`.portable.import_jsonl` calls them under the memory's lock, after the messages.
"""

from __future__ import annotations

import json
from typing import Iterable, Iterator

from .layers.fact_restore import FactBatch
from .layers.items import ItemStore
from .layers.longterm import Layers
from .parts import Parts
from .layers.working import restore as restore_working_items
from .portable_layers import CursorRecord, EpisodeRecord, FactRecord, HistoryRecord, ItemRecord
from .portable_parse import Record
from .records import ArchivedTurn, AuditEntry, SessionPad, WorkingItem

Counts = tuple[int, int]  # (written, skipped as already stored)


def restore_facts(layers: Layers, batches: Iterable[list[Record]]) -> tuple[Counts, Counts]:
    """The facts (with their history) and the histories of facts no longer stored whose ids
    neither a fact row nor the history holds yet (a fact deleted since the export is not
    brought back, nor its trail written twice), from ``batches`` of an import's fact lines (one
    lookup of each kind a batch); in one write, after the history the store holds, in the order
    of the exported one (:func:`~.layers.fact_restore.history_key`), holding a batch at a time
    (:func:`~.layers.fact_restore.restore_facts`)."""
    counts = [0, 0, 0, 0]  # facts written, skipped; histories written, skipped

    def decided() -> Iterator[FactBatch]:
        for batch in batches:
            facts = [r for r in batch if isinstance(r, FactRecord)]
            histories = [r for r in batch if isinstance(r, HistoryRecord)]
            ids = [*(r.fact.id for r in facts), *(r.fact_id for r in histories)]
            held = {**layers.rows.fact_owners(ids), **layers.rows.history_owners(ids)}
            new = [r for r in facts if r.fact.id not in held]
            gone = [r for r in histories if r.fact_id not in held]
            for n, m in enumerate((len(new), len(facts) - len(new), len(gone), len(histories) - len(gone))):
                counts[n] += m
            yield ([r.fact for r in new], [(r.fact.user_id, seq, change) for r in new for seq, change in r.history],
                   [(r.user_id, seq, change) for r in gone for seq, change in r.history])

    layers.facts.restore(decided())
    return (counts[0], counts[1]), (counts[2], counts[3])


def restore_episodes(parts: Parts, layers: Layers, episodes: list[EpisodeRecord]) -> Counts:
    """The episodes (with their key points) whose ids no row holds yet; their sessions'
    coverage cursors move past the stored turns they were made from."""
    held = layers.rows.episode_owners([r.episode.id for r in episodes])
    new = [r for r in episodes if r.episode.id not in held]
    layers.episodes.restore([(r.episode, r.points) for r in new], _covered(parts, new))
    return len(new), len(episodes) - len(new)


def restore_cursors(parts: Parts, layers: Layers, cursors: list[CursorRecord]) -> Counts:
    """Move each session's coverage cursor forward to the turn its line names, as this store
    numbers it; never back. Skipped: a cursor that covers that turn already, or whose turn this
    store does not hold for that user and session (another user's turn moves nothing)."""
    users = {c.user_id for c in cursors}
    held = {user: parts.store.get_by_ids(user, sorted({c.through for c in cursors if c.user_id == user}))
            for user in users}
    moved = 0
    with parts.lock, layers.rows.unit() as u:
        for c in cursors:
            turn = held[c.user_id].get(c.through)
            if turn is not None and turn.session_id == c.session_id and u.cursor(c.user_id, c.session_id) < turn.seq:
                u.advance_cursor(c.user_id, c.session_id, turn.seq)
                moved += 1
    return moved, len(cursors) - moved


def restore_items(items: ItemStore, found: list[ItemRecord]) -> Counts:
    """The items whose id no row holds yet, nor their namespace and key."""
    held = items.db.item_owners([r.item.id for r in found])
    written = items.restore([(r.item, r.ttl_minutes, r.expires_at) for r in found if r.item.id not in held])
    return written, len(found) - written


def restore_archived(parts: Parts, layers: Layers, turns: list[ArchivedTurn]) -> Counts:
    """The archived turns whose ids neither the archive nor the live turns hold yet, back into
    the archive (not into the live turns), where ``clear_session`` and ``forget_user`` find
    them as before."""
    ids = [t.id for t in turns]
    held = {*layers.rows.archive_owners(ids), *parts.store.existing_ids(ids)}
    with parts.lock, layers.rows.unit() as u:
        written = u.restore_archived([t for t in turns if t.id not in held])
    return written, len(turns) - written


def restore_working(parts: Parts, layers: Layers, items: list[WorkingItem]) -> Counts:
    """The working-memory items whose ids no row holds yet (pruned ones included) and that
    this store has not evicted (its audit log says so: a re-import does not bring them back),
    embedded as ``remember`` embeds them; a session past this memory's ``capacity`` evicts its
    least important items as ``remember`` does."""
    rows = layers.rows
    held = {*rows.working_owners([i.id for i in items]),
            *(e.item_id for user in {i.user_id for i in items} for e in rows.audit_log(user, "working")
              if e.action == "evict")}
    written = restore_working_items(rows, parts.embedder, parts.config.working, parts.lock,
                                    [i for i in items if i.id not in held], parts.now())
    return written, len(items) - written


def restore_scratchpads(parts: Parts, layers: Layers, pads: list[SessionPad]) -> Counts:
    """The scratchpads of the sessions that have none (a session's pad is never overwritten)."""
    with parts.lock, layers.rows.unit() as u:
        written = sum(u.restore_scratchpad(p) for p in pads)
    return written, len(pads) - written


AuditKey = tuple[str, str, str, str, float, str]


def audit_key(e: AuditEntry) -> AuditKey:
    """What tells two audit entries apart (they have no id): every field."""
    return e.user_id, e.layer, e.item_id, e.action, e.at, json.dumps(e.details, sort_keys=True)


def restore_audit(parts: Parts, layers: Layers, entries: list[AuditEntry], logs: dict[str, set[AuditKey]]) -> Counts:
    """The audit entries the log does not hold yet (the same fields), oldest first after the
    ones it holds. ``logs``: each user's log as the import found it, read at the user's first
    batch (the import's own entries are told apart by its first pass, which refuses a repeat)."""
    for user in {e.user_id for e in entries} - set(logs):
        logs[user] = {audit_key(e) for e in layers.rows.audit_log(user)}
    new = sorted((e for e in entries if audit_key(e) not in logs[e.user_id]), key=lambda e: e.at)
    if new:
        with parts.lock, layers.rows.unit() as u:
            for e in new:
                u.audit(e.user_id, e.layer, e.item_id, e.action, e.details, e.at)
    return len(new), len(entries) - len(new)


def _covered(parts: Parts, episodes: list[EpisodeRecord]) -> dict[tuple[str, str], int]:
    """Per (user, session), the last seq of the stored messages the episodes were made from
    (one read of the store per user)."""
    sources: dict[str, set[str]] = {}
    for r in episodes:
        sources.setdefault(r.episode.user_id, set()).update(r.episode.source_ids)
    found = {user: parts.store.get_by_ids(user, sorted(ids)) for user, ids in sources.items() if ids}
    covered: dict[tuple[str, str], int] = {}
    for r in episodes:
        ep = r.episode
        held = found.get(ep.user_id, {})
        seqs = [held[i].seq for i in ep.source_ids if i in held and held[i].session_id == ep.session_id]
        if seqs:
            covered[(ep.user_id, ep.session_id)] = max(covered.get((ep.user_id, ep.session_id), 0), max(seqs))
    return covered
