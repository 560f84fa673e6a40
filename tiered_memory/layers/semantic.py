"""Semantic memory: typed facts about a user, resolved against what is already known.

Each new fact candidate is compared with the user's related facts and resolved
by :func:`~tiered_memory.layers.resolution.decide_resolution` (pure) as ``add``,
``update`` (merge into an existing fact), ``invalidate`` (a contradiction: the old fact
is marked invalid from a time, never destroyed, and the new one is added) or ``noop``. An LLM judgement is used
when one is available and valid; otherwise rules decide. Every change is written to
the fact history.
"""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from ..config import FactConfig, RetrievalConfig
from ..embedding import Embedder, embed, embed_query
from ..errors import InvalidInputError, NotFoundError, StoreError, VectorIndexError
from ..guard import vector_errors_typed
from ..recall import forgetting, hybrid
from .resolution import Judgement, Resolution, decide_resolution, rewritten_slot, slotted
from ..records import Fact, FactCandidate, FactChange
from .fact_restore import FactBatch, restore_facts
from .layer_repair import index_pending_facts, reindex_facts, write_fact_vectors
from .changes import edit_details, merge_metadata, metadata_details, stored_metadata
from .fact_unit import (CHANGING, DECIDED, EDITED, TRIES, UNINDEXED, UNWRITTEN, Stale, held, log_change,
                        named, one_in_slot_written)
from ..store.pending_deletes import OwedRows
from ..store.repositories import FactRepository, PendingVectorSource
from ..validation import MAX_TIMESTAMP, MIN_TIMESTAMP, check_text
from ..vector.base import VectorIndex

FACT_TYPES = ("preference", "fact", "constraint", "relationship", "decision")
FactType = Literal["preference", "fact", "constraint", "relationship", "decision"]


@dataclass(frozen=True, kw_only=True)
class FactHit:
    fact: Fact
    score: float
    explanation: dict[str, Any] = field(default_factory=dict)


def check_type(type_: str | None, *, optional: bool = True) -> None:
    """A fact type (``None`` only where it means "any" or "unchanged": ``optional``)."""
    if (type_ is None and not optional) or (type_ is not None and type_ not in FACT_TYPES):
        raise InvalidInputError(f"fact type must be one of {FACT_TYPES}, got {type_!r}")


