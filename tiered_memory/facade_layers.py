"""The :class:`~tiered_memory.TieredMemory` methods of the episodic, semantic and working layers.

A mixin, so ``memory.py`` stays small: each method validates ids and hands over to
:class:`~tiered_memory.layers.Layers` (created on first use as ``self._layers``).
LLM work is async first (``aend_session``, ``aconsolidate``); the sync twins run it
with :func:`~tiered_memory._sync.run_sync`, which also works inside Jupyter.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ._sync import run_sync
from .validation import check_id as _uid

if TYPE_CHECKING:
    from .consolidation import ConsolidationReport
    from .episodic import Episode, EpisodeHit
    from .layers import Layers
    from .semantic import Fact, FactChange, FactHit
    from .working import WorkingMemory


def _blocking(method: Callable[..., Any]) -> Callable[..., Any]:
    """The sync twin of an async method; works where an event loop is already running."""

    @functools.wraps(method)
    def sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        return run_sync(method(self, *args, **kwargs))

    sync.__name__ = method.__name__[1:]
    return sync


class LayerMethods:
    """Episodes, facts, working memory and consolidation on :class:`~tiered_memory.TieredMemory`."""

    config: Any

    @functools.cached_property
    def _layers(self) -> "Layers":
        """The :class:`~tiered_memory.layers.Layers` of this memory, created on first use."""
        from .layers import Layers

        return Layers(self)  # type: ignore[arg-type]

    def _layers_ok(self) -> bool:
        from .store.layer_rows import supports_layers

        return supports_layers(getattr(self, "store", None))

    async def aend_session(self, session_id: str, *, user_id: str) -> "Episode":
        """Extract facts from the session's turns not yet in an episode, then compress them into an
        :class:`~tiered_memory.episodic.Episode` (returned). Without an LLM, or if it fails, rules do
        it (``metadata["method"] == "extractive"``); turns are never lost. Idempotent."""
        episode = await self._layers.end_session(_uid(user_id, "user_id"), session_id)
        assert episode is not None  # only the background path (evicted_only) may find nothing
        return episode

    async def aconsolidate(self, user_id: str, progress: Callable[[str, int, int], None] | None = None,
                           ) -> "ConsolidationReport":
        """Compress idle sessions, merge near-duplicate facts, promote often-recalled episodes, archive
        old raw turns and prune stale memories; idempotent. See :mod:`.consolidation`."""
        return await self._layers.consolidate(_uid(user_id, "user_id"), progress)

    end_session = _blocking(aend_session)
    consolidate = _blocking(aconsolidate)

    def facts(self, user_id: str, type: str | None = None, include_invalid: bool = False) -> list["Fact"]:
        """The user's facts (``Fact``), optionally of one type; invalidated ones on request."""
        return self._layers.facts.select(_uid(user_id, "user_id"), type, include_invalid)

    def add_fact(self, text: str, *, user_id: str, type: str = "fact", confidence: float = 1.0,
                 metadata: Mapping[str, Any] | None = None) -> "Fact":
        """Add a fact through resolution (may update or invalidate a related one); returns the fact."""
        return self._layers.add_fact(_uid(user_id, "user_id"), text, type, confidence, metadata)

    def update_fact(self, fact_id: str, *, user_id: str, **changes: Any) -> "Fact":
        """Edit ``text``, ``type``, ``confidence`` or ``metadata`` of a fact (recorded in its history)."""
        return self._layers.facts.edit(_uid(user_id, "user_id"), fact_id, **changes)

    def delete_fact(self, fact_id: str, *, user_id: str) -> None:
        """Delete a fact; its history keeps a ``delete`` entry (``forget_user`` erases everything)."""
        self._layers.facts.delete(_uid(user_id, "user_id"), fact_id)

    def fact_history(self, user_id: str, fact_id: str | None = None) -> list["FactChange"]:
        """The audit trail of the user's facts (``FactChange``), oldest first."""
        return self._layers.facts.history(_uid(user_id, "user_id"), fact_id)

    def search_facts(self, query: str, *, user_id: str, k: int = 10, type: str | None = None) -> list["FactHit"]:
        """Facts by relevance (``FactHit``), optionally of one type; counts as an access."""
        return self._layers.facts.search(
            self._query(query), user_id=_uid(user_id, "user_id"), k=k, type=type, retrieval=self.config.retrieval)

    def episodes(self, user_id: str, session_id: str | None = None) -> list["Episode"]:
        """The user's episodes, oldest first."""
        return self._layers.episodes.select(_uid(user_id, "user_id"), session_id)

    def search_episodes(self, query: str, *, user_id: str, k: int = 5) -> list["EpisodeHit"]:
        """Whole episodes (``EpisodeHit``) ranked by their best-matching key point and recency."""
        return self._layers.episodes.search(
            self._query(query), user_id=_uid(user_id, "user_id"), k=k, retrieval=self.config.retrieval)

    def working_memory(self, session_id: str, *, user_id: str) -> "WorkingMemory":
        """The session's :class:`~tiered_memory.working.WorkingMemory` (``remember``, ``items``, ``scratchpad``)."""
        return self._layers.working(session_id, user_id)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for background compression queued by ``EpisodeConfig.compress_after_turns``."""
        if "_layers" in self.__dict__:
            self._layers.wait(timeout)

    def _query(self, query: str) -> str:
        if not isinstance(query, str) or not query.strip():
            from .errors import InvalidInputError

            raise InvalidInputError("query must be a non-empty string")
        return query
