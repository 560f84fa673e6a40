"""The facade's reads of turns and its recall: ``get_messages``, ``sessions``,
``get_buffer``, ``search``, ``search_sessions`` and ``build_context``. They commit nothing:
what they hand to the caller is noted in the :class:`~.parts.AccessLog`, which writes access
counts in batches.
"""

from __future__ import annotations

import time
from typing import Any, Collection, Mapping

from .aio import twin
from .context.assembly import accessed, assemble, session_buffer
from .context.render import MemoryContext
from .embedding import embed_query
from .errors import InvalidInputError
from .guard import usable
from .layers.item_recall import ITEM_LAYER, as_memory_hit, merge_by_score
from .memory_engines import MemoryEngines, nonempty_query
from .recall.search import search_turns
from .recall.sessions import search_sessions as find_sessions
from .types import MemoryHit, SessionHit, SessionInfo, StoredMessage
from .validation import check_count, check_filters, check_flag, check_id, check_query


def shown_ids(values: object, name: str = "shown", what: str = "message ids") -> frozenset[str]:
    """``build_context``'s ``shown`` (a collection of message ids, or ``None``) as a frozenset; a
    lone string, which would iterate as its characters, or an item that is not a string is refused
    (``name`` and ``what``: ``shown_texts``, of texts, is checked so too)."""
    if values is None:
        return frozenset()
    if isinstance(values, (str, bytes)) or not isinstance(values, Collection):
        raise InvalidInputError(f"{name} must be a collection of {what} (a list or set of str), "
                                f"got {type(values).__name__}")
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        raise InvalidInputError(f"{name} must hold {what} (str), got {type(bad[0]).__name__}")
    return frozenset(values)


