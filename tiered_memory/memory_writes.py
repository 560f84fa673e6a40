"""The facade's writes and deletions of turns: ``add``, ``add_many``, ``forget``,
``clear_session`` and ``forget_user`` (with the interrupted deletions an open or a write
finishes first). They validate at the edge and run the procedures of :mod:`.writes` under
the memory's write lock, each after its user's lock (:mod:`.user_locks`): ``forget``,
``clear_session`` and ``forget_user`` have a vector index of its own engine delete the vectors
outside the write lock, the user's own writes waiting (with pgvector, one transaction under it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import Any, Callable, Iterable, Mapping

from .aio import twin
from .errors import NotFoundError, StoreError, TieredMemoryError, VectorIndexError
from .guard import usable
from .memory_engines import MemoryEngines
from .recall.forgetting import STORED_OWING, pay_before_storing
from .recall.indexing import index_orphans
from .textcache import forget_texts
from .types import Message
from .validation import check_callback, check_id
from .writes import (chosen_among, drop_message_rows, drop_session_rows, drop_user, drop_user_rows, drop_user_vectors,
                     drop_vectors, mark_forget, not_yet_archived, not_yet_stored, pending_forgets, rows_of,
                     write_messages)

log = logging.getLogger("tiered_memory")


class MemoryWrites(MemoryEngines):
    """Storing and deleting turns (part of :class:`~.memory.TieredMemory`)."""

    @usable
    def add(
        self, role: str, content: str, *, session_id: str, user_id: str,
        metadata: Mapping[str, Any] | None = None, timestamp: Any = None,
    ) -> str:
        """Store one message; returns its id. See :meth:`add_many`."""
        msg = {"role": role, "content": content, "metadata": metadata, "timestamp": timestamp}
        return self.add_many([msg], session_id=session_id, user_id=user_id)[0]

    @usable
    def add_many(
        self, messages: Iterable[Message | Mapping[str, Any]], *, session_id: str, user_id: str,
        progress: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Store messages in order (the bulk path; embeds in batches); returns their ids.

        Every message is validated first; if one is bad, nothing is written and
        :class:`~tiered_memory.errors.InvalidInputError` says which. When this returns,
        the messages are committed. If the vector engine then fails,
        :class:`~tiered_memory.errors.VectorIndexError` is raised, the messages stay
        stored, and they are indexed on the next open or :meth:`rebuild_index`; so too when a
        message's ``id`` held a deleted message whose vectors the index has not deleted yet (they
        go first: the message is stored, and indexed by the next write that can delete them). Where
        rows and vectors share one engine (``vector_store="pgvector"``), they commit in
        one transaction: on any failure nothing of the batch is stored, and the error says so.

        A message may carry its own ``id``: retrying a batch whose call did not return (a
        timeout, a killed worker) then stores it once; the ids are returned either way.

        Any number of messages may go in one call: they are written and indexed in chunks
        of ``MemoryConfig.write_chunk`` (one transaction each), and ``progress(n)`` is
        called after each chunk with its size. A call interrupted half-way has committed
        whole chunks; run it again with the same message ids and it stores the rest.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        check_callback(progress, "progress", 1)
        rows, chosen = rows_of(messages, session_id=session_id, user_id=user_id, config=self.config, now=time.time())
        if not rows:
            return []
        with self._users.user(user_id), self._write_lock:  # the user's lock first: see .user_locks
            self._finish_forget_of(user_id)
            if self._owed:  # and the vectors a failed deletion left (an id stored again must not lose its new one)
                self._pay_owed()
            new = not_yet_stored(self.store, rows, chosen, user_id)
            if new and chosen and self._layers_ok():  # a turn consolidate archived since is stored too
                new = not_yet_archived(new, chosen, user_id, self._layers.rows)
            if not new:
                return [r.id for r in rows]  # a retry of a batch that was stored: nothing to do
            # an id deleted before whose vectors the index still owes: the old go before the new come
            owed_first: VectorIndexError | None = None
            if again := chosen_among(new, chosen):
                try:
                    self._jointly(lambda: pay_before_storing(self.store.owed_rows, self.index, turns=again))
                except VectorIndexError as e:  # stored pending, indexed by the next payment; raised below
                    owed_first, self._owed = e, True
            write = functools.partial(write_messages, batch=len(rows), store=self.store, index=self.parts.index,
                                      embedder=self.embedder, config=self.config, progress=progress,
                                      jointly=self._jointly if self._joint is not None else None,
                                      defer=owed_first is not None)
            try:
                write(new)
            except StoreError:
                # another worker storing the same chosen ids at the same moment (a retry racing the
                # call it retries) took their unique keys: what it stored is skipped, the rest written
                left = not_yet_stored(self.store, new, chosen_among(new, chosen), user_id)
                if not chosen or len(left) == len(new):
                    raise
                if left:
                    write(left)
            if owed_first is not None:
                cause = owed_first.__cause__ or owed_first
                raise VectorIndexError(STORED_OWING.format(n=len(new), error=cause)) from owed_first
        if self.config.episodes.compress_after_turns is not None and self._layers_ok():  # queued, no LLM here
            self._layers.after_add(user_id, session_id)
        return [r.id for r in rows]

    @usable
    def forget(self, memory_id: str, *, user_id: str) -> None:
        """Delete one message of ``user_id`` from every store and index (and from the archive
        ``consolidate`` moves old turns to). An episode or fact drawn from it stays (it may
        quote it): remove those with :meth:`delete_episode` and :meth:`delete_fact`."""
        check_id(user_id, "user_id")
        check_id(memory_id, "memory_id")

        def rows() -> list[str]:
            archived = self._forget_archived(user_id, ids=[memory_id])
            try:
                return drop_message_rows(self.store, user_id, memory_id)
            except NotFoundError:
                if not archived:
                    raise
                return []

        try:
            with self._users.user(user_id):
                self._drop_turns(user_id, rows, what="the message is")
        finally:  # its vectors owed or not, its text leaves the process
            forget_texts()

    @usable
    def clear_session(self, session_id: str, *, user_id: str) -> int:
        """Delete a session's messages (archived ones too) and its working memory (items and
        scratchpad); returns how many messages. Episodes and facts already drawn from the
        session stay: remove those with :meth:`delete_episode` and :meth:`delete_fact`."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        with self._users.user(user_id):
            try:
                ids = self._drop_turns(user_id, lambda: drop_session_rows(self.store, user_id, session_id),
                                       what="the session's messages are")
                failure = None
            except VectorIndexError as e:  # the rows are deleted, their vectors owed: the rest goes too
                if self._joint is not None:  # (one engine: nothing was deleted)
                    raise
                ids, failure = [], e
            with self._write_lock:
                archived = self._forget_archived(user_id, session_id=session_id)
                if self._layers_ok():
                    self.working_memory(session_id, user_id=user_id).clear()
            forget_texts()
            if failure is not None:
                raise failure
        return len(ids) + archived

    def _drop_turns(self, user_id: str, rows: Callable[[], list[str]], *, what: str) -> list[str]:
        """Delete turns of ``user_id``: ``rows()`` deletes their rows (recording the vectors they
        owe) and returns their ids; the index then deletes their vectors, and the user's messages
        that duplicated them are indexed again. Where rows and vectors live in two engines, the
        vectors go outside the write lock, as ``forget_user``'s do (a delete on a vector server
        may be slow): the caller holds the user's lock, and the gate of :mod:`.user_locks` is
        closed on the user meanwhile. An id stored again meanwhile by a write that holds no user
        lock (an import) pays the same entries first (:mod:`.recall.forgetting`): the old vectors
        go before its new one comes, whichever payment runs. Where one engine holds both, all of
        it is one transaction under the lock.

        Raises:
            VectorIndexError: the rows are deleted, their vectors still owed or the duplicates
                they released left pending, for the next write (one engine: nothing was deleted).
        """
        def orphans() -> None:
            index_orphans(self.store, self.parts.index, self.embedder, user_id, self.config.dedup_threshold)

        if self._joint is not None:
            def joint() -> list[str]:
                dropped = rows()
                drop_vectors(self.store, self.index, user_id, dropped, what=what)
                orphans()
                return dropped

            return self._jointly(joint)
        try:
            with contextlib.ExitStack() as deleting:
                with self._write_lock:
                    ids = rows()
                    if ids:
                        deleting.enter_context(self._users.deleting(user_id))  # closed before the lock opens
                drop_vectors(self.store, self.index, user_id, ids, what=what)
            with self._write_lock:  # after the delete: an orphan is not taken for a duplicate of a vector going
                orphans()
        except VectorIndexError:  # vectors owed, or orphans left pending: the next write pays or indexes them
            with self._write_lock:  # (the gate open again): a payment running now cannot clear it after
                self._owed = True
            raise
        return ids

    def _forget_archived(self, user_id: str, *, ids: list[str] | None = None, session_id: str | None = None) -> int:
        if not self._layers_ok():
            return 0
        with self._rows.unit() as u:
            return u.forget_archived(user_id, ids=ids or (), session_id=session_id)

    @usable
    def forget_user(self, user_id: str) -> int:
        """Remove every trace of ``user_id`` from every store and index; returns how many messages
        (the turns ``consolidate`` archived too, as :meth:`clear_session` counts them).

        The deletion is recorded in the record store before it starts. If it fails half-way
        (a full disk, a vector engine error, a kill), it is finished on the next open, or
        before the next write for that user, so no row or vector of a forgotten user survives.
        """
        check_id(user_id, "user_id")
        with self._users.user(user_id):  # its own writes wait for the deletion; the other users' do not
            return self._forget_user(user_id)

    def _forget_user(self, user_id: str) -> int:
        """``forget_user``'s deletion. The rows go under the write lock, marked pending first; the
        vectors then outside it, where rows and vectors live in two engines (a delete by filter may
        be slow), the gate of :mod:`.user_locks` closed on the user meanwhile: a write of their
        vectors waits for the delete, which would take it too. Where one engine holds both, they
        go in one transaction under the lock. Then the deletion is marked complete."""
        with contextlib.ExitStack() as deleting:
            with self._write_lock:
                self.parts.access.flush()  # no pending count may outlive the user's rows
                archived = self._rows.archived_count(user_id) if self._layers_ok() else 0
                self._unfinished = mark_forget(self.store, user_id, pending=True)
                if self._joint is not None:
                    ids = self._jointly(lambda: drop_user(self.store, self.index, user_id, joint=True))
                else:
                    ids = drop_user_rows(self.store, user_id)
                    deleting.enter_context(self._users.deleting(user_id))  # closed before the lock opens
            if self._joint is None:  # a failure leaves the user pending: finished at open or before their next write
                drop_user_vectors(self.index, user_id, joint=False)
        with self._write_lock:
            self._unfinished = mark_forget(self.store, user_id, pending=False)
        forget_texts()  # no text of theirs stays in the process either (textcache.py)
        return len(ids) + archived

    def _finish_forget_of(self, user_id: str) -> None:
        """Before a write of ``user_id`` (``add_many``, and the layers' through ``Parts.writing``): an
        interrupted ``forget_user`` of theirs is finished first, since finished after the write (the
        next open, or their next ``add``), it would delete what the write stored. In a write's unit
        of rows and vectors (pgvector), the finish commits or rolls back with it (``_jointly``).

        Raises:
            TieredMemoryError: the deletion failed again (the write is not made).
        """
        with self._write_lock:
            if user_id in self._unfinished:
                self._finish_forgets(only=user_id)

    def _finish_forgets(self, only: str | None = None) -> None:
        """Complete deletions a failure interrupted (all at open, with the vectors deleted rows still
        owe; one user before a write)."""
        if only is None:
            self._pay_owed()
        pending = pending_forgets(self.store)
        if only is not None and only not in pending:  # finished meanwhile (another worker, a commit in doubt)
            self._unfinished.discard(only)
        for user in sorted(pending if only is None else pending & {only}):
            try:
                self._forget_user(user)  # no user lock: a write of theirs holds it, or the write lock (.user_locks)
            except TieredMemoryError as e:  # still failing: the next open or write tries again
                log.warning("finishing forget_user(%r) failed again: %s", user, e)
                if only is not None:
                    raise

    # each holds the user's lock throughout: its twin waits for it on the event loop (.user_locks)
    aadd = twin(add, user="user_id")
    aadd_many = twin(add_many, user="user_id")
    aforget = twin(forget, user="user_id")
    aclear_session = twin(clear_session, user="user_id")
    aforget_user = twin(forget_user, user="user_id")
