"""Bringing the facts' and episodes' vectors in line with their rows: the facts' pending pass at
every open (:func:`index_pending_facts`), and a full repair's (after an unclean close) of the
vectors no row holds and those missing (:func:`repair_layer_vectors`).

A fact's row is stored pending by the unit that writes it and settled once the index has its
vector (:class:`~..store.repositories.PendingVectorSource`); the pending pass writes what is
still pending, in row order, and settles it. A full repair marks pending the rows whose vectors
are missing, for that pass; ``rebuild_index`` re-embeds the layers (:func:`reindex_facts`,
:func:`reindex_episodes`), settling each row written.

Invariants:

- One pass in row order (a cursor past each batch read), so it ends though other workers write
  meanwhile; a fact another call revised while this one embedded it stays pending (its
  settlement names the text and time written) for the next pass. A re-embedding writes a vector
  into a fact's row only while the row, held in that write, still says the text embedded.
- A pending fact that is no longer live (deleted, invalid) has no vector: the pass deletes its
  id's, and settles it.
- One fact the index refuses holds back no other: a batch refused is sent again in halves
  (:class:`~..recall.skipping.SkippingPass`), the fact refused alone is logged and left pending
  for the next pass, the others are written and settled; an engine that is down stops the pass.
- A fact or episode the index refuses while the layers are re-embedded is skipped the same way
  and left pending (a rebuild's rows were settled: marked pending again), so the next pending
  pass writes it; the other rows and users are written all the same.
- A full repair marks pending every fact and episode whose vector is missing, and the pending
  pass after it writes them: only those rows are re-embedded, and one the pass never reached
  (the engine went down, anything raised) is written by the next, never left settled without a
  vector.
- An episode's key points are written only once the deletions its id still owes the index are
  paid (:func:`~..recall.forgetting.pay_before_storing`), by every pass (else a later payment
  deletes them); a fact's need not be: an owed fact id is never stored again (its history,
  kept with the entry, makes an import skip it).
- A full repair's vector no row holds that the index refuses to delete is owed
  (:func:`~..recall.forgetting.delete_strays`), paid by the next open or write, and the missing
  vectors are written all the same.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

from ..embedding import Embedder, embed
from ..errors import VectorIndexError
from ..guard import vector_errors_typed
from ..recall.forgetting import delete_strays
from ..recall.indexing import LEFT_PENDING, UNREPAIRED
from ..recall.skipping import SkippingPass, raise_or_hand_on, summary_error
from ..records import Episode, Fact
from ..store.pending_deletes import NO_USER, VECTOR, OwedRows, OwedVector
from ..store.repositories import EpisodeRepository, FactRepository, FactWrites, LayerRepository, PendingVectorSource
from ..vector.base import VectorIndex, VectorItem


def fact_item(fact: Fact, vector: Any) -> VectorItem:
    """The vector index's item of ``fact`` (its id ``fact:<id>``)."""
    return VectorItem(id=f"fact:{fact.id}", vector=vector, user_id=fact.user_id, layer="fact",
                      timestamp=fact.updated_at)


def write_fact_vectors(rows: object, index: VectorIndex, pairs: Sequence[tuple[Fact, Any]], *,
                       failed: str | None = None) -> None:
    """Write the vectors of ``pairs`` (each fact with its vector; ``None``: one that wants none,
    invalid or deleted) into the index, then settle those facts' rows (a ``rows`` offering
    :class:`~..store.repositories.PendingVectorSource`): each marked indexed unless its text
    changed since it was read, so the vector of its old text is never taken for its own.
    ``failed``: what the index raises becomes a :class:`VectorIndexError` of this message (its
    ``{error}`` the cause), and nothing is settled."""
    if wanted := [fact_item(f, v) for f, v in pairs if v is not None]:
        with contextlib.nullcontext() if failed is None else vector_errors_typed(failed):
            index.upsert(wanted)
    if pairs and isinstance(rows, PendingVectorSource):
        rows.settle_facts([(f.id, f.text, f.updated_at) for f, _ in pairs])


