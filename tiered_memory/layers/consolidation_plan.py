"""What a :func:`~.consolidation.consolidate` run decides, and a dry run's report of it.

The decisions are pure functions (table-tested in ``tests/test_consolidation_decisions.py``):
which facts merge into which (:func:`plan_merges`), which episodes are promoted or archived,
which facts and working items are stale. :func:`preview` is ``consolidate(dry_run=True)``: it
reads what a run would read, takes the same decisions, carries each step's effect into the
next (a merge's duplicates are not pruned; its keeper, with their accesses, is judged as the
merge leaves it) and returns the :class:`ConsolidationReport` the run would, writing nothing
(no row, no audit entry, no vector delete) and asking no model.

What only a model or the session's words would decide is not foreseen: the facts the
``sessions`` and ``promote`` steps would extract (and what they would update, invalidate or
merge with). An episode the ``sessions`` step would make has no id yet: a dry run names it by
its session's id, in ``details["sessions"]`` and, where it would be archived in the same run
(a session older than ``compress_after_days``), in ``details["compress"]``; where it would be
promoted (``promote_access_count=0``), in ``details["promote"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from ..config import ConsolidationConfig
from ..parts import Parts
from ..recall.scoring import recency_score
from ..records import NO_TIME, Episode, Fact, FactCandidate, WorkingItem
from ..slots import text_slot
from ..store.repositories import LayerRepository
from ..types import StoredMessage
from .episodic import EpisodicMemory, said_nothing
from .extractive import NOTHING_SAID, QUOTED_ROLES, read_by
from .resolution import other_slots, says_all_of, turns_saying
from .semantic import SemanticMemory
from .working import decayed

Progress = Callable[[str, int, int], None]
STEPS = ("sessions", "merge", "promote", "compress", "prune")


@dataclass(frozen=True, kw_only=True)
class ConsolidationReport:
    """What one :meth:`TieredMemory.consolidate` run changed (a dry run's: would change)."""

    sessions: int = 0
    merged: int = 0
    promoted: int = 0
    compressed: int = 0
    archived_messages: int = 0
    pruned: int = 0
    details: dict[str, list[str]] = field(default_factory=dict)


def near_pairs(vecs: np.ndarray, threshold: float, block: int = 256) -> list[dict[int, float]]:
    """For each of the unit vectors ``vecs``, the indexes of those (itself included) at
    similarity >= ``threshold``, in order, each with its similarity (pure). A block of rows at
    a time: never every pair at once, which for a user's 50,000 facts is 10 GB."""
    near: list[dict[int, float]] = []
    for start in range(0, len(vecs), block):
        for row in vecs[start:start + block] @ vecs.T:
            at = np.flatnonzero(row >= threshold)
            near.append(dict(zip(at.tolist(), row[at].tolist())))
    return near


def plan_merges(facts: Sequence[Fact], near: Sequence[Mapping[int, float]]) -> list[tuple[str, dict[str, float]]]:
    """Groups of near-duplicates as (keeper id, {duplicate id: its similarity to the keeper}), in
    the order they are to be merged, pure; ``near[i]``: the facts whose similarity to fact ``i`` is
    at the merge threshold or above, with it (:func:`near_pairs`).

    The keeper is the most confident, then most accessed, then oldest fact; a
    duplicate has the same type and polarity, no other slot (``key``) and is near it,
    and the keeper says all it says (:func:`~.resolution.says_all_of`, the rules' test for
    an update): only the keeper's text stays, and "User has a meeting on Tuesday" is 0.95 from
    "... on Monday" (MiniLM and the static embedder).

    Planned again over what is left till nothing merges: a keeper takes its duplicates' accesses,
    which may rank it above a fact it says all of (the next run would merge that one then).
    """
    access = [f.access_count for f in facts]
    gone: set[int] = set()
    plan: list[tuple[str, dict[str, float]]] = []
    while True:
        order = sorted((i for i in range(len(facts)) if i not in gone),
                       key=lambda i: (-facts[i].confidence, -access[i], facts[i].created_at, facts[i].id))
        rank = {i: r for r, i in enumerate(order)}
        taken: set[int] = set()
        found = []
        for i in order:
            if i in taken:
                continue
            taken.add(i)
            dups = [j for j in sorted((int(j) for j in near[i] if int(j) in rank), key=rank.__getitem__)
                    if j not in taken and facts[j].type == facts[i].type and facts[j].polarity == facts[i].polarity
                    and not other_slots(facts[j].key, facts[i].key) and says_all_of(facts[i].text, facts[j].text)]
            taken.update(dups)
            if dups:
                found.append((i, dups))
        if not found:
            return plan
        for i, dups in found:  # as the merge leaves them: the keeper with its duplicates' accesses
            access[i], gone = access[i] + sum(access[j] for j in dups), gone | set(dups)
            plan.append((facts[i].id, {facts[j].id: near[i][j] for j in dups}))


def select_promotions(episodes: Sequence[Episode], min_access: int) -> list[Episode]:
    return [e for e in episodes if e.promoted_at is None and e.access_count >= min_access and not said_nothing(e)]


def select_compressions(episodes: Sequence[Episode], now: float, older_than_days: float) -> list[Episode]:
    return [e for e in episodes if e.compressed_at is None and e.end != NO_TIME  # no time: not old
            and e.end < now - older_than_days * 86400]


def promotion_candidates(episode: Episode, said: Mapping[str, str] | None = None) -> list[FactCandidate]:
    """Facts from a frequently recalled episode: its key facts, else its decisions, else its summary.

    Each in the slot its words name (:func:`~tiered_memory.slots.stated_slot`), as
    the session's own facts are: the rules then see that a later fact of the slot replaced it
    ("User lives in Paris" promoted after "User lives in Berlin"); :func:`consolidate` dates them
    by the episode, so a slot's newer fact stays valid and the promoted one joins its history.

    Each cites the episode's turns that say all it says (:func:`~.resolution.turns_saying`;
    ``said``: the texts of those of its turns the user's store holds, live or archived, by id): a
    fact the session's own turn stated takes in that turn again, not every turn near the end.
    Only where none does (a model's words) it cites the episode's last 20 turns of those, never
    an id ``said`` lacks: an imported episode's source ids are data, and may name another user's
    turn, or one deleted (pure; without ``said``, the last 20 as written)."""
    held: Mapping[str, str] = said or {}
    last = tuple(i for i in episode.source_ids if said is None or i in held)[-20:]
    turns = {i: held[i] for i in episode.source_ids if i in held}

    def sources(text: str) -> tuple[str, ...]:
        return turns_saying(text, turns) or last

    if episode.key_facts:
        texts, type_, confidence = episode.key_facts, "fact", 0.7
    elif episode.decisions:
        texts, type_, confidence = episode.decisions, "decision", 0.7
    else:
        texts, type_, confidence = [episode.summary], "fact", 0.6
    return [FactCandidate(type=type_, text=t, confidence=confidence, source_ids=sources(t), key=key,
                          polarity=polarity) for t in texts for key, polarity in [text_slot(t)]]


def fact_value(confidence: float, last_touch: float, now: float, half_life_days: float) -> float:
    """A fact's value: its confidence, halved every ``half_life_days`` since its last update or access."""
    return confidence * recency_score(last_touch, now, half_life_days)


def should_prune(value: float, access_count: int, age_days: float, *, below: float, min_age_days: float) -> bool:
    return access_count == 0 and age_days >= min_age_days and value < below


class Consolidating(Protocol):
    """What :func:`consolidate` needs: the parts, the layers, and the session and fact
    write-back of :class:`~tiered_memory.layers.longterm.Layers` (which calls it)."""

    parts: Parts
    rows: LayerRepository
    facts: SemanticMemory
    episodes: EpisodicMemory

    def end_session(self, user_id: str, session_id: str, *, evicted_only: bool = False,
                    audit: tuple[str, float] | None = None) -> Episode | None: ...

    def ingest(self, user_id: str, candidates: Sequence[FactCandidate], metadata: dict[str, Any],
                     messages: Sequence[Any] = (), at: float | None = None) -> list[Fact]: ...

    def pending_spans(self, user_id: str, session_id: str) -> list[list[StoredMessage]]: ...


def unfinished(user_id: str, report: ConsolidationReport, left: Sequence[tuple[str, str]],
               tried: dict[str, int], error: Exception) -> str:
    """The message of a run that the LLM kept from finishing (pure): what it left, what it did."""
    what = {"sessions": ("idle session", "compressed"), "promote": ("episode", "promoted")}
    parts = []
    for step, (noun, verb) in what.items():
        ids = [i for s, i in left if s == step]
        if ids:
            shown = ", ".join(repr(i) for i in ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            plural = "s" if tried[step] != 1 else ""
            parts.append(f"{len(ids)} of {tried[step]} {noun}{plural} {'was' if len(ids) == 1 else 'were'} "
                         f"not {verb}: {shown}")
    done = ", ".join(f"{k} {getattr(report, k)}" for k in
                     ("sessions", "merged", "promoted", "compressed", "archived_messages", "pruned"))
    return (f"consolidate of user {user_id!r} did not finish: {'; '.join(parts)} (the LLM failed: {error}). "
            f"Everything else was done and kept ({done}); run consolidate again once the model answers: "
            "it does only what is left")


def stale_fact(f: Fact, now: float, cfg: ConsolidationConfig) -> bool:
    """Should the prune step remove ``f``? (pure; a time that could not be read has no age)"""
    return f.updated_at != NO_TIME and should_prune(
        fact_value(f.confidence, max(f.updated_at, f.last_access or 0.0), now, cfg.prune_fact_half_life_days),
        f.access_count, (now - f.updated_at) / 86400, below=cfg.prune_below, min_age_days=cfg.prune_min_age_days)


def stale_item(i: WorkingItem, now: float, decay_per_hour: float, cfg: ConsolidationConfig) -> bool:
    """Should the prune step remove working item ``i``? (pure) Not before it is as old as
    ``session_idle_hours``: till then its session may still be running, and an item noted
    with importance 0 would go before anything could read it."""
    return i.created_at != NO_TIME and should_prune(
        decayed(i.importance, i.created_at, now, decay_per_hour), i.access_count, (now - i.created_at) / 86400,
        below=cfg.prune_below, min_age_days=cfg.session_idle_hours / 24)


def preview(layers: Consolidating, user_id: str, *, progress: Progress | None = None,
            now: float | None = None) -> ConsolidationReport:
    """The report :func:`~.consolidation.consolidate` would return for ``user_id`` at ``now``,
    writing nothing (see the module docstring)."""
    working_now = layers.parts.now() if now is None else now
    now = time.time() if now is None else now
    cfg = layers.parts.config.consolidation
    tick: Progress = progress or (lambda step, done, total: None)
    details: dict[str, list[str]] = {s: [] for s in STEPS}

    idle = layers.rows.idle_sessions(user_id, now - cfg.session_idle_hours * 3600)
    made: list[Episode] = []  # the episodes the sessions step would make, named by their session
    for n, sid in enumerate(idle, 1):
        spans = layers.pending_spans(user_id, sid)
        if spans:
            details["sessions"].append(sid)
            # a span where nothing was said makes an episode that says so (never promoted)
            made += [Episode(id=sid, user_id=user_id, session_id=sid, source_ids=[m.id for m in span],
                             summary="" if read_by(span, QUOTED_ROLES) else NOTHING_SAID,
                             end=max(m.timestamp for m in span)) for span in spans]
        tick("sessions", n, len(idle))

    facts, vecs = layers.facts.vectors(user_id)
    plan = plan_merges(facts, near_pairs(vecs, cfg.merge_similarity)) if len(facts) >= 2 else []
    left = {f.id: f for f in layers.facts.select(user_id)}  # as the merges leave them, for the prune
    for n, (keep, dups) in enumerate(plan, 1):
        details["merge"] += dups
        group = [left[i] for i in [keep, *dups] if i in left]
        if keep in left:
            left[keep] = replace(left[keep], access_count=sum(f.access_count for f in group),
                                 last_access=max((f.last_access for f in group if f.last_access is not None),
                                                 default=None),
                                 updated_at=max(f.updated_at for f in group))
        for d in dups:
            left.pop(d, None)
        tick("merge", n, len(plan))

    episodes = layers.episodes.select(user_id)
    # those the sessions step makes are the run's to promote too (unaccessed: with a count of 0)
    promote = select_promotions([*episodes, *made], cfg.promote_access_count)
    for n, ep in enumerate(promote, 1):
        details["promote"].append(ep.id)
        tick("promote", n, len(promote))

    todo = select_compressions([*episodes, *made], now, cfg.compress_after_days)
    held = layers.parts.store.get_by_ids(user_id, [i for ep in todo for i in ep.source_ids])
    archived: set[str] = set()
    for n, ep in enumerate(todo, 1):
        details["compress"].append(ep.id)
        archived.update(i for i in ep.source_ids if i in held)  # a turn two episodes cite moves once
        tick("compress", n, len(todo))

    decay = layers.parts.config.working.decay_per_hour
    doomed = [f.id for f in left.values() if stale_fact(f, now, cfg)]
    stale = [i.id for i in layers.rows.live_working_items(user_id) if stale_item(i, working_now, decay, cfg)]
    for n, item_id in enumerate([*doomed, *stale], 1):
        details["prune"].append(item_id)
        tick("prune", n, len(doomed) + len(stale))
    return report_of(details, len(archived))


def report_of(details: dict[str, list[str]], archived: int) -> ConsolidationReport:
    """The report of a run (or a dry run) that did what ``details`` names (pure)."""
    return ConsolidationReport(
        sessions=len(details["sessions"]), merged=len(details["merge"]), promoted=len(details["promote"]),
        compressed=len(details["compress"]), archived_messages=archived, pruned=len(details["prune"]),
        details=details)