class MemoryReads(MemoryEngines):
    """Reading turns back and recalling them (part of :class:`~.memory.TieredMemory`)."""

    @usable
    def get_messages(self, session_id: str, *, user_id: str, limit: int | None = None) -> list[StoredMessage]:
        """A session's messages, oldest first (the last ``limit`` if given)."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_count(limit, "limit", minimum=0, optional=True)
        return self.store.get_messages(user_id, session_id, limit=limit)

    @usable
    def sessions(self, user_id: str) -> list[SessionInfo]:
        """The user's sessions that hold messages (id, message count, first and last timestamp),
        in the order their first message was stored, not by timestamp: sessions imported or
        added with older timestamps come after those stored before them."""
        check_id(user_id, "user_id")
        return self.store.sessions(user_id)

    @usable
    def get_buffer(self, session_id: str, *, user_id: str) -> list[StoredMessage]:
        """The session's recent whole turns within the buffer's message and token limits."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        return session_buffer(self.parts, user_id, session_id)

    @usable
    def search(
        self, query: str, *, user_id: str, k: int = 10, session_id: str | None = None,
        filters: Mapping[str, Any] | None = None, include_items: bool = False,
    ) -> list[MemoryHit]:
        """Hybrid recall (vector + keyword + recency) over ``user_id``'s memories.

        ``session_id`` keeps the turns of that session. ``filters`` keeps the turns that match
        every key: ``role`` (one of the roles), ``since`` / ``until`` (epoch seconds, bounds
        of the turn's timestamp), and any other key names a key of the turn's ``metadata``,
        whose value must equal the one given (one JSON scalar; ``None`` also matches a turn
        without the key). A turn's own fields are not filter keys: ``{"session_id": "s"}``
        looks for a metadata key of that name, so pass ``session_id=`` for the session.

        ``include_items=True`` also searches the user's items written through the LangGraph
        store (hits with ``layer="item"``, see :mod:`.layers.item_recall`); items belong to no
        session and carry no message metadata, so a search with ``session_id`` or ``filters``
        leaves them out."""
        check_id(user_id, "user_id")
        if session_id is not None:
            check_id(session_id, "session_id")
        nonempty_query(query)
        check_count(k, "k", minimum=1)
        check_filters(filters)
        check_flag(include_items, "include_items")
        with_items = include_items and session_id is None and not filters and self._layers_ok()
        now = time.time()
        with self._gate.reading():
            vector = embed_query(self.embedder, query) if with_items else None  # one embedding for both
            hits = search_turns(store=self.store, index=self.index, embedder=self.embedder,
                                config=self.config.retrieval, query=query, user_id=user_id, k=k,
                                session_id=session_id, filters=filters, now=now, vector=vector)
            if with_items:
                items = [as_memory_hit(h) for h in self._items.recall(query, user_id=user_id, k=k, vector=vector)]
                hits = merge_by_score(hits, items, k)
        self.parts.access.note("turn", user_id, [h.id for h in hits if h.layer != ITEM_LAYER], now)
        return hits

    @usable
    def search_sessions(
        self, query: str, *, user_id: str, k: int = 10, turns: int = 3,
        filters: Mapping[str, Any] | None = None,
    ) -> list[SessionHit]:
        """The past sessions of ``user_id`` that hold what ``query`` asks about, best first.

        A session scores as its best turn under :meth:`search`'s ranking; each
        :class:`~tiered_memory.types.SessionHit` carries its best ``turns`` turns (the
        ``filters`` of :meth:`search` apply to them). To find *where* something was talked
        about (the sessions to reread, or whose episodes to load), ten sessions ranked so hold
        more of the right ones than the sessions of the ten best turns.

        Example:
            >>> for found in memory.search_sessions("the trip to Rome", user_id="u1", k=3):
            ...     print(found.session_id, found.hits[0].text)  # doctest: +SKIP
        """
        check_id(user_id, "user_id")
        nonempty_query(query)
        check_count(k, "k", minimum=1)
        check_count(turns, "turns", minimum=1)
        check_filters(filters)
        now = time.time()
        with self._gate.reading():
            found = find_sessions(store=self.store, index=self.index, embedder=self.embedder,
                                  config=self.config.retrieval, query=query, user_id=user_id, k=k,
                                  per_session=turns, filters=filters, now=now)
        self.parts.access.note("turn", user_id, [h.id for f in found for h in f.hits], now)
        return found

    @usable
    def build_context(
        self, query: str, *, user_id: str, session_id: str, max_tokens: int | None = None,
        include_items: bool = False, shown: Collection[str] | None = None, include_recent: bool = True,
        shown_texts: Collection[str] | None = None,
    ) -> MemoryContext:
        """Recent turns plus working memory, known facts, past sessions and relevant past turns,
        within ``max_tokens``; what did not fit is in ``dropped``. See :mod:`.context.assembly`.
        ``include_items=True`` adds an ``items`` section: the user's LangGraph store items
        that match the query, as quoted data like the rest.

        ``shown``: ids of stored messages the caller already shows the model (a framework's
        short-term queue, an agent's state), left out of the relevant past turns before the
        budget is fitted, so their room goes to other memories. They are not in ``dropped``,
        which lists what the model will not see; the recent buffer is then the session's newest
        turns other than those (the turns before them).

        ``shown_texts``: texts of messages the caller shows the model that may not be stored (a
        framework's short-term queue kept outside the memory): a relevant past turn that says one
        of them, in any role (its words, case, spacing and punctuation aside), is left out before
        the budget is fitted, as a twin of a ``shown`` message is (a user who asks again what they
        asked last week), so its room goes to other memories. Not in ``dropped`` either. So is a recent
        turn that says one (a question asked again in this conversation), once the recent turns are chosen
        with it, so its answer keeps its place: its room goes to the sections.

        ``include_recent=False``: no recent turns (``recent`` is empty), for a caller that shows the
        model :meth:`~.context.render.MemoryContext.memory_text` alone (its framework's state holds
        the conversation): the whole budget goes to the sections, and the session's turns other
        than ``shown`` are past turns to recall, not a buffer the model would never see."""
        check_query(query)
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_count(max_tokens, "max_tokens", minimum=1, optional=True)
        check_flag(include_items, "include_items")
        check_flag(include_recent, "include_recent")
        left_out = shown_ids(shown)
        heard = shown_ids(shown_texts, "shown_texts", "message texts")
        now = time.time()
        with self._gate.reading():
            context = assemble(self.parts, self._layers if self._layers_ok() else None, query,
                               user_id=user_id, session_id=session_id, max_tokens=max_tokens,
                               items=self._items if include_items and self._layers_ok() else None, shown=left_out,
                               include_recent=include_recent, shown_texts=heard)
        for layer, ids in accessed(context).items():
            self.parts.access.note(layer, user_id, ids, now)
        return context

    aget_messages = twin(get_messages)
    aget_buffer = twin(get_buffer)
    asessions = twin(sessions)
    asearch = twin(search)
    asearch_sessions = twin(search_sessions)
    abuild_context = twin(build_context)