def index_pending_facts(rows: PendingVectorSource, index: VectorIndex, embedder: Embedder, *,
                        batch: int = 256, skipped: list[VectorIndexError] | None = None) -> int:
    """Write the vectors of the facts left pending (stored or revised, their vector not yet
    written) and settle them; returns how many pending facts the pass read. ``skipped``: the
    error of the facts the index refused (the others written) goes there, not raised, for a
    caller with more passes to run first.

    Raises:
        VectorIndexError: facts the index refused were skipped (the others written; raised once
            the pass is done), or the engine is down (:data:`~..recall.skipping.DOWN_AFTER`);
            what is not written stays pending.
    """
    after, seen = 0, 0
    skipping = SkippingPass[tuple[Fact, bool]](what="fact", name=lambda entry: repr(entry[0].id))
    while found := rows.pending_facts(after, batch):
        live = [f for _, f, alive in found if alive]
        vectors = dict(zip([f.id for f in live], embed(embedder, [f.text for f in live]))) if live else {}

        def written(part: Sequence[tuple[Fact, bool]]) -> None:
            # no debt to pay first, unlike turns': an owed fact id's history entry (kept with it) makes imports skip it
            failed = LEFT_PENDING.format(n=len(part), what="fact")
            if dead := [f"fact:{f.id}" for f, alive in part if not alive]:  # none wanted
                with vector_errors_typed(failed):
                    index.delete(dead)
            write_fact_vectors(rows, index, [(f, vectors[f.id] if alive else None)  # noqa: B023 (run now)
                                             for f, alive in part], failed=failed)

        skipping.write([(f, alive) for _, f, alive in found], written)
        after, seen = found[-1][0], seen + len(found)
    _left_pending(skipping, "fact", skipped)
    return seen


def episode_of_point(point_id: str) -> str:
    """The episode id of a key point's vector id ``ep:<episode id>:<n>`` (pure; an episode id may
    hold ``:``, an import keeps ids)."""
    return point_id.removeprefix("ep:").rpartition(":")[0]


def _left_pending(skipping: SkippingPass[Any], what: str, skipped: list[VectorIndexError] | None) -> None:
    """The error of the rows ``skipping`` left pending (``what``: fact, episode), raised or, with
    ``skipped``, put there; nothing when none was."""
    if skipping.error is not None:
        raise_or_hand_on([summary_error(LEFT_PENDING.format(n=len(skipping.skipped), what=what), skipping.error)],
                         skipped)


def _pend(rows: object, facts: Sequence[str] = (), episodes: Sequence[str] = ()) -> None:
    """Leave the rows the index refused pending (a full repair's were settled), for the next pass."""
    if (facts or episodes) and isinstance(rows, PendingVectorSource):
        rows.pend(facts, episodes)


def reindex_facts(rows: FactRepository, index: VectorIndex, embedder: Embedder, user_id: str | None, *,
                  skipped: list[VectorIndexError] | None = None) -> int:
    """Re-embed and write the vectors of every live fact (of ``user_id``, or everyone's: a full
    repair, ``rebuild_index``) and settle them; returns how many. A fact the index refuses is
    skipped (:class:`~..recall.skipping.SkippingPass`) and left pending for the next pass, the
    others written; ``skipped``: its error goes there, not raised.

    Raises:
        VectorIndexError: facts were refused (the others written), or the engine is down.
    """
    facts = sorted(rows.valid_facts(user_id), key=lambda f: f.user_id)  # a batch holds few users' facts
    skipping = SkippingPass[Fact](what="fact", name=lambda f: repr(f.id))
    try:
        for start in range(0, len(facts), 256):
            read = facts[start:start + 256]
            vectors = dict(zip([f.id for f in read], embed(embedder, [f.text for f in read])))
            with rows.unit() as u:  # keep the stored vectors in step with the embedder
                part = _still_said(u, read)
                u.set_fact_vectors([(f.id, vectors[f.id]) for f in part])

            skipping.write(part, lambda some: write_fact_vectors(
                rows, index, [(f, vectors[f.id]) for f in some], failed=UNREPAIRED))  # noqa: B023 (run now)
    finally:
        _pend(rows, facts=[f.id for f in skipping.skipped])
    _left_pending(skipping, "fact", skipped)
    return len(facts)


