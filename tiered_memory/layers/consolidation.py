"""Keeping memory tidy over months: :func:`consolidate`.

Steps, each a pure decision (table-tested) followed by small transactions, so the
whole run is idempotent and safe to interrupt and rerun (finished work is marked:
``deleted_at``, ``promoted_at``, ``compressed_at``, the session cursor):

1. ``sessions``: idle sessions with turns no episode covers are compressed (a ``summarise``
   audit entry for each episode, in its transaction).
2. ``merge``: near-duplicate facts are merged into the best one (soft delete + history:
   ``merge`` for each duplicate, ``absorb`` for the fact that took them in).
3. ``promote``: episodes accessed at least ``promote_access_count`` times become facts.
4. ``compress``: episodes older than ``compress_after_days`` move their raw messages to
   ``messages_archive``, out of the hot keyword and vector indexes (or delete them
   with ``delete_raw``, and their texts from the process's caches,
   :func:`~tiered_memory.textcache.forget_texts`).
5. ``prune``: facts and working items whose decayed value fell below ``prune_below``
   and that were never accessed are soft-deleted with an audit record (a fact once
   ``prune_min_age_days`` old, a working item once ``session_idle_hours`` old). A working
   item's age is judged by the memory's clock (``TieredMemory(clock=)``), as working memory
   and ``build_context`` judge it; the other steps go by the system clock, as the turns,
   facts and episodes are dated.

Under ``LLMConfig.strict`` a session or episode the LLM failed on is left as it was and
the other steps go on; the LLM's error is raised at the end, naming what was left and what
was done (:func:`unfinished`).

``consolidate(dry_run=True)`` returns the report a run would, writing nothing
(:func:`~.consolidation_plan.preview`, beside the steps' pure decisions).

Steps 4 and 5 judge age; a record whose time is :data:`~tiered_memory.records.NO_TIME` (one a
read could not take, from another writer) has none, and is neither compressed nor pruned.
"""

from __future__ import annotations

import time
from typing import Sequence

from ..errors import LLMError, LLMOutputError, NotFoundError
from ..recall.chunking import CHUNK_OVER
from ..recall.forgetting import delete_owed
from ..recall.indexing import index_orphans
from ..records import NO_TIME, Episode
from ..store.pending_deletes import entries
from ..textcache import forget_texts
from .consolidation_plan import (  # the decisions: their names importable from here as before
    STEPS,
    Consolidating,
    ConsolidationReport,
    Progress,
    near_pairs,
    plan_merges,
    preview,
    promotion_candidates,
    report_of,
    select_compressions,
    select_promotions,
    should_prune,
    stale_fact,
    stale_item,
    unfinished,
)
from .fact_unit import log_change, soft_delete

__all__ = ["STEPS", "Consolidating", "ConsolidationReport", "Progress", "consolidate", "near_pairs", "plan_merges",
           "promotion_candidates", "select_compressions", "select_promotions", "should_prune", "unfinished"]


def consolidate(layers: Consolidating, user_id: str, *, progress: Progress | None = None,
                      now: float | None = None, dry_run: bool = False) -> ConsolidationReport:
    """Run every step for ``user_id`` at ``now`` (default: the system clock, and the memory's
    clock for working items); see the module docstring. ``dry_run``: the report this run would
    return, nothing written (:func:`~.consolidation_plan.preview`)."""
    if dry_run:
        return preview(layers, user_id, progress=progress, now=now)
    # a forget_user of theirs that a failure interrupted is finished before anything is read: finished
    # by the first write, it would leave what the run drew from those rows (a promoted fact)
    with layers.parts.writing(user_id):
        pass
    working_now = layers.parts.now() if now is None else now
    now = time.time() if now is None else now
    cfg = layers.parts.config.consolidation
    tick: Progress = progress or (lambda step, done, total: None)
    details: dict[str, list[str]] = {s: [] for s in STEPS}

    # what a strict-mode LLM failure left (step, session or episode id, error): the other steps
    # go on, and the error is raised at the end, naming these (one poisoned session must not
    # keep every later run from merging, archiving and pruning)
    left: list[tuple[str, str, LLMError]] = []
    idle = layers.rows.idle_sessions(user_id, now - cfg.session_idle_hours * 3600)
    for n, sid in enumerate(idle, 1):
        held = {e.id for e in layers.episodes.select(user_id, sid)}
        try:
            # audited at the run's time, as its other steps are: the log reads in time order
            ep = layers.end_session(user_id, sid, audit=("summarise", now))
        except LLMError as e:  # nothing of the session was written (end_session asks before it writes)
            left.append(("sessions", sid, e))
            ep = None
        except NotFoundError:  # its turns were cleared or forgotten since `idle` was read: nothing to do
            ep = None
        if ep is not None and ep.id not in held:  # not one another run made since `idle` was read
            details["sessions"].append(ep.id)
        tick("sessions", n, len(idle))

    merged = _merge(layers, user_id, now, cfg.merge_similarity, tick)
    details["merge"] = merged

    episodes = layers.episodes.select(user_id)
    promote = select_promotions(episodes, cfg.promote_access_count)
    for n, ep in enumerate(promote, 1):
        try:
            _promote(layers, user_id, ep, now, details)
        except LLMError as e:  # not marked promoted: the next run ingests it again (a no-op for what is known)
            left.append(("promote", ep.id, e))
        tick("promote", n, len(promote))

    archived = _compress(layers, user_id, episodes, now, tick, details)
    details["prune"] = _prune(layers, user_id, now, tick, working_now)
    report = report_of(details, archived)
    if left:
        first = left[0][2]
        error = LLMOutputError if isinstance(first, LLMOutputError) else LLMError
        raise error(unfinished(user_id, report, [(step, i) for step, i, _ in left],
                               {"sessions": len(idle), "promote": len(promote)}, first)) from first
    return report


