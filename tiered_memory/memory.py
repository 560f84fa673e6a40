"""The :class:`TieredMemory` facade. Sync methods do the work; async twins run the
same method in a worker thread (``asyncio.to_thread``), so there is one implementation.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

from .buffer import select_buffer
from .config import MemoryConfig
from .context import MemoryContext
from .embedding import Embedder, default_embedder, embedder_name
from .errors import InvalidInputError, NotFoundError, TieredMemoryError, VectorIndexError
from .indexing import index_messages, repair
from .recall import search_turns
from .store.base import RecordStore
from .tokens import TokenCounter, default_token_counter
from .types import MemoryHit, Message, Stats, StoredMessage
from .facade_layers import LayerMethods
from .opening import FolderLock, OpeningMethods
from .opening import STORE_ENTRIES as STORE_ENTRIES  # defined here before: re-exported
from .opening import foreign_entries as foreign_entries
from .validation import check_count, check_filters, check_id, check_query, normalize_message
from .vector.base import VectorIndex

T = TypeVar("T")


def default_path() -> Path:
    """``$TIERED_MEMORY_HOME`` or ``~/.tiered-memory``."""
    return Path(os.environ.get("TIERED_MEMORY_HOME") or Path.home() / ".tiered-memory")


def _twin(method: Callable[..., T]) -> Callable[..., Any]:
    """Make the async twin of a sync method: same signature, run off the event loop."""

    @functools.wraps(method)
    async def twin(self: "TieredMemory", *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(method, self, *args, **kwargs)

    twin.__name__ = "a" + method.__name__
    twin.__doc__ = f"Async twin of :meth:`{method.__name__}`."
    return twin


class TieredMemory(OpeningMethods, LayerMethods):
    """Long-term memory for LLM agents, scoped by ``user_id`` and ``session_id``.

    Args:
        path: folder of the embedded store (SQLite + Chroma); default ``~/.tiered-memory``.
        config: tuning (buffer, retrieval, budgets, limits).
        embedder: any object with ``embed_documents``/``embed_query``; default
            :func:`~tiered_memory.embedding.default_embedder` (the static table distilled
            from the bundled all-MiniLM-L6-v2; no torch).
        vector_store: a :class:`~tiered_memory.vector.base.VectorIndex`, or ``"chroma"``
            (default), ``"qdrant"`` (local mode in ``path``) or an ``http(s)://`` Chroma URL.
        record_store: a :class:`~tiered_memory.store.base.RecordStore`; default SQLite in ``path``.
        token_counter: ``str -> int``; default cl100k offline, else a heuristic.

    Example:
        >>> with TieredMemory("/tmp/tm-doc") as memory:  # doctest: +SKIP
        ...     memory.add("user", "I live in Lisbon", user_id="u1", session_id="s1")
        ...     memory.search("where do I live?", user_id="u1")[0].text
        'I live in Lisbon'
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        config: MemoryConfig | None = None,
        embedder: Embedder | None = None,
        vector_store: VectorIndex | str | None = None,
        record_store: RecordStore | str | None = None,
        token_counter: TokenCounter | None = None,
        llm: Any = None,
    ) -> None:
        self.config = config or MemoryConfig()
        self.embedder: Embedder = embedder or default_embedder(self.config.embed_batch_size)
        self.count_tokens: TokenCounter = token_counter or default_token_counter()
        self.llm = llm
        self.path = Path(path) if path is not None else default_path()
        self._lock: FolderLock | None = None
        self._closed = False
        self._write_lock = threading.RLock()
        self.store = self._open_store(record_store)
        try:
            self.index = self._open_index(vector_store)
            self._startup_repair()
        except BaseException:
            self.store.close()
            if self._lock:
                self._lock.release()
            raise

    # ---- repair (opening is in .opening) -------------------------------
    def _repair(self, *, full: bool) -> dict[str, int]:
        with self._write_lock:
            report = repair(store=self.store, index=self.index, embedder=self.embedder,
                            threshold=self.config.dedup_threshold, full=full)
            if full and self._layers_ok():  # episode / fact vectors are derived from their rows too
                report.update(self._layers.repair())
            return report

    def _rebuild(self) -> dict[str, int]:
        with self._write_lock:
            self.index.reset()
            self.store.reset_indexed()
            self.store.set_meta("embedder", embedder_name(self.embedder))
            report = self._repair(full=False)
            if self._layers_ok():
                report.update(self._layers.reindex())
            return report

    # ---- lifecycle -------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if "_layers" in self.__dict__:
                self._layers.close()  # waits for background compression
            if not getattr(self.store, "shared", False):
                self.store.set_meta("state", "closed")
        finally:
            self.index.close()
            self.store.close()
            if self._lock:
                self._lock.release()

    def __enter__(self) -> "TieredMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writes ----------------------------------------------------------
    def add(
        self, role: str, content: str, *, session_id: str, user_id: str,
        metadata: Mapping[str, Any] | None = None, timestamp: Any = None,
    ) -> str:
        """Store one message; returns its id. See :meth:`add_many`."""
        msg = {"role": role, "content": content, "metadata": metadata, "timestamp": timestamp}
        return self.add_many([msg], session_id=session_id, user_id=user_id)[0]

    def add_many(
        self, messages: Iterable[Message | Mapping[str, Any]], *, session_id: str, user_id: str,
    ) -> list[str]:
        """Store messages in order (the bulk path; embeds in batches); returns their ids.

        Every message is validated first; if one is bad, nothing is written and
        :class:`~tiered_memory.errors.InvalidInputError` says which. When this returns,
        the messages are committed. If the vector engine then fails,
        :class:`~tiered_memory.errors.VectorIndexError` is raised, the messages stay
        stored, and they are indexed on the next open or :meth:`rebuild_index`.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        now = time.time()
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
            raise InvalidInputError(
                f"messages must be a list of dicts or Message objects, got {type(messages).__name__}")
        items = list(messages)
        normalized = []
        for n, item in enumerate(items):
            try:
                normalized.append(normalize_message(
                    item, max_chars=self.config.max_content_chars,
                    max_metadata_bytes=self.config.max_metadata_bytes, now=now))
            except Exception as e:
                raise type(e)(f"message {n}: {e}") from e
        rows = [
            StoredMessage(id=uuid.uuid4().hex, user_id=user_id, session_id=session_id, role=m.role,
                          content=m.content, metadata=dict(m.metadata or {}),
                          timestamp=float(m.timestamp))  # type: ignore[arg-type]
            for m in normalized
        ]
        if not rows:
            return []
        with self._write_lock:
            self.store.insert_messages(rows)
            try:
                index_messages(rows, store=self.store, index=self.index, embedder=self.embedder,
                               threshold=self.config.dedup_threshold)
            except Exception as e:  # a custom VectorIndex may raise anything: keep the promise typed
                if isinstance(e, TieredMemoryError) and not isinstance(e, VectorIndexError):
                    raise
                raise VectorIndexError(
                    f"{len(rows)} messages were stored but not indexed ({e}); they will be "
                    "indexed on the next open or by rebuild_index()") from e
        if self.config.episodes.compress_after_turns is not None and self._layers_ok():  # queued, no LLM here
            self._layers.after_add(user_id, session_id)
        return [r.id for r in rows]

    def forget(self, memory_id: str, *, user_id: str) -> None:
        """Delete one message of ``user_id`` from every store and index."""
        check_id(user_id, "user_id")
        with self._write_lock:
            if not self.store.delete_message(user_id, memory_id):
                raise NotFoundError(f"no memory {memory_id!r} for this user")
            self.index.delete([memory_id])

    def clear_session(self, session_id: str, *, user_id: str) -> int:
        """Delete a session's messages and its working memory (items and scratchpad); returns
        how many messages. Episodes and facts already drawn from the session stay: remove
        those with :meth:`delete_fact` or :meth:`forget_user`."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        with self._write_lock:
            ids = self.store.clear_session(user_id, session_id)
            self.index.delete(ids)
            if self._layers_ok():
                self.working_memory(session_id, user_id=user_id).clear()
        return len(ids)

    def forget_user(self, user_id: str) -> int:
        """Remove every trace of ``user_id`` from every store and index; returns messages removed."""
        check_id(user_id, "user_id")
        with self._write_lock:
            ids = self.store.forget_user(user_id)
            self.index.delete_user(user_id)
        return len(ids)

    def rebuild_index(self) -> dict[str, int]:
        """Drop the vector index and rebuild it from the record store."""
        return self._rebuild()

    # ---- reads -----------------------------------------------------------
    def get_messages(self, session_id: str, *, user_id: str, limit: int | None = None) -> list[StoredMessage]:
        """A session's messages, oldest first (the last ``limit`` if given)."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_count(limit, "limit", minimum=0, optional=True)
        return self.store.get_messages(user_id, session_id, limit=limit)

    def get_buffer(self, session_id: str, *, user_id: str) -> list[StoredMessage]:
        """The session's recent whole turns within the buffer's message and token limits."""
        msgs = self.get_messages(session_id, user_id=user_id, limit=self.config.buffer.max_messages * 2)
        kept, _ = select_buffer(msgs, max_messages=self.config.buffer.max_messages,
                                max_tokens=self.config.buffer.max_tokens, count=self.count_tokens)
        return kept

    def search(
        self, query: str, *, user_id: str, k: int = 10, session_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
    ) -> list[MemoryHit]:
        """Hybrid recall (vector + keyword + recency) over ``user_id``'s memories."""
        check_id(user_id, "user_id")
        if session_id is not None:
            check_id(session_id, "session_id")
        if not isinstance(query, str) or not query.strip():
            from .errors import InvalidInputError

            raise InvalidInputError("query must be a non-empty string")
        if not isinstance(k, int) or k < 1:
            from .errors import InvalidInputError

            raise InvalidInputError(f"k must be a positive int, got {k!r}")
        check_filters(filters)
        hits = search_turns(store=self.store, index=self.index, embedder=self.embedder,
                            config=self.config.retrieval, query=query, user_id=user_id, k=k,
                            session_id=session_id, filters=filters)
        self.store.touch([h.id for h in hits], time.time())
        return hits

    def build_context(
        self, query: str, *, user_id: str, session_id: str, max_tokens: int | None = None,
    ) -> MemoryContext:
        """Recent turns plus working memory, known facts, past sessions and relevant past turns,
        within ``max_tokens``; what did not fit is in ``dropped``. See :mod:`.assembly`."""
        from .assembly import assemble

        check_query(query)
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_count(max_tokens, "max_tokens", minimum=1, optional=True)
        return assemble(self, query, user_id=user_id, session_id=session_id, max_tokens=max_tokens,
                        layers=self._layers if self._layers_ok() else None)

    def export_jsonl(self, path: str | os.PathLike[str], user_id: str | None = None) -> int:
        """Write messages (one user's or all) as JSONL; returns the count. See :mod:`.portable`."""
        from .portable import export_jsonl

        return export_jsonl(self, path, user_id)

    def import_jsonl(self, path: str | os.PathLike[str], *, skip_invalid: bool = False,
                     progress: Callable[[int], None] | None = None, user_id: str | None = None) -> Any:
        """Import a JSONL export (vectors recomputed); returns an ``ImportReport``. Each line
        goes to the user it names, unless ``user_id`` scopes the import to one user (lines of
        others are then invalid)."""
        from .portable import import_jsonl

        return import_jsonl(self, path, skip_invalid=skip_invalid, progress=progress, user_id=user_id)

    def stats(self) -> Stats:
        c = self.store.counts()
        return Stats(users=c["users"], sessions=c["sessions"], messages=c["messages"],
                     indexed=c["indexed"], duplicates=c["duplicates"], vectors=self.index.count())

    # ---- async twins -----------------------------------------------------
    aadd = _twin(add)
    aadd_many = _twin(add_many)
    aforget = _twin(forget)
    aclear_session = _twin(clear_session)
    aforget_user = _twin(forget_user)
    arebuild_index = _twin(rebuild_index)
    aget_messages = _twin(get_messages)
    aget_buffer = _twin(get_buffer)
    asearch = _twin(search)
    abuild_context = _twin(build_context)
    afacts = _twin(LayerMethods.facts)
    aadd_fact = _twin(LayerMethods.add_fact)
    aupdate_fact = _twin(LayerMethods.update_fact)
    adelete_fact = _twin(LayerMethods.delete_fact)
    afact_history = _twin(LayerMethods.fact_history)
    asearch_facts = _twin(LayerMethods.search_facts)
    aepisodes = _twin(LayerMethods.episodes)
    asearch_episodes = _twin(LayerMethods.search_episodes)
    astats = _twin(stats)
    aexport_jsonl = _twin(export_jsonl)
    aimport_jsonl = _twin(import_jsonl)
