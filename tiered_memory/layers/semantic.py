"""Semantic memory: typed facts about a user, resolved against what is already known.

Each new fact candidate is compared with the user's related facts and resolved
by :func:`decide_resolution` (pure) as ``add``, ``update`` (merge into an existing
fact), ``invalidate`` (a contradiction: the old fact is marked invalid from a time,
never destroyed, and the new one is added) or ``noop``. An LLM judgement is used
when one is available and valid; otherwise rules decide. Every change is written to
the fact history.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import BaseModel, Field

from ..config import FactConfig, RetrievalConfig
from ..embedding import Embedder, embed, embed_query
from ..errors import InvalidInputError, NotFoundError
from .records import FactCandidate
from ..recall.query import keywords
from ..recall.scoring import recency_score, rrf_fuse
from ..store.layer_store import LayerStore, dumps, from_blob, to_blob
from ..validation import check_text
from ..vector.base import VectorIndex, VectorItem

FACT_TYPES = ("preference", "fact", "constraint", "relationship", "decision")
FactType = Literal["preference", "fact", "constraint", "relationship", "decision"]
Action = Literal["add", "update", "invalidate", "noop"]


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One fact about a user. ``invalid_at`` is set when a later fact contradicted it."""

    id: str
    user_id: str
    type: str
    text: str
    confidence: float
    source_ids: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    valid_from: float = 0.0
    invalid_at: float | None = None
    superseded_by: str | None = None
    access_count: int = 0
    last_access: float | None = None
    key: str | None = None
    polarity: int = 1

    @property
    def valid(self) -> bool:
        return self.invalid_at is None


@dataclass(frozen=True, kw_only=True)
class FactChange:
    """One row of the fact history (audit trail)."""

    fact_id: str
    action: str
    old_text: str | None
    new_text: str | None
    at: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FactHit:
    fact: Fact
    score: float
    explanation: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """What to do with a candidate: ``target_id`` is the existing fact acted on."""

    action: Action
    target_id: str | None = None
    text: str | None = None
    reason: str = ""
    method: str = "rules"


class Judgement(BaseModel):
    """The LLM's resolution of a candidate against numbered existing facts."""

    action: Literal["add", "update", "invalidate", "noop"]
    target: int | None = Field(default=None, description="number of the existing fact, if any")
    text: str | None = Field(default=None, description="merged text, for update")


class ExtractedFact(BaseModel):
    type: Literal["preference", "fact", "constraint", "relationship", "decision"]
    text: str = Field(min_length=1)
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)
    sources: list[int] = Field(default_factory=list, description="numbers of the messages it comes from")


class ExtractedFacts(BaseModel):
    facts: list[ExtractedFact]


def _norm(text: str) -> str:
    return " ".join(text.lower().replace(".", " ").split())


def decide_resolution(
    candidate: FactCandidate, related: Sequence[tuple[Fact, float]], *, same: float, merge: float,
    judgement: Judgement | None = None,
) -> Resolution:
    """Resolve ``candidate`` against ``related`` (valid facts with cosine similarity), pure.

    A valid LLM ``judgement`` wins; one that names a missing fact is ignored. Rules:
    same slot (``key``) with another value or polarity invalidates; same text or
    similarity >= ``same`` is a no-op; similarity >= ``merge`` updates; else add.
    """
    ranked = sorted((r for r in related if r[0].valid), key=lambda r: -r[1])
    if judgement is not None:
        target = None
        if judgement.target is not None and 1 <= judgement.target <= len(ranked):
            target = ranked[judgement.target - 1][0]
        if judgement.action == "add":
            return Resolution(action="add", reason="llm judged it new", method="llm")
        if target is not None:
            text = judgement.text if judgement.action == "update" and judgement.text else None
            return Resolution(action=judgement.action, target_id=target.id,
                              text=text or (candidate.text if judgement.action == "update" else None),
                              reason=f"llm judged {judgement.action}", method="llm")
    for f, _ in ranked:
        if candidate.key and f.key == candidate.key:
            if f.polarity != candidate.polarity or _norm(f.text) != _norm(candidate.text):
                return Resolution(action="invalidate", target_id=f.id,
                                  reason=f"contradicts the fact in slot {candidate.key!r}")
            return Resolution(action="noop", target_id=f.id, reason="same fact in the same slot")
    if not ranked:
        return Resolution(action="add", reason="no related fact")
    best, sim = ranked[0]
    if _norm(best.text) == _norm(candidate.text) or sim >= same:
        return Resolution(action="noop", target_id=best.id, reason=f"already known (similarity {sim:.2f})")
    if sim >= merge and best.type == candidate.type and best.polarity == candidate.polarity:
        return Resolution(action="update", target_id=best.id, text=candidate.text,
                          reason=f"refines a similar fact (similarity {sim:.2f})")
    return Resolution(action="add", reason=f"nearest fact is different (similarity {sim:.2f})")