class SemanticMemory:
    """Facts of every user: storage, resolution, search. Thread-safe through ``writing``."""

    def __init__(self, rows: FactRepository, index: VectorIndex, embedder: Embedder, config: FactConfig,
                 writing: Callable[[str | None], AbstractContextManager[Any]], *, max_metadata_bytes: int,
                 owed: OwedRows) -> None:
        # writing(user): the user's lock, then the write lock (Parts.writing: a user being deleted is waited
        # for first); writing(None): the write lock alone, for a restore of every user's facts
        self.rows, self.index, self.embedder, self.config, self.writing = rows, index, embedder, config, writing
        self.owed = owed  # what the index owes, beside the rows (store/pending_deletes.py)
        # MemoryConfig.max_metadata_bytes: what an import takes, so what a write stores exports whole
        self.max_metadata_bytes = max_metadata_bytes

    # ---- reads ---------------------------------------------------------------
    def get(self, user_id: str, fact_id: str) -> Fact:
        found = self.rows.fact(user_id, fact_id)
        if found is None:
            raise NotFoundError(f"no fact {fact_id!r} for this user")
        return found

    def select(self, user_id: str, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        check_type(type)
        return self.rows.facts_of(user_id, type=type, include_invalid=include_invalid)

    def history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]:
        return self.rows.fact_history(user_id, fact_id)

    def vectors(self, user_id: str) -> tuple[list[Fact], np.ndarray]:
        """Valid facts with their stored unit vectors (for consolidation)."""
        pairs = self.rows.fact_vectors(user_id)
        facts = [f for f, _ in pairs]
        vecs = [v for _, v in pairs if v is not None]
        if len(vecs) < len(pairs) or len({v.shape for v in vecs}) > 1:  # missing, or from two embedders
            return facts, embed(self.embedder, [f.text for f in facts])
        return facts, np.stack(vecs) if vecs else np.zeros((0, 0), dtype=np.float32)

    def related(self, user_id: str, text: str, k: int, key: str | None = None) -> list[tuple[Fact, float]]:
        """The ``k`` valid facts nearest ``text`` with their similarity, and with ``key`` every valid
        fact stored in that slot, however many facts are nearer (its similarity from the vector
        its row holds): resolution compares a fact of a slot with its slot's. Every write stores
        a fact without a key in the slot its words name (:func:`~.resolution.slotted`), and the
        layer migration did for the facts stored before; one another writer stored so (an older
        version sharing the database) is found only among the nearest, where
        :func:`~.resolution.slot_of` reads its words."""
        qv = embed_query(self.embedder, text)
        with vector_errors_typed(UNWRITTEN.format(what="a fact resolved against the user's", error="{error}")):
            hits = self.index.query(qv[None, :], user_id=user_id, k=k, layers=["fact"])[0]
        by_id = {h[0].split(":", 1)[1]: h[1] for h in hits}
        found = [(f, by_id[f.id]) for f in self.rows.facts_by_ids(user_id, list(by_id)) if f.valid]
        far = [(f, v) for f, v in self.rows.facts_in_slot(user_id, key) if f.id not in by_id] if key is not None else []
        vectors = {f.id: v for f, v in far if v is not None and v.shape == qv.shape}  # as stored with the text
        unstored = [f for f, _ in far if f.id not in vectors]
        if unstored:  # rare: a row another writer stored without a vector, or another embedder's: embedded
            vectors.update(zip([f.id for f in unstored], embed(self.embedder, [f.text for f in unstored])))
        return found + [(f, float(vectors[f.id] @ qv)) for f, _ in far]

    def search(self, query: str, *, user_id: str, k: int, type: str | None, retrieval: RetrievalConfig,
               include_invalid: bool = False, now: float | None = None,
               vector: np.ndarray | None = None) -> list[FactHit]:
        """Hybrid recall over facts (vector + keyword + recency of update). ``vector`` is the
        query's embedding when the caller has it already. Writes nothing: the caller notes
        what it hands on as an access."""
        check_type(type)
        now = time.time() if now is None else now
        n = max(self.config.candidates, k * 4)
        qv = embed_query(self.embedder, query) if vector is None else vector
        vec, kw = hybrid.candidates(self.index, qv, lambda terms, m: self.rows.keyword_facts(user_id, terms, m),
                                    query, user_id=user_id, layer="fact", n=n, prefix="fact:")
        facts = {f.id: f for f in self.rows.facts_by_ids(user_id, [i for i, _ in vec] + [i for i, _ in kw])
                 if (include_invalid or f.valid) and (type is None or f.type == type)}
        fused = hybrid.fuse(vec, kw, retrieval, keep=facts.__contains__,
                            updated={i: f.updated_at for i, f in facts.items()}, now=now)
        return [FactHit(fact=facts[f.id], score=f.score, explanation={"signals": f.parts}) for f in fused[:k]]

    def touch(self, user_id: str, ids: Sequence[str], now: float) -> None:
        if ids:
            with self.rows.unit() as u:
                u.touch_facts(user_id, ids, now)

    # ---- writes --------------------------------------------------------------
    def apply(self, user_id: str, candidate: FactCandidate, resolution: Resolution, *, target: Fact | None,
              metadata: dict[str, Any] | None = None, at: float | None = None,
              given: Mapping[str, Any] | None = None) -> Fact | None:
        """Write a resolution; returns the fact added or changed (``None`` for a no-op). ``target``
        is the fact it names as the caller read it under the lock (``None``: none named, or gone).
        ``metadata`` is a new fact's; ``given`` (``add_fact``'s caller's keys) is merged into the
        fact an update or a no-op keeps, held to the metadata limit as ``update_fact`` holds it
        (and so is each history entry's details: :func:`log_change`)."""
        limit = self.max_metadata_bytes
        now = time.time()
        said_at, at = at, now if at is None else at
        meta = stored_metadata(metadata, resolution.method)
        details = {"reason": resolution.reason, "method": resolution.method,
                   "source_ids": list(candidate.source_ids)}
        given = given or {}
        with self.writing(user_id):
            if resolution.action == "noop":
                if target is not None:
                    self._said_again(target, candidate, details, now, given, said_at)
                return None
            if resolution.action == "update":
                read = named(target, resolution)
                text = resolution.text or read.text
                vector = embed(self.embedder, [text])[0]
                key, polarity = rewritten_slot(read, text, candidate)  # the slot its new words name
                rivals = self._rivals(read, text, key)
                with self.rows.unit() as u:  # what it merges into, as held (Stale: decided again)
                    old = held(u, read, DECIDED, Stale(read.id), rivals=rivals)
                    kept = merge_metadata(old.metadata, given, limit)  # past the limit: nothing written
                    sources = list(dict.fromkeys([*old.source_ids, *candidate.source_ids]))
                    u.revise_fact(user_id, old.id, text=text, confidence=max(old.confidence, candidate.confidence),
                                  source_ids=sources, metadata=kept, updated_at=now, vector=vector, key=key,
                                  polarity=polarity)
                    said = {**details, **({} if said_at is None else {"said_at": said_at})}  # its last statement
                    log_change(u, user_id, old.id, "update", old.text, text, now, {**said, **metadata_details(
                        old.metadata, given, beside=said, max_bytes=limit)}, max_bytes=limit)
                    gone = one_in_slot_written(u, replace(old, text=text, key=key, polarity=polarity), rivals, at=at,
                                               now=now, by="a judge's rewrite", config=self.config, max_bytes=limit)
                    with vector_errors_typed(UNWRITTEN.format(what=f"the update of fact {old.id}", error="{error}")):
                        self.index.delete([f"fact:{old.id}", *gone])  # see edit: never a vector of the old text
                    [new] = u.held_facts(user_id, [old.id])  # as written (another writer may delete it next)
                # its row stored pending till then: a crash leaves it to the pending pass (index_pending)
                write_fact_vectors(self.rows, self.index, [(new, vector if new.valid else None)],
                                   failed=UNINDEXED.format(id=new.id, done="updated", error="{error}"))
                return new
            fact = slotted(Fact(id=uuid.uuid4().hex, user_id=user_id, type=candidate.type, text=candidate.text,
                                confidence=candidate.confidence, source_ids=list(candidate.source_ids),
                                metadata=meta, created_at=now, updated_at=now, valid_from=at,
                                key=candidate.key, polarity=candidate.polarity))
            vector = embed(self.embedder, [fact.text])[0]
            if resolution.action == "invalidate":
                old = named(target, resolution)
                if at < old.valid_from:  # said before the fact it contradicts: history, not news
                    return self._add_superseded(fact, old, vector, details, now)
            with self.rows.unit() as u:
                if resolution.action == "invalidate":  # the fact it contradicts as held (Stale: decided again)
                    held(u, old, DECIDED, Stale(old.id))
                    u.invalidate_fact(user_id, old.id, at=at, superseded_by=fact.id, updated_at=now)
                    log_change(u, user_id, old.id, "invalidate", old.text, None, now,
                               {**details, "superseded_by": fact.id, "invalid_from": at}, max_bytes=limit)
                u.insert_fact(fact, vector)
                log_change(u, user_id, fact.id, "add", None, fact.text, now, details, max_bytes=limit)
            failed = UNINDEXED.format(id=fact.id, done="stored", error="{error}")
            if resolution.action == "invalidate":
                with vector_errors_typed(failed):
                    self.index.delete([f"fact:{resolution.target_id}"])
            write_fact_vectors(self.rows, self.index, [(fact, vector)], failed=failed)
            return fact

    def _said_again(self, read: Fact, said: FactCandidate, details: dict[str, Any], now: float,
                    given: Mapping[str, Any], said_at: float | None) -> None:
        """A known fact stated again (``read`` under the lock; held in the write's unit, else
        :class:`~.fact_unit.Stale`): the turns that said it join its sources (a context citing
        facts by their sources reaches them), the metadata ``given`` with it is merged into its
        own, and it counts as updated now (a fact the user keeps saying is not stale); a
        ``confirm`` entry in its history names the turns, the keys and, for a dated statement (a
        span's: ``said_at``), when it was said. A statement citing no turn (a model's restatement
        that no turn of its span says word for word) confirms it when dated after its last
        statement (:meth:`_last_said`): not a span read again, nor old turns imported late. Said
        with more confidence than it holds (``add_fact(text, confidence=1.0)`` of a fact the rules
        found), it takes the higher, as an update does; the entry says from what.
        Nothing new: nothing is written."""
        limit = self.max_metadata_bytes
        source_ids = said.source_ids
        restated = not source_ids and said_at is not None and said_at > self._last_said(read)
        if not read.valid or (not restated and set(source_ids) <= set(read.source_ids)
                              and said.confidence <= read.confidence
                              and merge_metadata(read.metadata, given, limit) == read.metadata):
            return
        with self.rows.unit() as u:  # news decided on the history read: stale once another write touched it
            old = held(u, read, (*DECIDED, "updated_at") if restated else DECIDED, Stale(read.id))
            new = [s for s in dict.fromkeys(source_ids) if s not in old.source_ids]
            kept = merge_metadata(old.metadata, given, limit)
            surer = said.confidence > old.confidence
            if not new and kept == old.metadata and not restated and not surer:
                return
            details = {**details, "source_ids": new, **({} if said_at is None else {"said_at": said_at}),
                       **({"confidence": said.confidence, "old_confidence": old.confidence} if surer else {})}
            u.absorb_facts(old.id, source_ids=[*old.source_ids, *new], access_count=0, last_access=None,
                           updated_at=now, metadata=None if kept == old.metadata else kept,
                           confidence=said.confidence if surer else None)
            log_change(u, old.user_id, old.id, "confirm", old.text, old.text, now, {**details, **metadata_details(
                old.metadata, given, beside=details, max_bytes=limit)}, max_bytes=limit)

    def _last_said(self, fact: Fact) -> float:
        """When ``fact`` was last said, as known: its ``valid_from``, or a later ``said_at`` of a
        ``confirm`` or an ``update`` (a dated statement said again, or said more fully) that a
        turn's timestamp could be (an imported entry's details are any JSON, and a ``said_at`` of
        1e300 would date every later statement before it)."""
        said = [c.details.get("said_at") for c in self.rows.fact_history(fact.user_id, fact.id)
                if c.action in ("confirm", "update")]
        return max([fact.valid_from, *(t for t in said if not isinstance(t, bool) and isinstance(t, (int, float))
                                       and MIN_TIMESTAMP <= t < MAX_TIMESTAMP)])

    def _add_superseded(self, fact: Fact, newer: Fact, vector: Any, details: dict[str, Any], now: float) -> Fact:
        """Store ``fact`` as already invalid, superseded by the ``newer`` fact it contradicts
        (a session ended late, an import of old turns): the newer fact stays valid, and the
        history says the older statement held until the newer one."""
        fact = replace(fact, invalid_at=newer.valid_from, superseded_by=newer.id)
        with self.rows.unit() as u:
            held(u, newer, DECIDED, Stale(newer.id))  # still the fact it says (Stale: decided again)
            u.insert_fact(fact, vector)
            log_change(u, fact.user_id, fact.id, "add", None, fact.text, now,
                       {**details, "superseded_by": newer.id, "invalid_from": newer.valid_from,
                        "reason": f"{details['reason']}; but it was said before the fact it contradicts, "
                                  "which stays valid"}, max_bytes=self.max_metadata_bytes)
        return fact

    def resolve_and_apply(self, user_id: str, candidate: FactCandidate, *, metadata: dict[str, Any] | None = None,
                          judgement: Judgement | None = None, related: Sequence[tuple[Fact, float]] | None = None,
                          at: float | None = None,
                          given: Mapping[str, Any] | None = None) -> tuple[Resolution, Fact | None]:
        """Resolve ``candidate`` and write it (:meth:`apply`, which takes the other arguments)."""
        check_type(candidate.type, optional=False)
        if related is None:
            related = self.related(user_id, candidate.text, self.config.related_k, candidate.key)
        res = decide_resolution(candidate, related, same=self.config.same_similarity,
                                merge=self.config.merge_similarity, judgement=judgement)
        with self.writing(user_id):
            for _ in range(TRIES):
                target = self.rows.fact(user_id, res.target_id) if res.target_id else None
                if res.target_id is None or (target is not None and target.valid):
                    try:
                        return res, self.apply(user_id, candidate, res, target=target, metadata=metadata, at=at,
                                               given=given)
                    except Stale:
                        pass
                # another thread or process deleted, replaced or rewrote the fact it names since it was
                # read (an LLM judged meanwhile; or in the write's own transaction): decide again, by
                # the rules, against the user's facts as they are now
                current = self.related(user_id, candidate.text, self.config.related_k, candidate.key)
                res = decide_resolution(candidate, current, same=self.config.same_similarity,
                                        merge=self.config.merge_similarity)
        raise StoreError(CHANGING.format(what="the fact", tries=TRIES))

    def edit(self, user_id: str, fact_id: str, *, text: str | None = None,
             type: str | None = None, confidence: float | None = None,
             metadata: dict[str, Any] | None = None) -> Fact:
        """Change a fact's text, type, confidence or metadata (``metadata`` merged into its own,
        the whole held to the metadata limit: what is stored exports and imports whole). A
        valid fact given a slot's words is that slot's one valid fact (:func:`~.resolution.one_in_slot`)."""
        check_type(type)
        if text is not None:
            check_text(text, "fact text")
        if confidence is not None and not 0.0 <= confidence <= 1.0:
            raise InvalidInputError(f"confidence must be within [0, 1], got {confidence!r}")
        with self.writing(user_id):
            for _ in range(TRIES):
                try:
                    return self._edit(user_id, fact_id, text, type, confidence, metadata)
                except Stale:  # another writer changed it since the read: this edit applies to it as it is
                    pass
        raise StoreError(CHANGING.format(what=f"the edit of fact {fact_id}", tries=TRIES))

    def _edit(self, user_id: str, fact_id: str, text: str | None, type: str | None, confidence: float | None,
              metadata: dict[str, Any] | None) -> Fact:
        """One try of :meth:`edit`, on the fact as read; :class:`~.fact_unit.Stale` (nothing written)
        if it is no longer so in the write's unit."""
        now, limit = time.time(), self.max_metadata_bytes
        old = self.get(user_id, fact_id)
        new_text = old.text if text is None else text.strip()
        new_meta = merge_metadata(old.metadata, metadata, limit)
        if (new_text, type or old.type, old.confidence if confidence is None else confidence, new_meta) == (
                old.text, old.type, old.confidence, old.metadata):
            return old  # nothing changes: no write, no history entry, the update time stays
        vector = embed(self.embedder, [new_text])[0] if new_text != old.text else None
        # a new text is in the slot it names, if any: the old one's would let the next fact of
        # that slot invalidate it, and leave it beside the next fact of its own
        key, polarity = rewritten_slot(old, new_text)
        rivals = self._rivals(old, new_text, key)
        with self.rows.unit() as u:  # every value it writes back as read (a delete since: not found)
            held(u, old, EDITED, NotFoundError(f"no fact {fact_id!r} for this user"), rivals=rivals)
            u.edit_fact(user_id, fact_id, text=new_text, type=type or old.type,
                        confidence=old.confidence if confidence is None else confidence,
                        metadata=new_meta, key=key, polarity=polarity, updated_at=now, vector=vector)
            log_change(u, user_id, fact_id, "edit", old.text, new_text, now, edit_details(
                old, type=type or old.type, confidence=old.confidence if confidence is None else confidence,
                metadata=metadata or {}, max_bytes=limit), max_bytes=limit)
            moved = replace(old, text=new_text, type=type or old.type, key=key, polarity=polarity)
            gone = one_in_slot_written(u, moved, rivals, at=now, now=now, by="an edit", config=self.config,
                                       max_bytes=limit)  # the slot's other facts
            if vector is not None:  # before the commit, the new vector after it: a crash or failure
                with vector_errors_typed(UNWRITTEN.format(what=f"the edit of fact {fact_id}", error="{error}")):
                    self.index.delete([f"fact:{fact_id}", *gone])  # between: missing (repaired), not stale
            [new] = u.held_facts(user_id, [fact_id])  # as written (another writer may delete it next)
        if vector is not None:  # the row was marked pending: an invalid fact's has no vector to write
            write_fact_vectors(self.rows, self.index, [(new, vector if new.valid else None)],
                               failed=UNINDEXED.format(id=fact_id, done="edited", error="{error}"))
        return new

    def _rivals(self, old: Fact, text: str, key: str | None) -> list[Fact]:
        """The other valid facts of slot ``key`` that ``old``, valid, moves into with new ``text``."""
        if key is None or text == old.text or not old.valid:
            return []
        return [f for f, _ in self.rows.facts_in_slot(old.user_id, key) if f.id != old.id]

    def delete(self, user_id: str, fact_id: str) -> None:
        """Remove a fact (row and vector); the history keeps a ``delete`` entry."""
        with self.writing(user_id):
            read = self.get(user_id, fact_id)
            with self.rows.unit() as u:  # its text as held: another writer may have deleted or edited it since
                old = held(u, read, (), NotFoundError(f"no fact {fact_id!r} for this user"))
                u.delete_fact(user_id, fact_id)
                owed = u.owe_vectors(user_id, vectors=[f"fact:{fact_id}"])  # till the index deletes it
                log_change(u, user_id, fact_id, "delete", old.text, None, time.time(), {},
                           max_bytes=self.max_metadata_bytes)
            forgetting.delete_owed(self.owed, self.index, owed, what="the fact is")

    def restore(self, batches: Iterable[FactBatch]) -> int:
        """Write facts as they were exported, batch by batch, with their history and that of facts
        no longer stored, in one transaction and in memory that does not grow with their number
        (:func:`~.fact_restore.restore_facts`): no resolution; ids, times, validity and access
        counts kept. Vectors are recomputed; only valid facts go into the vector index (as
        :meth:`apply` leaves it). The caller skips ids already stored."""
        return restore_facts(self.rows, self.index, self.embedder, self.owed, self.writing(None), batches)

    def reindex(self, user_id: str | None = None, skipped: list[VectorIndexError] | None = None) -> int:
        """Re-embed and upsert the vectors of every live fact (after ``rebuild_index``;
        :func:`~.layer_repair.reindex_facts`: a fact the index refuses holds back no other)."""
        return reindex_facts(self.rows, self.index, self.embedder, user_id, skipped=skipped)

    def index_pending(self, batch: int = 256, skipped: list[VectorIndexError] | None = None) -> int:
        """Write the vectors of the facts left pending and settle them; returns how many
        (:func:`~.layer_repair.index_pending_facts`: a fact the index refuses holds back no other)."""
        if not isinstance(self.rows, PendingVectorSource):
            return 0
        return index_pending_facts(self.rows, self.index, self.embedder, batch=batch, skipped=skipped)
