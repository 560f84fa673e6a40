"""A LangChain retriever over the core's hybrid recall."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from tiered_memory import MemoryHit, TieredMemory

from .messages import LC_KEY

__all__ = ["TieredMemoryRetriever", "hit_to_document"]


def hit_to_document(hit: MemoryHit) -> Document:
    """A ``Document`` of one hit: the text, and its score, layer, role, session and time
    as metadata (the message's own metadata under ``"metadata"``)."""
    own = {k: v for k, v in hit.metadata.items() if k != LC_KEY}
    return Document(
        id=hit.id,
        page_content=hit.text,
        metadata={"id": hit.id, "score": hit.score, "layer": hit.layer, "role": hit.role,
                  "session_id": hit.session_id, "timestamp": hit.timestamp, "metadata": own},
    )


class TieredMemoryRetriever(BaseRetriever):
    """Recall a user's memories as ``Document``\\ s, best first.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory`.
        user_id: whose memories to search.
        k: how many documents to return.
        session_id: search only this session.
        filters: metadata / ``role`` / ``since`` / ``until`` filters of
            :meth:`TieredMemory.search`.

    ``invoke(query, k=..., user_id=..., session_id=..., filters=...)`` overrides
    any of these for one call.

    Example:
        >>> retriever = TieredMemoryRetriever(memory=memory, user_id="u1", k=3)  # doctest: +SKIP
        >>> retriever.invoke("where do I live?")[0].metadata["score"]  # doctest: +SKIP
        0.032
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: TieredMemory
    user_id: str
    k: int = 4
    session_id: str | None = None
    filters: dict[str, Any] | None = None

    def _search(self, query: str, **overrides: Any) -> list[Document]:
        unknown = set(overrides) - {"k", "user_id", "session_id", "filters"}
        if unknown:
            raise TypeError(f"unexpected arguments {sorted(unknown)}")
        hits = self.memory.search(
            query,
            user_id=overrides.get("user_id") or self.user_id,
            k=overrides.get("k") or self.k,
            session_id=overrides.get("session_id", self.session_id),
            filters=overrides.get("filters", self.filters),
        )
        return [hit_to_document(h) for h in hits]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any,
    ) -> list[Document]:
        return self._search(query, **kwargs)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any,
    ) -> list[Document]:
        return await asyncio.to_thread(self._search, query, **kwargs)
