"""The layers behind the facade: episodic, semantic and working memory, and the LLM work.

:class:`Layers` is created lazily by :class:`~tiered_memory.TieredMemory` on first
use. All LLM work happens here, never on the write path: at ``end_session``, in
``consolidate``, or for ``EpisodeConfig.compress_after_turns`` in one background
worker thread that ``add_many`` only hands a session to. Turns are committed
before any of it, so an LLM failure (error, timeout, garbage) never loses them: the
layer falls back to the extractive path and records why in the metadata, unless
``LLMConfig.strict`` asks for the typed error instead.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Mapping, Sequence

from ..aio import run_sync
from .buffer import select_buffer
from .episodic import EpisodeSchema, EpisodicMemory, episode_messages, transcript, transcript_spans
from ..errors import InvalidInputError, LLMError, NotFoundError, StoreError, VectorIndexError
from .extractive import QUOTED_ROLES, extract_episode, extract_fact_candidates, read_by
from ..graphemes import cut_point
from ..slots import text_slot
from ..store.base import SettledSource
from ..llm.adapters import resolve_llm
from ..llm.base import LLM, complete_json
from .resolution import Judgement, slot_of
from .changes import stored_metadata
from .fact_unit import CHANGING, TRIES
from .layer_repair import repair_layer_vectors
from .llm_facts import FACTS_PROMPT, ExtractedFacts, fact_candidates
from .semantic import SemanticMemory
from ..parts import Parts, WritingLock
from ..records import Episode, EpisodeDraft, Fact, FactCandidate
from ..store.repositories import LayerRepository, PendingVectorSource
from .consolidation import ConsolidationReport, consolidate
from ..types import StoredMessage
from ..quoting import quote
from ..validation import check_metadata, check_text
from .working import WorkingMemory


log = logging.getLogger("tiered_memory")

ADDED_KEYS = ("method", "resolution")  # the metadata keys add_fact writes of a fact it adds
MAX_ERROR_CHARS = 500  # of a failed LLM call's error, kept in the metadata of what the rules made instead

RESOLVE_PROMPT = """Task: resolve
You keep a user's fact list consistent. Given a NEW fact and numbered EXISTING facts, reply
with one JSON object only: {"action": "add" | "update" | "invalidate" | "noop", "target":
number of the existing fact concerned or null, "text": merged text for "update" or null}.
add: the new fact is unrelated; update: it refines or extends the target (give merged text);
invalidate: it contradicts the target, which is no longer true; noop: already known."""


class Layers:
    """Episodic, semantic and working memory of one :class:`TieredMemory`."""

    def __init__(self, parts: Parts, rows: LayerRepository, llm: Any = None,
                 owing: Callable[[], None] = lambda: None) -> None:
        self.parts = parts
        self.owing = owing  # called when background work left vectors pending: the next call writes them
        cfg = parts.config
        self.rows = rows
        self.facts = SemanticMemory(rows, parts.index, parts.embedder, cfg.facts, parts.writing,
                                    max_metadata_bytes=cfg.max_metadata_bytes, owed=parts.store.owed_rows)
        self.episodes = EpisodicMemory(rows, parts.index, parts.embedder, cfg.episodes, parts.writing,
                                       jointly=parts.jointly, owed=parts.store.owed_rows)
        self.llm_source: Any = llm  # what the user passed; resolved (and wrapped) on first use
        self._llm: LLM | None = None
        self._llm_source: Any = None
        self._session_locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._queued: set[tuple[str, str]] = set()
        self._futures: list[concurrent.futures.Future[Any]] = []

    @property
    def llm(self) -> LLM | None:
        if self.llm_source is not self._llm_source:  # resolved again if the attribute is replaced
            self._llm, self._llm_source = resolve_llm(self.llm_source), self.llm_source
        return self._llm

    def working(self, session_id: str, user_id: str) -> WorkingMemory:
        return WorkingMemory(self.rows, self.parts.embedder, self.parts.config.working,
                             WritingLock(self.parts, user_id), user_id=user_id, session_id=session_id,
                             calls=self.parts.calls, clock=self.parts.now)

    # ---- LLM calls with fallback -----------------------------------------------
    def _json(self, messages: list[dict[str, str]], schema: Any) -> Any:
        """The one bridge to the async LLM protocol: the call runs on the library's loop."""
        cfg = self.parts.config.llm
        assert self.llm is not None
        return run_sync(complete_json(self.llm, messages, schema, max_tokens=cfg.max_tokens,
                                   timeout=cfg.timeout_s, retries=cfg.retries))

    def _fallback(self, what: str, e: LLMError) -> dict[str, Any]:
        if self.parts.config.llm.strict:
            raise e
        log.warning("LLM %s failed, using the extractive fallback: %s", what, e)
        # its head: a provider's error may carry a whole response body, and this is the metadata
        # of every record the rules then make (held, as stored, to what an import takes)
        error = f"{type(e).__name__}: {e}"
        if len(error) > MAX_ERROR_CHARS:
            error = error[:cut_point(error, MAX_ERROR_CHARS - 1)] + "\u2026"
        return {"method": "extractive", "reason": "llm failed", "llm_error": error}

    def compress(self, messages: Sequence[StoredMessage]) -> tuple[EpisodeDraft, dict[str, Any]]:
        """An episode draft from the LLM, or from rules when there is none or it fails."""
        if self.llm is None:
            return extract_episode(messages), {"method": "extractive", "reason": "no llm configured"}
        try:
            out = self._json(episode_messages(messages), EpisodeSchema)
            return EpisodeDraft(**out.model_dump()), {"method": "llm"}
        except LLMError as e:
            return extract_episode(messages), self._fallback("episode", e)

    def candidates(self, messages: Sequence[StoredMessage]
                         ) -> tuple[list[FactCandidate], dict[str, Any]]:
        if self.llm is None:
            return extract_fact_candidates(messages), {"method": "extractive", "reason": "no llm configured"}
        prompt = [{"role": "system", "content": FACTS_PROMPT},
                  {"role": "user", "content": "Conversation:\n" + transcript(messages)}]
        try:
            out: ExtractedFacts = self._json(prompt, ExtractedFacts)  # its valid facts (llm_facts.py)
        except LLMError as e:
            return extract_fact_candidates(messages), self._fallback("fact extraction", e)
        return fact_candidates(out, messages), {"method": "llm"}

    def _judge(self, candidate: FactCandidate, related: Sequence[tuple[Fact, float]]) -> Judgement | None:
        numbered = "\n".join(f"[{n}] {quote(f.text)}" for n, (f, _) in
                             enumerate(sorted(related, key=lambda r: -r[1]), 1))
        prompt = [{"role": "system", "content": RESOLVE_PROMPT},
                  {"role": "user", "content": f"NEW: {quote(candidate.text)}\nEXISTING:\n{numbered}"}]
        try:
            return self._json(prompt, Judgement)  # type: ignore[no-any-return]
        except LLMError as e:
            self._fallback("fact resolution", e)
            return None

    def ingest(self, user_id: str, candidates: Sequence[FactCandidate], metadata: dict[str, Any],
                     messages: Sequence[StoredMessage] = (), at: float | None = None) -> list[Fact]:
        """Resolve and store candidates; an LLM judges against related facts when available (its
        calls first, then every write under the user's lock: :meth:`store_facts`).

        A candidate is dated by the newest of ``messages`` it cites, else by ``at`` (else now)."""
        judged = self.judged(user_id, candidates, metadata)
        with self.parts.writing(user_id):
            return self.store_facts(user_id, judged, metadata, messages, at)

    def _related(self, user_id: str, cand: FactCandidate) -> list[tuple[Fact, float]]:
        related = self.facts.related(user_id, cand.text, self.parts.config.facts.related_k, cand.key)
        # a fact of the candidate's slot (slot_of: its key, else its words') is related however
        # unlike its words: the rules replace it ("User works at Globex" is 0.57 from "User works
        # at ACME" with MiniLM)
        return [r for r in related if r[1] >= self.parts.config.facts.related_similarity
                or (cand.key is not None and slot_of(r[0])[0] == cand.key)]

    def judged(self, user_id: str, candidates: Sequence[FactCandidate], metadata: dict[str, Any]
               ) -> list[tuple[FactCandidate, Judgement | None, set[str]]]:
        """Each candidate with the model's judgement against its related facts (and their ids), or
        none: the model's facts are judged, in a slot or not; the rules' own are not. Asked before
        any write, holding no lock (a model call may take minutes)."""
        out: list[tuple[FactCandidate, Judgement | None, set[str]]] = []
        asks = self.llm is not None and metadata.get("method") == "llm"
        for cand in candidates:
            related = self._related(user_id, cand) if asks else []
            out.append((cand, self._judge(cand, related) if related else None, {f.id for f, _ in related}))
        return out

    def store_facts(self, user_id: str, judged: Sequence[tuple[FactCandidate, Judgement | None, set[str]]],
                    metadata: dict[str, Any], messages: Sequence[StoredMessage] = (),
                    at: float | None = None) -> list[Fact]:
        """Write :meth:`judged` candidates, the caller holding ``parts.writing(user_id)``. Each is
        resolved against its related facts as they are now (an earlier candidate may have added
        one): a judgement made against others is set aside, and the rules decide."""
        stamps = {m.id: m.timestamp for m in messages}
        changed = []
        for cand, judgement, judged_ids in judged:
            related = self._related(user_id, cand)
            if judgement is not None and {f.id for f, _ in related} != judged_ids:
                judgement = None
            said = max((stamps[i] for i in cand.source_ids if i in stamps), default=at)
            # the fact's row and its vector in one transaction where one engine holds both (as
            # add_fact's): a row committed without its vector would never get one there, since
            # such a store has no start-up repair and a second pass finds the fact by its words (run now)
            _, fact = self.parts.jointly(lambda: self.facts.resolve_and_apply(
                user_id, cand, metadata=metadata, judgement=judgement, related=related, at=said))  # noqa: B023
            if fact is not None:
                changed.append(fact)
        return changed

    # ---- sessions -> episodes ------------------------------------------------------
    def _session_lock(self, user_id: str, session_id: str) -> threading.Lock:
        with self._guard:
            return self._session_locks.setdefault((user_id, session_id), threading.Lock())

    def end_session(self, user_id: str, session_id: str, *, evicted_only: bool = False,
                    audit: tuple[str, float] | None = None) -> Episode | None:
        """Compress the session's messages no episode covers yet (facts stored first, then the episode;
        ``audit``: the action and time of the audit entry written with it, in its transaction). With
        an LLM, turns more than one prompt's transcript holds make an episode a span
        (:func:`~.episodic.transcript_spans`); the newest is returned. Turns of which none is a
        user's or an assistant's (only system or tool messages) make, without a model, an episode
        that says :data:`~.extractive.NOTHING_SAID`: it covers them (the session is ended) but is
        never recalled (:func:`~.episodic.said_nothing`).

        The ids are checked by the caller that takes them from a user (``TieredMemory.end_session``);
        consolidation passes the stored ones, which another writer may have left unlike any
        the API takes (a control character, say), and ends those sessions too."""
        lock = self._session_lock(user_id, session_id)
        lock.acquire()
        try:
            # another worker (process) may end the session meanwhile: an episode of ours that would
            # cover some of its turns again is not written, and what it left is read again (each
            # pass reads above a cursor that moved, so this ends)
            while True:
                msgs = self._uncovered(user_id, session_id, evicted_only)
                if not msgs:
                    done = self.episodes.select(user_id, session_id)
                    if done and not evicted_only:  # a retry after the index failed: the vectors it left pending
                        self.episodes.index_pending()
                    if done or evicted_only:
                        return done[-1] if done else None
                    if self.rows.cursor(user_id, session_id):  # covered by no episode: a store of before
                        self.episodes.release(user_id, session_id)  # deletes released turns, or its export
                        msgs = self._uncovered(user_id, session_id, evicted_only)
                    if not msgs:
                        raise NotFoundError(f"session {session_id!r} has no messages for this user")
                episode = self._summarise(user_id, session_id, msgs, audit)
                if episode is not None:
                    return episode
        finally:
            lock.release()

    def _summarise(self, user_id: str, session_id: str, msgs: Sequence[StoredMessage],
                   audit: tuple[str, float] | None) -> Episode | None:
        """Facts and episodes of ``msgs``; the newest episode, or ``None`` when another worker's
        episode covers some of them first (what is left is for the caller to read again)."""
        # a model reads one transcript: of more turns than it holds, an episode a span, oldest
        # first, each span's coverage committed with its episode (a failure leaves the rest for
        # the next call); the rules read every turn at once
        episode: Episode | None = None
        said = bool(read_by(msgs, QUOTED_ROLES))
        for span in self._spans(msgs):
            # every LLM call before any write: a strict-mode failure of the episode leaves no fact behind
            if said:
                found, meta = self.candidates(span)
                draft, ep_meta = self.compress(span)
            else:
                meta = ep_meta = {"method": "extractive", "reason": "nothing said"}
                found, draft = [], extract_episode(span)
            judged = self.judged(user_id, found, meta)
            ready = self.episodes.prepare(user_id, session_id, draft, span, ep_meta)
            # written under the user's lock, which their deletions take: one finished since the read
            # (forget_user, forget, clear_session) leaves nothing of the span written, and what is left is
            # read again (after forget_user: nothing). Facts first: a crash before the episode leaves the
            # turns uncovered and end_session redoes both (facts merge on the second pass)
            with self.parts.writing(user_id):
                if not self._unchanged(user_id, session_id, span):
                    return None
                # a fact citing no turn (none says it) was said by the span's newest (NO_TIME: now)
                self.store_facts(user_id, judged, meta, span, at=max(m.timestamp for m in span) or None)
                episode = self.episodes.save(ready, audit=audit)
            if episode is None:
                return None
        return episode

    def _unchanged(self, user_id: str, session_id: str, span: Sequence[StoredMessage]) -> bool:
        """Are the span's turns all still stored, and none covered by an episode since they were read?"""
        ids = [m.id for m in span]
        return (len(self.parts.store.get_by_ids(user_id, ids)) == len(set(ids))
                and self.rows.cursor(user_id, session_id) < min(m.seq for m in span))

    def _spans(self, msgs: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
        """The spans of ``msgs`` that each make an episode: a model reads one transcript, so of more
        turns than it holds, each span one (:func:`~.episodic.transcript_spans`); the rules read every
        turn at once, and so does a session of only system or tool messages: no conversation to
        summarise, nor to ask a model about (the rules' episode says so, ``NOTHING_SAID``, and is
        kept but never recalled: :func:`~.episodic.said_nothing`)."""
        said = bool(read_by(msgs, QUOTED_ROLES))
        return transcript_spans(msgs) if self.llm is not None and said else [list(msgs)] if msgs else []

    def pending_spans(self, user_id: str, session_id: str) -> list[list[StoredMessage]]:
        """The spans ``end_session`` would make episodes of now (a dry run's, which writes nothing)."""
        return self._spans(self._uncovered(user_id, session_id, False))

    def _uncovered(self, user_id: str, session_id: str, evicted_only: bool) -> list[StoredMessage]:
        cursor = self.rows.cursor(user_id, session_id)
        store = self.parts.store  # where turns may commit out of seq order, none in flight is passed over
        read = store.settled_messages if isinstance(store, SettledSource) else store.get_messages
        msgs = [m for m in read(user_id, session_id) if m.seq > cursor]
        if evicted_only:
            buf = self.parts.config.buffer
            _, msgs = select_buffer(msgs, max_messages=buf.max_messages, max_tokens=buf.max_tokens,
                                    count=self.parts.count_tokens)
        return msgs

    def after_add(self, user_id: str, session_id: str) -> None:
        """Called by ``add_many`` after the commit: may hand the session to the background worker."""
        n = self.parts.config.episodes.compress_after_turns
        if n is None:
            return
        turns = self.rows.uncovered_count(user_id, session_id, role="user")
        key = (user_id, session_id)
        with self._guard:
            if turns < n or key in self._queued:
                return
            self._queued.add(key)
            if self._worker is None:
                self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiered-memory-compress")
            self._futures.append(self._worker.submit(self._background, user_id, session_id))

    def _background(self, user_id: str, session_id: str) -> None:
        try:
            self.end_session(user_id, session_id, evicted_only=True)
        except Exception as e:  # the turns are stored; end_session or consolidate will retry
            if isinstance(e, VectorIndexError):  # what it stored pending is written by the next call (and
                self.owing()  # found by its rules), as what a failed end_session left: not stored twice
            log.exception("background compression of session %r failed", session_id)
        finally:
            with self._guard:
                self._queued.discard((user_id, session_id))

    def wait(self, timeout: float | None = None) -> None:
        """Wait for queued background compression."""
        with self._guard:
            futures, self._futures = self._futures, []
        concurrent.futures.wait(futures, timeout=timeout)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)

    def add_fact(self, user_id: str, text: str, type: str, confidence: float,
                 metadata: Mapping[str, Any] | None) -> Fact:
        """An application-supplied fact, resolved by rules; returns the resulting (or existing) fact.
        A fact in the rules' own words ("User lives in Porto") takes their slot, so it replaces
        the fact of that slot ("User lives in Lisbon") as the user saying so would."""
        check_text(text, "fact text")
        if not isinstance(confidence, (int, float)) or not 0.0 <= confidence <= 1.0:
            raise InvalidInputError(f"confidence must be within [0, 1], got {confidence!r}")
        key, polarity = text_slot(text)
        cand = FactCandidate(type=type, text=text.strip(), confidence=float(confidence), key=key, polarity=polarity)
        meta = {**(metadata or {}), "method": "manual"}
        # as stored, within the limit: a fact stored over it would be left out of an export
        check_metadata(stored_metadata(meta, "rules"), self.facts.max_metadata_bytes,
                       "metadata with the keys add_fact adds ('method', 'resolution')")
        # a fact already known keeps its own 'method' and 'resolution' (it was not added here)
        given = {k: v for k, v in (metadata or {}).items() if k not in ADDED_KEYS}
        with self.facts.writing(user_id):  # the fact a no-op names is read before another thread may delete it
            for _ in range(TRIES):
                res, fact = self.facts.resolve_and_apply(user_id, cand, metadata=meta, given=given)
                found = fact if fact is not None else self.facts.rows.fact(user_id, res.target_id or "")
                if found is not None:  # else a no-op's fact another process deleted since: said anew
                    return found
        raise StoreError(CHANGING.format(what="the fact", tries=TRIES))

    # ---- maintenance --------------------------------------------------------------
    def repair(self, skipped: list[VectorIndexError] | None = None) -> dict[str, int]:
        """Make the layer vectors match their rows after a crash (:func:`~.layer_repair.repair_layer_vectors`):
        the rows whose vectors are missing are left pending, for :meth:`index_pending` to write.
        ``skipped``: the error of vectors the index refused to drop (owed) goes there, not raised."""
        return repair_layer_vectors(self.rows, self.parts.index, self.facts.owed, skipped=skipped)

    def reindex(self, user_id: str | None = None, skipped: list[VectorIndexError] | None = None) -> dict[str, int]:
        """Re-embed the facts' and episodes' vectors; a row the index refuses is left pending and
        holds back no other. ``skipped``: the errors go there, not raised (after both layers)."""
        left = [] if skipped is None else skipped
        report = {"facts": self.facts.reindex(user_id, skipped=left),
                  "episodes": self.episodes.reindex(user_id, skipped=left)}
        if left and skipped is None:
            raise left[0]
        return report

    def pend_all(self) -> None:
        """Mark every fact and episode pending, before ``rebuild_index`` drops their vectors: a
        rebuild cut short is finished by the next open (:meth:`reindex` settles each)."""
        if isinstance(self.rows, PendingVectorSource):
            self.rows.pend_all()

    def index_pending(self, skipped: list[VectorIndexError] | None = None) -> dict[str, int]:
        """Write the vectors of the facts and episodes marked pending (a partial index finds them), at
        every open. ``skipped``: the error of facts the index refused (the rest written) goes there."""
        left = [] if skipped is None else skipped  # facts refused hold back no episode: raised after both passes
        report = {"facts_pending": self.facts.index_pending(skipped=left),
                  "episodes_pending": self.episodes.index_pending()}
        if left and skipped is None:
            raise left[0]
        return {k: v for k, v in report.items() if v}

    def consolidate(self, user_id: str, progress: Callable[[str, int, int], None] | None = None,
                    dry_run: bool = False) -> ConsolidationReport:
        return consolidate(self, user_id, progress=progress, dry_run=dry_run)