def _promote(layers: Consolidating, user_id: str, ep: Episode, now: float, details: dict[str, list[str]]) -> None:
    """Facts of ``ep``, written with its mark under the user's lock (no model is asked: its points are
    resolved by the rules): a deletion of the user's (forget_user, delete_episode, forget) either
    finished before it is read again here, or waits for the writes and takes them too."""
    with layers.parts.writing(user_id):
        # read again: the user may have deleted it since (its facts must not appear then), and
        # another run (a worker, a thread) may have promoted it: that run's to count and audit;
        # one that does so during the ingest finds the facts known (its ingest is a no-op)
        if ep.id not in layers.episodes.load(user_id, [ep.id]):
            return
        # the texts of its turns the user holds (an imported episode may cite any id): what each point cites
        said = {i: t.content for i, t in layers.rows.archived_by_ids(user_id, ep.source_ids).items()}
        said.update((i, m.content) for i, m in layers.parts.store.get_by_ids(user_id, ep.source_ids).items())
        layers.ingest(user_id, promotion_candidates(ep, said), {"method": "promotion", "episode_id": ep.id},
                      at=None if ep.end == NO_TIME else ep.end)  # said then, not now
        with layers.rows.unit() as u:
            if u.mark_promoted(ep.id, now):
                u.audit(user_id, "episode", ep.id, "promote", {"access_count": ep.access_count}, now)
                details["promote"].append(ep.id)


def _merge(layers: Consolidating, user_id: str, now: float, threshold: float, tick: Progress) -> list[str]:
    facts, vecs = layers.facts.vectors(user_id)
    if len(facts) < 2:
        return []
    plan, merged = plan_merges(facts, near_pairs(vecs, threshold)), []
    planned_as = {f.id: (f.text, f.type, f.polarity, f.key) for f in facts}
    limit = layers.parts.config.max_metadata_bytes  # each history entry's details (log_change)
    for n, (keep, planned) in enumerate(plan, 1):

        def merge() -> list[str]:
            with layers.rows.unit() as u:
                # read again in the write's transaction, held till it commits: another call or
                # process may have deleted, replaced or edited (into what its keeper may not say)
                # some of the group since the plan; without its keeper it waits for the next run
                by_id = {f.id: f for f in u.held_facts(user_id, [keep, *planned])
                         if f.valid and (f.text, f.type, f.polarity, f.key) == planned_as[f.id]}
                dups = [d for d in planned if d in by_id] if keep in by_id else []
                if not dups:
                    return []
                sources = list(dict.fromkeys(s for i in [keep, *dups] for s in by_id[i].source_ids))
                # updated_at stays the newest of the group: a merge is not new evidence
                u.absorb_facts(keep, source_ids=sources,
                               access_count=sum(by_id[d].access_count for d in dups),
                               last_access=max((a for d in dups if (a := by_id[d].last_access) is not None),
                                               default=None),
                               updated_at=max(by_id[i].updated_at for i in [keep, *dups]))
                # why each went: its similarity to the keeper (rounded: a reading, not a key)
                gone = [d for d in dups if soft_delete(u, user_id, d, "merge", now, {
                    "merged_into": keep, "similarity": round(planned[d], 3)}, max_bytes=limit)]
                if gone:  # the keeper changed too: its history says from what, what it took in and
                    was = by_id[keep]  # what it was (enough to explain the merge, or undo it)
                    log_change(u, user_id, keep, "absorb", was.text, was.text, now, {
                        "absorbed": gone, "source_ids": [s for s in sources if s not in was.source_ids],
                        "before": {"access_count": was.access_count, "last_access": was.last_access,
                                   "updated_at": was.updated_at}}, max_bytes=limit)
            owed = entries(user_id, vectors=[f"fact:{d}" for d in dups])  # by soft_delete, till paid
            delete_owed(layers.parts.store.owed_rows, layers.parts.index, owed, what="merged facts are")
            return dups

        with layers.parts.writing(user_id):  # one transaction where one engine holds rows and vectors
            merged.extend(layers.parts.jointly(merge))
        tick("merge", n, len(plan))
    return merged


