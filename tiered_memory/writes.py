"""Writing and removing messages: what :class:`~.memory.TieredMemory` runs under its write lock.

The facade checks the ids, takes its write lock and calls these. Each takes the parts it
needs; ``jointly(fn)`` runs ``fn`` as one transaction of rows and vectors where both live
in one engine (pgvector), and simply runs it elsewhere.

Invariants:

- A batch is validated whole before anything is written: one bad message writes nothing.
- Rows are committed before their vectors are written. Where rows and vectors live in two
  engines, a vector failure leaves the rows stored and pending (the next open or
  ``rebuild_index`` indexes them); where they share one, a write chunk commits whole or
  not at all. Into an index that writes behind, rows are stored already marked indexed
  (their vectors embedded before the commit, queued after it).
- Only the last chunk of a long batch waits for the disk; its sync covers the chunks
  before, and an error that stops the batch syncs them before it is raised.
- A message id chosen by the caller makes a retry idempotent: the same message under the
  same id is skipped, another message under it is refused.
- What a deletion owes the vector index is recorded in the record store
  (:mod:`.store.pending_deletes`) and cleared only once the index has deleted it, so no
  vector of erased text outlives a failure: a user's deletion before it starts (an
  interrupted one is run again whole; the ``meta`` record of users); a message's or a
  session's vectors in the transaction that deletes the rows (one entry each, paid by
  :mod:`.recall.forgetting`). A caller's id stored again is indexed once its old vectors are
  deleted (before, unless the index fails: then at the next payment).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, TypeVar

from .startup import note_forgotten
from .config import MemoryConfig
from .embedding import Embedder
from .errors import InvalidInputError, NotFoundError
from .guard import vector_errors_typed
from .ids import new_id
from .recall.forgetting import delete_owed
from .recall.indexing import index_messages, store_and_index, write_chunks
from .store.base import RecordStore
from .store.pending_deletes import PENDING_DELETIONS, Owed, changed, entries, owed
from .store.repositories import EpisodeRepository
from .types import Message, StoredMessage
from .validation import normalize_message
from .vector.base import VectorIndex

T = TypeVar("T")
Jointly = Callable[[Callable[[], T]], T]


def rows_of(messages: Iterable[Message | Mapping[str, Any]], *, session_id: str, user_id: str,
            config: MemoryConfig, now: float) -> tuple[list[StoredMessage], list[str]]:
    """The batch as rows to store (each with its id, chosen or new) and the ids the caller chose.

    Raises:
        InvalidInputError: ``messages`` is not a list of messages, one of them is bad (the
            error names it), or two carry the same id.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise InvalidInputError(
            f"messages must be a list of dicts or Message objects, got {type(messages).__name__}")
    normalized = []
    for n, item in enumerate(list(messages)):
        try:
            normalized.append(normalize_message(item, max_chars=config.max_content_chars,
                                                max_metadata_bytes=config.max_metadata_bytes, now=now))
        except Exception as e:
            raise type(e)(f"message {n}: {e}") from e
    rows = [
        StoredMessage(id=m.id or new_id(), user_id=user_id, session_id=session_id, role=m.role,
                      content=m.content, metadata=dict(m.metadata or {}),
                      timestamp=float(m.timestamp))  # type: ignore[arg-type]
        for m in normalized
    ]
    chosen = [m.id for m in normalized if m.id is not None]
    if len(set(chosen)) != len(chosen):
        raise InvalidInputError("two messages of the batch have the same id")
    return rows, chosen


def not_yet_stored(store: RecordStore, rows: list[StoredMessage], chosen: list[str],
                   user_id: str) -> list[StoredMessage]:
    """The rows to write: a caller-chosen id already stored for this user with the same
    message is a retry and is skipped; the same id with another message, or an id another
    user holds, is refused (nothing is written)."""
    if not chosen:
        return rows
    stored = store.get_by_ids(user_id, chosen)
    return _skip_retries(rows, stored, store.existing_ids([i for i in chosen if i not in stored]))


def chosen_among(rows: list[StoredMessage], chosen: list[str]) -> list[str]:
    """The ids of ``rows`` that their caller chose (pure; one set, not one per row)."""
    picked = set(chosen)
    return [r.id for r in rows if r.id in picked]


def not_yet_archived(rows: list[StoredMessage], chosen: list[str], user_id: str,
                     archive: EpisodeRepository) -> list[StoredMessage]:
    """``rows`` less those whose caller-chosen id names a turn ``consolidate`` has since moved
    to the archive: that turn is stored, so a retry of its batch skips it rather than store it
    live a second time. The same id with another message, or an id another user's archived
    turn holds, is refused (nothing is written), as for live turns."""
    ids = chosen_among(rows, chosen)
    if not ids:
        return rows
    mine = archive.archived_by_ids(user_id, ids)
    return _skip_retries(rows, mine, archive.archive_owners([i for i in ids if i not in mine]), " (archived)")


def _skip_retries(rows: list[StoredMessage], held: Mapping[str, Any], taken: Iterable[str],
                  where: str = "") -> list[StoredMessage]:
    """``rows`` less the retries, those whose id ``held`` (this user's turns) keeps with the same
    session, role and text; the same id with another message, or an id in ``taken`` (another
    user's), is refused."""
    for r in rows:
        old = held.get(r.id)
        if old is not None and (old.session_id, old.role, old.content) != (r.session_id, r.role, r.content):
            raise InvalidInputError(f"message id {r.id!r} already holds a different message{where}; "
                                    "use a new id for new content")
    if taken := sorted(taken):
        raise InvalidInputError(f"message ids {taken[:3]} are already in use; choose other ids")
    return [r for r in rows if r.id not in held]