def _still_said(u: FactWrites, read: Sequence[Fact]) -> list[Fact]:
    """The facts of ``read`` that ``u`` holds (till it commits) still valid and saying the text
    read, as they are now: another writer's edit or update since the read stored its own text's
    vector and marked the row pending (its vector is its writer's to write, or the pending
    pass's), a delete or an invalidation left none to write."""
    now: dict[str, Fact] = {}
    for user in dict.fromkeys(f.user_id for f in read):
        now.update((f.id, f) for f in u.held_facts(user, sorted(f.id for f in read if f.user_id == user)))
    return [now[f.id] for f in read if f.id in now and now[f.id].valid and now[f.id].text == f.text]


def reindex_episodes(rows: EpisodeRepository, user_id: str | None, index_some: Callable[[Sequence[Episode]], None],
                     *, batch: int = 64, skipped: list[VectorIndexError] | None = None) -> int:
    """Re-embed and write the key points of every episode (of ``user_id``, or everyone's), ``batch``
    at a time by ``index_some`` (which pays their ids' owed deletions first, writes them in one
    call and settles them); returns how many. One the index refuses is skipped (the batch sent
    again in halves) and left pending for the next pass, the others written; ``skipped``: its
    error goes there.

    Raises:
        VectorIndexError: episodes were refused (the others written), or the engine is down.
    """
    eps = rows.episodes_of(user_id)
    skipping = SkippingPass[Episode](what="episode", name=lambda ep: repr(ep.id))
    try:
        for start in range(0, len(eps), batch):
            skipping.write(eps[start:start + batch], index_some)
    finally:
        _pend(rows, episodes=[ep.id for ep in skipping.skipped])
    _left_pending(skipping, "episode", skipped)
    return len(eps)


def repair_layer_vectors(rows: LayerRepository, index: VectorIndex, owed: OwedRows,
                         *, skipped: list[VectorIndexError] | None = None) -> dict[str, int]:
    """Make the fact and episode vectors match their rows (a full repair): drop the vectors no
    row holds (one the index refuses is owed: :func:`~..recall.forgetting.delete_strays`), and
    mark pending the rows whose vectors are missing, for the pending pass that follows (the
    caller's: it writes those rows alone, each id's owed deletions paid first, and settles each);
    returns the report. ``skipped``: the error of the vectors the index refused to drop goes
    there, not raised, for a caller with more passes to run first.

    Raises:
        VectorIndexError: the index failed to list vectors, or refused to drop some (the rest
            done), or the engine is down.
    """
    want = {f"fact:{i}" for i in rows.valid_fact_ids()} | rows.point_ids()
    with vector_errors_typed(UNREPAIRED):  # a custom index may raise anything
        have = {i for i in index.ids() if i.startswith(("fact:", "ep:"))}
    missing = want - have
    # pending until written, by the pending pass: only the rows whose vectors are missing are
    # re-embedded (not every row of the store for one lost vector), and a pass cut short (the
    # engine down, any raise, the strays' deletion too) leaves those it never reached pending
    _pend(rows, facts=sorted(i.removeprefix("fact:") for i in missing if i.startswith("fact:")),
          episodes=sorted({episode_of_point(i) for i in missing if i.startswith("ep:")}))
    stray = sorted(have - want)
    removed, refused = delete_strays(owed, index, stray, lambda i: OwedVector(NO_USER, VECTOR, i))
    report = {"layer_vectors_removed": removed, "layer_vectors_missing": len(missing)}
    if refused is not None:
        report["layer_vectors_stray_owed"] = len(stray) - removed
    raise_or_hand_on([refused], skipped)
    return report