def _compress(layers: Consolidating, user_id: str, episodes: Sequence[Episode], now: float, tick: Progress,
              details: dict[str, list[str]], batch: int = 25) -> int:
    cfg = layers.parts.config.consolidation
    todo = select_compressions(episodes, now, cfg.compress_after_days)
    done = details["compress"]
    moved = 0
    for start in range(0, len(todo), batch):  # one transaction and one vector delete per batch
        part = todo[start:start + batch]

        def archive() -> int:
            archived = 0
            held = layers.parts.store.get_by_ids(user_id, [i for ep in part for i in ep.source_ids])
            long = {i for i, m in held.items() if len(m.content) > CHUNK_OVER}  # those have chunk vectors
            with layers.rows.unit() as u:
                for ep in part:
                    if not u.mark_compressed(ep.id, now):  # another run compressed it since the read
                        continue
                    count = u.archive_messages(user_id, ep.source_ids, ep.id, now, delete=cfg.delete_raw)
                    u.audit(user_id, "episode", ep.id, "delete_raw" if cfg.delete_raw else "archive",
                            {"messages": count}, now)
                    done.append(ep.id)
                    archived += count
            # after the commit (in it where one engine holds rows and vectors): a crash or an index
            # failure here leaves them owed, deleted by the next open or write. Only the
            # vectors of the user's turns: an episode's source ids are data (an import takes them as
            # written), and the vector index deletes by id, whoever's vector it is
            turns = [i for ep in part for i in ep.source_ids if i in held]  # owed by archive_messages
            delete_owed(layers.parts.store.owed_rows, layers.parts.index, entries(user_id, turns=turns),
                        what="archived turns are", long=long)
            # a live turn stored as a duplicate of an archived one gets its own vector: in the same
            # transaction there, since such a store has no start-up repair to index it later
            index_orphans(layers.parts.store, layers.parts.index, layers.parts.embedder, user_id,
                          layers.parts.config.dedup_threshold)
            return archived

        with layers.parts.writing(user_id):
            moved += layers.parts.jointly(archive)
        for n, _ in enumerate(part, start + 1):
            tick("compress", n, len(todo))
    if moved and cfg.delete_raw:  # their texts are gone from the store: from the process too
        forget_texts()
    return moved


def _prune(layers: Consolidating, user_id: str, now: float, tick: Progress, working_now: float) -> list[str]:
    cfg = layers.parts.config.consolidation
    decay = layers.parts.config.working.decay_per_hour
    limit = layers.parts.config.max_metadata_bytes
    pruned: list[str] = []
    with layers.parts.writing(user_id):
        # the accesses noted since the run began (a context built while it asked the LLM) count:
        # what a read just handed to a model is in use, not stale; the lock keeps other writers out
        # from here to the last prune, so a fact is judged as it is, not as it was at the run's start
        layers.parts.access.flush()
        doomed = [f for f in layers.facts.select(user_id) if stale_fact(f, now, cfg)]
        stale = [i.id for i in layers.rows.live_working_items(user_id) if stale_item(i, working_now, decay, cfg)]
        total = len(doomed) + len(stale)
        for n, f in enumerate(doomed, 1):
            def prune() -> bool:
                with layers.rows.unit() as u:  # a progress callback (or another worker) may have removed it
                    gone = soft_delete(u, user_id, f.id, "prune", now, {"confidence": f.confidence},
                                       max_bytes=limit)
                if gone:  # its vector owed by soft_delete till the index deletes it
                    delete_owed(layers.parts.store.owed_rows, layers.parts.index,
                                entries(user_id, vectors=[f"fact:{f.id}"]), what="a pruned fact is")
                return gone

            if layers.parts.jointly(prune):  # one transaction where one engine holds rows and vectors
                pruned.append(f.id)
            tick("prune", n, total)
        for n, item_id in enumerate(stale, start=len(doomed) + 1):
            with layers.rows.unit() as u:  # another worker may have evicted or pruned it since the read
                if u.retire_working_item(item_id, working_now):
                    u.audit(user_id, "working", item_id, "prune", {}, working_now)
                    pruned.append(item_id)
            tick("prune", n, total)
    return pruned