def write_messages(new: list[StoredMessage], *, batch: int, store: RecordStore, index: VectorIndex,
                   embedder: Embedder, config: MemoryConfig, jointly: Jointly[None] | None,
                   progress: Callable[[int], None] | None, defer: bool = False) -> None:
    """Store and index ``new`` (what is left to write of a batch of ``batch`` messages) in
    chunks of ``config.write_chunk``; ``jointly`` when rows and vectors share an engine. With
    ``defer`` the rows are only stored, pending: ids stored again whose old vectors the index
    has not deleted yet (:func:`~.recall.forgetting.pay_before_storing`).

    Raises:
        VectorIndexError: the vector engine failed (what is stored then is in the message).
    """
    failure: Exception | None = None

    def write(part: list[StoredMessage], start: int, last: bool) -> None:
        nonlocal failure
        if defer:  # indexed once their old vectors are gone (the payment indexes pending rows)
            store.insert_messages(part, sync=last)
        elif jointly is not None:  # rows and vectors in one engine: each chunk commits whole
            write_jointly(part, start=start, batch=batch, store=store, index=index,
                          embedder=embedder, config=config, jointly=jointly)
        elif failure is None:
            failure = store_and_index(part, store=store, index=index, embedder=embedder,
                                      threshold=config.dedup_threshold, sync=last)
        else:  # after an index failure the rest is still stored, for repair
            store.insert_messages(part, sync=last)

    write_chunks(new, config.write_chunk, write, store=store, progress=progress)
    if failure is not None:
        with vector_errors_typed(f"{batch} messages were stored but not indexed ({{error}}); they "
                                 "will be indexed on the next open or by rebuild_index()"):
            raise failure


def write_jointly(part: list[StoredMessage], *, start: int, batch: int, store: RecordStore, index: VectorIndex,
                  embedder: Embedder, config: MemoryConfig, jointly: Jointly[None]) -> None:
    """One chunk of :func:`write_messages` into one engine: rows and vectors commit together."""
    lost = (f"nothing of the batch of {batch} was stored ({{error}}); retry it" if start == 0 else
            f"the first {start} messages of the batch were stored, the rest not ({{error}}); "
            "retry the batch with the same message ids to store the rest (a batch whose ids "
            "the library chose cannot tell which were stored: give long batches ids)")

    def write() -> None:
        store.insert_messages(part)
        with vector_errors_typed(lost):
            index_messages(part, store=store, index=index, embedder=embedder, threshold=config.dedup_threshold)

    jointly(write)


def drop_message_rows(store: RecordStore, user_id: str, memory_id: str) -> list[str]:
    """Delete one message of the user (its vectors owed by the deletion: :func:`drop_vectors`
    next); returns its id.

    Raises:
        NotFoundError: the user holds no such message.
    """
    if not store.delete_message(user_id, memory_id):
        raise NotFoundError(f"no memory {memory_id!r} for this user")
    note_forgotten(store, 1)
    return [memory_id]


def drop_session_rows(store: RecordStore, user_id: str, session_id: str) -> list[str]:
    """Delete a session's messages (their vectors owed, as :func:`drop_message_rows`'s); returns their ids."""
    ids = store.clear_session(user_id, session_id)
    note_forgotten(store, len(ids))
    return ids


def drop_vectors(store: RecordStore, index: VectorIndex, user_id: str, turns: list[str], *, what: str) -> None:
    """Delete the vectors of deleted turns (each turn's and its chunks'), clearing what their
    deletion owed.

    Raises:
        VectorIndexError: the index failed; the vectors stay owed (``what`` names the turns).
    """
    delete_owed(store.owed_rows, index, entries(user_id, turns=turns), what=what)


def drop_user(store: RecordStore, index: VectorIndex, user_id: str, *, joint: bool) -> list[str]:
    """Delete every row of the user, then every vector; returns the message ids.

    Raises:
        VectorIndexError: the vectors could not be deleted (``joint``: nothing was).
    """
    ids = drop_user_rows(store, user_id)
    drop_user_vectors(index, user_id, joint=joint)
    return ids


def drop_user_rows(store: RecordStore, user_id: str) -> list[str]:
    """Delete every row of the user (its vectors next: :func:`drop_user_vectors`); returns the message ids."""
    ids = store.forget_user(user_id)
    note_forgotten(store, len(ids))
    return ids


def drop_user_vectors(index: VectorIndex, user_id: str, *, joint: bool) -> None:
    """Delete every vector of the user.

    Raises:
        VectorIndexError: the vectors could not be deleted (``joint``: nothing was).
    """
    with vector_errors_typed(
            "the user's records and vectors are not deleted ({error}); nothing was, retry" if joint
            else "the user's records are deleted but not yet their vectors ({error}); the deletion "
            "is finished on the next open, or before the next write for this user"):
        index.delete_user(user_id)


def pending_forgets(store: RecordStore) -> set[str]:
    """Users whose ``forget_user`` started and has not completed (an unreadable record: none)."""
    return set(owed(store.get_meta(PENDING_DELETIONS)).users)


def mark_forget(store: RecordStore, user_id: str, *, pending: bool) -> set[str]:
    """Record that ``user_id``'s ``forget_user`` started (``pending``) or completed; returns the
    users pending now. One change of the record (``change_meta``), so another worker's mark
    made meanwhile is kept: one lost would leave a deletion half done, one undone would
    forget that user again, later writes and all, at the next open."""
    user = Owed(users=frozenset([user_id]))
    return set(owed(store.change_meta(
        PENDING_DELETIONS, lambda raw: changed(raw, add=user) if pending else changed(raw, remove=user))).users)
