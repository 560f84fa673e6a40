"""What a fact write does inside its unit of work, beside its own change: the fact it decided
on read again and held (:func:`held`), the other facts of a slot it moves a fact into made
invalid (:func:`one_in_slot_written`), its history entry (:func:`log_change`), a soft delete
(:func:`soft_delete`).

A write decides on facts it read before its transaction began (resolution's nearest facts, an
edit's fact as it was): another process may delete, invalidate or rewrite one meanwhile, and a
write acting on the row as read brings a deleted fact back, confirms an invalidated one or
writes an edit's old values over another's. So each write reads the fact again inside its unit,
held there till it commits (a row lock on PostgreSQL; SQLite's write transaction excludes every
other writer), and one no longer as read rolls the unit back (:class:`Stale`): its caller
decides again on the fact as it is now.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..config import FactConfig
from ..errors import NotFoundError
from ..records import Fact, FactChange
from ..store.repositories import FactWrites
from .changes import bounded_details
from .resolution import Resolution, one_in_slot

#: what a resolution (``add_fact``, a session's facts) decides on in a fact it names; the values
#: it merges in (sources, metadata, confidence) are the held row's
DECIDED = ("valid", "text", "type", "key", "polarity")
#: what an edit (``update_fact``) writes back of a fact's values: all of them it does not change
EDITED = (*DECIDED, "confidence", "metadata")

#: how many times a write decides again before it gives up (another writer changing its fact each time)
TRIES = 3

#: the StoreError of a write whose fact another writer changed each time it was read
CHANGING = ("{what} was not written: another writer changed the fact it acts on each of the {tries} times it "
            "was read (nothing of it is stored); write it again")

#: the VectorIndexError of a fact write the vector engine failed before its rows committed
UNWRITTEN = "{what} wrote nothing: the vector engine failed ({error}); write it again once the engine works"

#: the VectorIndexError of a fact write whose row was written and its vector not
UNINDEXED = ("fact {id} was {done}, but the vector engine failed ({error}). Where one engine holds rows and "
             "vectors, nothing was written: write it again. Otherwise it is stored (facts() lists it, "
             "search_facts finds it by its words), marked for indexing: the next open, or rebuild_index(), "
             "writes its vector; do not write it again")


class Stale(Exception):
    """The fact a write decided on is gone or changed since it was read: the write's unit rolls
    back (nothing of it is written) and its caller decides again."""


def held(u: FactWrites, read: Fact, fields: Sequence[str], gone: Exception, *, rivals: Sequence[Fact] = ()) -> Fact:
    """``read`` as ``u`` holds it till it commits; raises ``gone`` if it was deleted since the
    read, :class:`Stale` if one of its ``fields`` changed. ``rivals``: the facts of the slot it
    moves into (:func:`one_in_slot_written`), held in the same statement, in its one order (by
    id): held after it, in a second, two edits moving facts into each other's slots each held
    its own and waited for the other's (a deadlock, which PostgreSQL breaks by failing one)."""
    found = [f for f in u.held_facts(read.user_id, [read.id, *(r.id for r in rivals)]) if f.id == read.id]
    if not found:
        raise gone
    if any(getattr(found[0], f) != getattr(read, f) for f in fields):
        raise Stale(read.id)
    return found[0]


def named(target: Fact | None, resolution: Resolution) -> Fact:
    """The fact an update or invalidation acts on, as read; one it names that is gone is not found."""
    if target is None:
        raise NotFoundError(f"no fact {resolution.target_id!r} for this user")
    return target


def one_in_slot_written(u: FactWrites, moved: Fact, rivals: Sequence[Fact], *, at: float, now: float, by: str,
                        config: FactConfig, max_bytes: int) -> list[str]:
    """Write :func:`~.resolution.one_in_slot`'s plan for ``moved`` and its slot's ``rivals`` (its
    other valid facts as read: those still so, held; one deleted, invalidated or moved since is no
    rival) inside the caller's unit, which :func:`held` them with ``moved``; returns the vector ids
    of the rivals it invalidates."""
    found = {f.id: f for f in u.held_facts(moved.user_id, [r.id for r in rivals])} if rivals else {}
    still = [r for r in rivals if r.id in found and all(getattr(found[r.id], f) == getattr(r, f) for f in DECIDED)]
    plan = one_in_slot(moved, still, at, same=config.same_similarity, merge=config.merge_similarity, by=by)
    for old, new, since, reason in plan:
        u.invalidate_fact(old.user_id, old.id, at=since, superseded_by=new.id, updated_at=now)
        log_change(u, old.user_id, old.id, "invalidate", old.text, None, now,
                   {"reason": reason, "method": "rules", "superseded_by": new.id, "invalid_from": since},
                   max_bytes=max_bytes)
    return [f"fact:{old.id}" for old, *_ in plan if old.id != moved.id]  # whose vector its caller drops


def log_change(u: FactWrites, user_id: str, fact_id: str, action: str, old: str | None, new: str | None,
               at: float, details: dict[str, Any], *, max_bytes: int) -> None:
    """Record one change in the fact history, inside the caller's unit of work, its ``details``
    held to ``max_bytes`` (``MemoryConfig.max_metadata_bytes``: what an import takes, so every
    entry exports) by :func:`~.changes.bounded_details`. Every history write goes through here."""
    u.record_history(user_id, FactChange(fact_id=fact_id, action=action, old_text=old, new_text=new, at=at,
                                         details=bounded_details(details, max_bytes)))


def soft_delete(u: FactWrites, user_id: str, fact_id: str, action: str, now: float,
                details: dict[str, Any], *, max_bytes: int) -> bool:
    """Hide a fact (merge, prune) inside the caller's unit of work; kept for audit, its vector owed
    till the caller's index deletes it. False (and nothing logged) if it was not live: deleted or
    hidden by another call since it was read."""
    old = u.soft_delete_fact(user_id, fact_id, now)
    if old is not None:
        u.owe_vectors(user_id, vectors=[f"fact:{fact_id}"])
        log_change(u, user_id, fact_id, action, old, None, now, details, max_bytes=max_bytes)
    return old is not None