_COLS = ("id, user_id, type, text, confidence, source_ids, metadata, created_at, updated_at, valid_from,"
         " invalid_at, superseded_by, access_count, last_access, key, polarity")


def _fact(r: tuple[Any, ...]) -> Fact:
    return Fact(id=r[0], user_id=r[1], type=r[2], text=r[3], confidence=r[4], source_ids=json.loads(r[5]),
                metadata=json.loads(r[6]), created_at=r[7], updated_at=r[8], valid_from=r[9],
                invalid_at=r[10], superseded_by=r[11], access_count=r[12], last_access=r[13],
                key=r[14], polarity=r[15])


def check_type(type_: str | None) -> None:
    if type_ is not None and type_ not in FACT_TYPES:
        raise InvalidInputError(f"fact type must be one of {FACT_TYPES}, got {type_!r}")


class SemanticMemory:
    """Facts of every user: storage, resolution, search. Thread-safe through ``lock``."""

    def __init__(self, rows: LayerStore, index: VectorIndex, embedder: Embedder, config: FactConfig,
                 lock: threading.RLock) -> None:
        self.rows, self.index, self.embedder, self.config, self.lock = rows, index, embedder, config, lock

    # ---- reads ---------------------------------------------------------------
    def get(self, user_id: str, fact_id: str) -> Fact:
        found = self.rows.query(f"SELECT {_COLS} FROM facts WHERE user_id=? AND id=? AND deleted_at IS NULL",
                                (user_id, fact_id))
        if not found:
            raise NotFoundError(f"no fact {fact_id!r} for this user")
        return _fact(found[0])

    def select(self, user_id: str, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        check_type(type)
        sql = f"SELECT {_COLS} FROM facts WHERE user_id=? AND deleted_at IS NULL"
        params: list[Any] = [user_id]
        if type:
            sql += " AND type=?"
            params.append(type)
        if not include_invalid:
            sql += " AND invalid_at IS NULL"
        return [_fact(r) for r in self.rows.query(sql + " ORDER BY rowid", params)]

    def history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]:
        sql = "SELECT fact_id, action, old_text, new_text, at, details FROM fact_history WHERE user_id=?"
        params: list[Any] = [user_id]
        if fact_id is not None:
            sql += " AND fact_id=?"
            params.append(fact_id)
        return [FactChange(fact_id=r[0], action=r[1], old_text=r[2], new_text=r[3], at=r[4],
                           details=json.loads(r[5])) for r in self.rows.query(sql + " ORDER BY seq", params)]

    def vectors(self, user_id: str) -> tuple[list[Fact], np.ndarray]:
        """Valid facts with their stored unit vectors (for consolidation)."""
        rows = self.rows.query(f"SELECT {_COLS}, vector FROM facts WHERE user_id=? AND deleted_at IS NULL"
                               " AND invalid_at IS NULL ORDER BY rowid", (user_id,))
        facts = [_fact(r[:-1]) for r in rows]
        vecs = [from_blob(r[-1]) for r in rows]
        if any(v is None for v in vecs):
            return facts, embed(self.embedder, [f.text for f in facts])
        return facts, np.stack(vecs) if vecs else np.zeros((0, 0), dtype=np.float32)  # type: ignore[arg-type]

    def related(self, user_id: str, text: str, k: int) -> list[tuple[Fact, float]]:
        qv = embed_query(self.embedder, text)
        hits = self.index.query(qv[None, :], user_id=user_id, k=k, layers=["fact"])[0]
        by_id = {h[0].split(":", 1)[1]: h[1] for h in hits}
        facts = self._load(user_id, list(by_id))
        return [(f, by_id[f.id]) for f in facts if f.valid]

    def _load(self, user_id: str, ids: Sequence[str]) -> list[Fact]:
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        return [_fact(r) for r in self.rows.query(
            f"SELECT {_COLS} FROM facts WHERE user_id=? AND deleted_at IS NULL AND id IN ({marks})",
            [user_id, *ids])]

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
        vec = [(i.split(":", 1)[1], s) for i, s in
               self.index.query(qv[None, :], user_id=user_id, k=n, layers=["fact"])[0]]
        terms = keywords(query)
        kw = self.rows.keyword("facts", user_id, terms, n, "AND t.deleted_at IS NULL") if terms else []
        facts = {f.id: f for f in self._load(user_id, [i for i, _ in vec] + [i for i, _ in kw])
                 if (include_invalid or f.valid) and (type is None or f.type == type)}
        fused = rrf_fuse(
            {"vector": [i for i, _ in vec if i in facts], "keyword": [i for i, _ in kw if i in facts],
             "recency": sorted(facts, key=lambda i: -facts[i].updated_at)},
            {"vector": retrieval.vector_weight, "keyword": retrieval.keyword_weight,
             "recency": retrieval.recency_weight},
            k=retrieval.rrf_k,
            extras={"vector": dict(vec), "keyword": dict(kw),
                    "recency": {i: recency_score(f.updated_at, now, retrieval.recency_half_life_days)
                                for i, f in facts.items()}})
        return [FactHit(fact=facts[f.id], score=f.score, explanation={"signals": f.parts}) for f in fused[:k]]

    def touch(self, user_id: str, ids: Sequence[str], now: float) -> None:
        if ids:  # sorted: one lock order, so concurrent workers cannot deadlock
            with self.rows.transaction() as c:
                c.executemany("UPDATE facts SET access_count=access_count+1, last_access=? WHERE user_id=? AND id=?",
                              [(now, user_id, i) for i in sorted(ids)])

    # ---- writes --------------------------------------------------------------
    def _upsert_vectors(self, facts: Sequence[tuple[Fact, Any]]) -> None:
        self.index.upsert([VectorItem(id=f"fact:{f.id}", vector=v, user_id=f.user_id, layer="fact",
                                      timestamp=f.updated_at) for f, v in facts])

    def apply(self, user_id: str, candidate: FactCandidate, resolution: Resolution, *,
              metadata: dict[str, Any] | None = None, at: float | None = None) -> Fact | None:
        """Write a resolution; returns the fact added or changed (``None`` for a no-op)."""
        now = time.time()
        at = now if at is None else at
        meta = {**(metadata or {}), "resolution": resolution.method}
        details = {"reason": resolution.reason, "method": resolution.method,
                   "source_ids": list(candidate.source_ids)}
        with self.lock:
            if resolution.action == "noop":
                return None
            if resolution.action == "update":
                old = self.get(user_id, resolution.target_id or "")
                text = resolution.text or old.text
                sources = list(dict.fromkeys([*old.source_ids, *candidate.source_ids]))
                vector = embed(self.embedder, [text])[0]
                with self.rows.transaction() as c:
                    c.execute("UPDATE facts SET text=?, confidence=?, source_ids=?, updated_at=?, vector=? "
                              "WHERE user_id=? AND id=?",
                              (text, max(old.confidence, candidate.confidence), dumps(sources), now,
                               to_blob(vector), user_id, old.id))
                    self._log(c, user_id, old.id, "update", old.text, text, now, details)
                new = self.get(user_id, old.id)
                self._upsert_vectors([(new, vector)])
                return new
            fact = Fact(id=uuid.uuid4().hex, user_id=user_id, type=candidate.type, text=candidate.text,
                        confidence=candidate.confidence, source_ids=list(candidate.source_ids),
                        metadata=meta, created_at=now, updated_at=now, valid_from=at,
                        key=candidate.key, polarity=candidate.polarity)
            vector = embed(self.embedder, [fact.text])[0]
            with self.rows.transaction() as c:
                if resolution.action == "invalidate":
                    old = self.get(user_id, resolution.target_id or "")
                    c.execute("UPDATE facts SET invalid_at=?, superseded_by=?, updated_at=? WHERE user_id=? AND id=?",
                              (at, fact.id, now, user_id, old.id))
                    self._log(c, user_id, old.id, "invalidate", old.text, None, now,
                              {**details, "superseded_by": fact.id, "invalid_from": at})
                c.execute(f"INSERT INTO facts ({_COLS}, vector) VALUES ({','.join('?' * 17)})",
                          (fact.id, user_id, fact.type, fact.text, fact.confidence, dumps(fact.source_ids),
                           dumps(fact.metadata), now, now, at, None, None, 0, None, fact.key, fact.polarity,
                           to_blob(vector)))
                self._log(c, user_id, fact.id, "add", None, fact.text, now, details)
            if resolution.action == "invalidate":
                self.index.delete([f"fact:{resolution.target_id}"])
            self._upsert_vectors([(fact, vector)])
            return fact

    def _log(self, c: Any, user_id: str, fact_id: str, action: str, old: str | None, new: str | None,
             at: float, details: dict[str, Any]) -> None:
        c.execute("INSERT INTO fact_history (fact_id, user_id, action, old_text, new_text, at, details)"
                  " VALUES (?,?,?,?,?,?,?)", (fact_id, user_id, action, old, new, at, dumps(details)))

    def resolve_and_apply(self, user_id: str, candidate: FactCandidate, *, metadata: dict[str, Any] | None = None,
                          judgement: Judgement | None = None, related: Sequence[tuple[Fact, float]] | None = None,
                          at: float | None = None) -> tuple[Resolution, Fact | None]:
        check_type(candidate.type)
        if related is None:
            related = self.related(user_id, candidate.text, self.config.related_k)
        res = decide_resolution(candidate, related, same=self.config.same_similarity,
                                merge=self.config.merge_similarity, judgement=judgement)
        return res, self.apply(user_id, candidate, res, metadata=metadata, at=at)

    def edit(self, user_id: str, fact_id: str, *, text: str | None = None, type: str | None = None,
             confidence: float | None = None, metadata: dict[str, Any] | None = None) -> Fact:
        check_type(type)
        if text is not None:
            check_text(text, "fact text")
        if confidence is not None and not 0.0 <= confidence <= 1.0:
            raise InvalidInputError(f"confidence must be within [0, 1], got {confidence!r}")
        now = time.time()
        with self.lock:
            old = self.get(user_id, fact_id)
            new_text = old.text if text is None else text.strip()
            vector = embed(self.embedder, [new_text])[0] if new_text != old.text else None
            with self.rows.transaction() as c:
                c.execute("UPDATE facts SET text=?, type=?, confidence=?, metadata=?, updated_at=?"
                          + (", vector=?" if vector is not None else "") + " WHERE user_id=? AND id=?",
                          (new_text, type or old.type, old.confidence if confidence is None else confidence,
                           dumps({**old.metadata, **(metadata or {})}), now,
                           *([to_blob(vector)] if vector is not None else []), user_id, fact_id))
                self._log(c, user_id, fact_id, "edit", old.text, new_text, now,
                          {"type": type, "confidence": confidence})
            new = self.get(user_id, fact_id)
            if vector is not None and new.valid:
                self._upsert_vectors([(new, vector)])
            return new

    def delete(self, user_id: str, fact_id: str) -> None:
        """Remove a fact (row and vector); the history keeps a ``delete`` entry."""
        with self.lock:
            old = self.get(user_id, fact_id)
            with self.rows.transaction() as c:
                c.execute("DELETE FROM facts WHERE user_id=? AND id=?", (user_id, fact_id))
                self._log(c, user_id, fact_id, "delete", old.text, None, time.time(), {})
            self.index.delete([f"fact:{fact_id}"])

    def soft_delete(self, c: Any, user_id: str, fact_id: str, action: str, now: float,
                    details: dict[str, Any]) -> None:
        """Hide a fact (merge, prune) inside the caller's transaction; kept for audit."""
        old = c.execute("SELECT text FROM facts WHERE user_id=? AND id=? AND deleted_at IS NULL",
                        (user_id, fact_id)).fetchone()
        if old is None:
            return
        c.execute("UPDATE facts SET deleted_at=? WHERE user_id=? AND id=?", (now, user_id, fact_id))
        self._log(c, user_id, fact_id, action, old[0], None, now, details)

    def reindex(self, user_id: str | None = None) -> int:
        """Re-embed and upsert the vectors of every live fact (after ``rebuild_index``)."""
        sql = f"SELECT {_COLS} FROM facts WHERE deleted_at IS NULL AND invalid_at IS NULL"
        facts = [_fact(r) for r in self.rows.query(sql + (" AND user_id=?" if user_id else ""),
                                                     [user_id] if user_id else [])]
        for start in range(0, len(facts), 256):
            part = facts[start:start + 256]
            vecs = embed(self.embedder, [f.text for f in part])
            with self.rows.transaction() as c:  # keep the stored vectors in step with the embedder
                c.executemany("UPDATE facts SET vector=? WHERE id=?", [(to_blob(v), f.id) for f, v in zip(part, vecs)])
            self._upsert_vectors(list(zip(part, vecs)))
        return len(facts)
