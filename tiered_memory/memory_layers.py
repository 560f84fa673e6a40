"""The facade's calls on episodic, semantic and working memory: ``end_session``,
``consolidate``, the facts (``facts``, ``add_fact``, ``update_fact``, ``delete_fact``,
``fact_history``, ``search_facts``), the episodes (``episodes``, ``search_episodes``,
``delete_episode``) and the ``audit_log``. They validate at the edge and call the layers
(:class:`~.layers.longterm.Layers`); ``search_facts`` and ``search_episodes`` commit nothing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from .aio import twin
from .errors import InvalidInputError
from .guard import usable
from .layers.consolidation import ConsolidationReport
from .layers.episodic import EpisodeHit
from .layers.semantic import FactHit
from .memory_engines import MemoryEngines, nonempty_query
from .records import AUDIT_LAYERS, AuditEntry, Episode, Fact, FactChange
from .textcache import forget_texts
from .validation import check_callback, check_count, check_fact_text, check_flag, check_id, check_metadata, check_unit


class MemoryLayers(MemoryEngines):
    """Episodes, facts, consolidation and the audit log (part of :class:`~.memory.TieredMemory`)."""

    @usable
    def end_session(self, session_id: str, *, user_id: str) -> Episode:
        """Extract facts from the session's turns not yet in an episode, then compress them into an
        :class:`~tiered_memory.layers.episodic.Episode` (returned). Without an LLM, or if it fails,
        rules do it (``metadata["method"] == "extractive"``); turns are never lost. Idempotent.

        Turns in which nothing was said (only system or tool messages: an agent's set-up, a tool
        run) have no conversation to summarise: no model is asked, no fact is drawn, and the
        episode returned says so (its summary is ``extractive.NOTHING_SAID``). It covers them, so
        the session is ended (a second call returns it; ``consolidate`` leaves the session be)
        and ``episodes()`` lists it, but it is never indexed: never found by ``search_episodes``,
        shown in a context's "Relevant past sessions" nor promoted into a fact. An adapter's
        ``end_session`` returns it as any other episode.

        Raises:
            VectorIndexError: the vector index failed (whatever a custom one raised) once the episode
                was stored: calling again returns that episode, making no other, and writes its vectors."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        if self._owed:  # what a failed call left, as a write pays it: a fact whose vector was refused
            self._pay_owed()  # is found by the rules again, not stored a second time
        with self._owing():
            episode = self._layers.end_session(user_id, session_id)
        assert episode is not None  # only the background path (evicted_only) may find nothing
        return episode

    @usable
    def consolidate(self, user_id: str, progress: Callable[[str, int, int], None] | None = None, *,
                    dry_run: bool = False) -> ConsolidationReport:
        """Compress idle sessions, merge near-duplicate facts, promote often-recalled episodes, archive
        old raw turns and prune stale memories; idempotent. See :mod:`.layers.consolidation`.

        With ``dry_run=True``, the report this call would return (the same counts and ids; an
        episode not yet made is named by its session's id) and nothing written: no row, no audit
        entry, no vector deleted, no model asked (:mod:`.layers.consolidation_plan`). The accesses
        earlier reads noted are written first, as for a run (they would be within seconds anyway)."""
        check_id(user_id, "user_id")
        check_callback(progress, "progress", 3)
        check_flag(dry_run, "dry_run")
        self.parts.access.flush()  # promotion and pruning read the access counts
        if self._owed and not dry_run:  # what a failed call left (as end_session pays it)
            self._pay_owed()
        with self._owing():
            return self._layers.consolidate(user_id, progress, dry_run)

    @usable
    def facts(self, user_id: str, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        """The user's facts (``Fact``), optionally of one type; invalidated ones on request."""
        check_id(user_id, "user_id")
        check_flag(include_invalid, "include_invalid")
        self.parts.access.flush()  # the counts shown are current
        return self._layers.facts.select(user_id, type, include_invalid)

    @usable
    def add_fact(self, text: str, *, user_id: str, type: str = "fact", confidence: float = 1.0,
                 metadata: Mapping[str, Any] | None = None) -> Fact:
        """Add a fact through resolution (may update or invalidate a related one); returns the fact.
        A known fact it states again (a no-op) or more fully (an update) is returned with
        ``metadata``'s keys merged into its own, as :meth:`update_fact` merges them."""
        check_id(user_id, "user_id")
        check_fact_text(text)
        check_unit(confidence, "confidence")
        meta = check_metadata(metadata, self.config.max_metadata_bytes)
        return self._jointly(lambda: self._layers.add_fact(user_id, text, type, confidence, meta))

    @usable
    def update_fact(self, /, fact_id: str, *, user_id: str, **changes: Any) -> Fact:
        """Edit ``text``, ``type``, ``confidence`` or ``metadata`` of a fact (recorded in its history)."""
        check_id(user_id, "user_id")
        check_id(fact_id, "fact_id")
        unknown = set(changes) - {"text", "type", "confidence", "metadata"}
        if unknown:
            raise InvalidInputError(f"update_fact can change text, type, confidence and metadata; got {sorted(unknown)}")
        if changes.get("text") is not None:
            check_fact_text(changes["text"])
        if changes.get("confidence") is not None:
            check_unit(changes["confidence"], "confidence")
        if changes.get("metadata") is not None:
            changes["metadata"] = check_metadata(changes["metadata"], self.config.max_metadata_bytes)
        return self._jointly(lambda: self._layers.facts.edit(user_id, fact_id, **changes))

    @usable
    def delete_fact(self, fact_id: str, *, user_id: str) -> None:
        """Delete a fact; its history keeps a ``delete`` entry, with the text (``forget_user``
        erases everything)."""
        check_id(user_id, "user_id")
        check_id(fact_id, "fact_id")
        try:
            with self._owing():
                self._jointly(lambda: self._layers.facts.delete(user_id, fact_id))
        finally:
            forget_texts()

    @usable
    def delete_episode(self, episode_id: str, *, user_id: str) -> None:
        """Delete an episode (its summary, key points and vectors); the audit log keeps a
        ``delete`` entry. Its turns are released: ``end_session`` summarises them again, with the
        LLM configured then (an earlier episode's, once the session's later episodes are deleted too).
        With :meth:`clear_session` and :meth:`delete_fact`, what a session left is removable."""
        check_id(user_id, "user_id")
        check_id(episode_id, "episode_id")
        try:
            with self._owing():
                self._layers.episodes.delete(user_id, episode_id)
        finally:
            forget_texts()

    @usable
    def fact_history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]:
        """The audit trail of the user's facts (``FactChange``), oldest first."""
        if fact_id is not None:
            check_id(fact_id, "fact_id")
        return self._layers.facts.history(check_id(user_id, "user_id"), fact_id)

    @usable
    def audit_log(self, user_id: str, *, layer: str | None = None) -> list[AuditEntry]:
        """What consolidation and eviction did to the user's episodes and working-memory items
        (``AuditEntry``: summarise, promote, archive, delete_raw, prune, evict, delete), oldest
        first; ``layer``: ``"episode"`` or ``"working"`` only. Fact changes are in :meth:`fact_history`."""
        check_id(user_id, "user_id")
        if layer is not None and layer not in AUDIT_LAYERS:
            raise InvalidInputError(f"layer must be one of {', '.join(map(repr, AUDIT_LAYERS))} or None, got {layer!r}")
        return self._layers.rows.audit_log(user_id, layer)

    @usable
    def search_facts(self, query: str, *, user_id: str, k: int = 10, type: str | None = None) -> list[FactHit]:
        """Facts by relevance (``FactHit``), optionally of one type; counts as an access."""
        check_id(user_id, "user_id")
        check_count(k, "k", minimum=1)
        now = time.time()
        with self._gate.reading():
            hits = self._layers.facts.search(nonempty_query(query), user_id=user_id, k=k, type=type,
                                             retrieval=self.config.retrieval, now=now)
        self.parts.access.note("fact", user_id, [h.fact.id for h in hits], now)
        return hits

    @usable
    def episodes(self, user_id: str, session_id: str | None = None) -> list[Episode]:
        """The user's episodes, oldest first."""
        check_id(user_id, "user_id")
        if session_id is not None:
            check_id(session_id, "session_id")
        self.parts.access.flush()  # the counts shown are current
        return self._layers.episodes.select(user_id, session_id)

    @usable
    def search_episodes(self, query: str, *, user_id: str, k: int = 5) -> list[EpisodeHit]:
        """Whole episodes (``EpisodeHit``) ranked by their best-matching key point and recency."""
        check_id(user_id, "user_id")
        check_count(k, "k", minimum=1)
        now = time.time()
        with self._gate.reading():
            hits = self._layers.episodes.search(nonempty_query(query), user_id=user_id, k=k,
                                                retrieval=self.config.retrieval, now=now)
        self.parts.access.note("episode", user_id, [h.episode.id for h in hits], now)
        return hits

    aend_session = twin(end_session)
    aconsolidate = twin(consolidate)
    afacts = twin(facts)
    # each holds the user's lock throughout: its twin waits for it on the event loop (.user_locks)
    aadd_fact = twin(add_fact, user="user_id")
    aupdate_fact = twin(update_fact, user="user_id")
    adelete_fact = twin(delete_fact, user="user_id")
    adelete_episode = twin(delete_episode, user="user_id")
    afact_history = twin(fact_history)
    aaudit_log = twin(audit_log)
    asearch_facts = twin(search_facts)
    aepisodes = twin(episodes)
    asearch_episodes = twin(search_episodes)
