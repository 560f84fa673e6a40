"""Working memory: what matters right now in one session.

Items have an importance that decays with age (``(1 - decay_per_hour) ** hours``);
the session holds at most ``capacity`` items and evicts the lowest decayed
importance; a query ranks items by relevance blended with importance. A
scratchpad dict keeps agent state (JSON values) for the session, within
``scratchpad_max_bytes`` (a write past it is refused, nothing evicted). Decisions are the
pure functions :func:`decayed`, :func:`evict`, :func:`rank` and :func:`check_pad_growth`; rows are reached only
through :class:`~tiered_memory.store.repositories.WorkingRepository`. An add reads the
session's items, decides and writes in one transaction under the session's lock (across
worker processes on PostgreSQL), so a session never holds more than ``capacity`` items.
An item's vector is kept in its row, made by the memory's embedder; an embedder change (or
``rebuild_index``) embeds every live item again (:func:`reembed`), as it does turns, facts and
episodes. A :class:`WorkingMemory` and its :class:`Scratchpad` run their calls under their memory's
:class:`~tiered_memory.guard.Calls`: closing the memory waits for them, and refuses them after.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from ..config import WorkingConfig
from ..embedding import Embedder, embed, embed_batched, embed_query
from ..aio import twin
from ..errors import ContentTooLargeError, InvalidInputError
from ..guard import Calls, usable
from ..records import WorkingItem
from ..store.repositories import WorkingRepository, WorkingWrites
from ..textcache import forget_texts
from ..json_values import json_bytes
from ..validation import (MAX_LAYER_METADATA_BYTES, check_count, check_id, check_label, check_metadata, check_query,
                          check_text, to_epoch)

MAX_ITEM_CHARS = 20_000  # a working-memory note, not a document


def decayed(importance: float, created_at: float, now: float, decay_per_hour: float) -> float:
    """Importance after ``(now - created_at)`` hours of decay (future items do not grow)."""
    hours = max(0.0, now - created_at) / 3600.0
    return float(importance * (1.0 - min(max(decay_per_hour, 0.0), 1.0)) ** hours)


def evict(items: Sequence[WorkingItem], capacity: int, now: float, decay_per_hour: float
          ) -> tuple[list[WorkingItem], list[WorkingItem]]:
    """(kept, evicted): keep the ``capacity`` items of highest decayed importance (newer wins ties)."""
    order = sorted(items, key=lambda i: (-decayed(i.importance, i.created_at, now, decay_per_hour),
                                         -i.created_at, i.id))
    return order[:max(0, capacity)], order[max(0, capacity):]


def rank(items: Sequence[WorkingItem], now: float, decay_per_hour: float,
         relevance: Sequence[float] | None = None, relevance_weight: float = 0.6) -> list[WorkingItem]:
    """Items best first with their ``score``: decayed importance, blended with relevance if given."""
    scored = []
    for n, item in enumerate(items):
        s = decayed(item.importance, item.created_at, now, decay_per_hour)
        if relevance is not None:
            s = (1 - relevance_weight) * s + relevance_weight * max(0.0, float(relevance[n]))
        scored.append(WorkingItem(**{**item.__dict__, "score": s}))
    return sorted(scored, key=lambda i: (-(i.score or 0.0), -i.created_at, i.id))


def check_note(text: object, type: object, importance: object, metadata: object,
               ) -> tuple[str, str, float, dict[str, Any]]:
    """A working-memory item's text, type, importance and metadata as :meth:`WorkingMemory.remember`
    takes them (and an import holds an exported item to), checked (pure)."""
    text = check_text(text, "working memory text")
    if len(text) > MAX_ITEM_CHARS:
        raise ContentTooLargeError(f"a working-memory item is {len(text):,} characters; the limit is "
                                   f"{MAX_ITEM_CHARS:,} (keep notes short, store the rest as messages)")
    if isinstance(importance, bool) or not isinstance(importance, (int, float)) or not 0.0 <= importance <= 1.0:
        raise InvalidInputError(f"importance must be within [0, 1], got {importance!r}")
    return (text, check_label(type, "type"), float(importance),
            dict(check_metadata(metadata, MAX_LAYER_METADATA_BYTES) or {}))


def check_pad_entry(key: object, value: Any) -> Any:
    """A scratchpad entry as a write takes it (a non-empty str key, a JSON value, str keys
    inside), within the layers' metadata bound as JSON (a ContentTooLargeError past it, as the
    whole pad past its own); returns the value as stored (pure)."""
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"scratchpad keys must be non-empty strings, got {key!r}")
    return check_metadata({key: value}, MAX_LAYER_METADATA_BYTES, f"scratchpad entry {key[:40]!r}")[key]


def pad_bytes(data: Mapping[str, Any]) -> int:
    """A scratchpad's size as a store keeps it: its JSON's UTF-8 bytes (pure)."""
    return json_bytes(data, "scratchpad")


def check_pad_growth(before: int, after: int, max_bytes: int) -> None:
    """Refuse a scratchpad write that takes the pad from ``before`` to ``after`` bytes past
    ``max_bytes`` (pure). A write that does not grow it passes, so a pad over the limit (stored
    under a larger one, or imported) can always be brought back under it."""
    if after > max_bytes and after > before:
        raise ContentTooLargeError(
            f"this write would make the session's scratchpad {after:,} bytes as JSON; the limit is "
            f"{max_bytes:,} (WorkingConfig.scratchpad_max_bytes). Nothing was written: remove entries the "
            "agent no longer needs (del wm.scratchpad[key]), keep large data elsewhere (messages, "
            "item_store), or raise the limit")


class Scratchpad(MutableMapping[str, Any]):
    """A dict of JSON values persisted per session; every write is committed. Each entry is
    held to 64,000 bytes as JSON and the whole pad to ``max_bytes``
    (``WorkingConfig.scratchpad_max_bytes``): a write past it is a ContentTooLargeError and
    changes nothing; no entry is ever dropped to make room. A write is dated by ``clock``
    (the memory's). A value read is a copy, as from ``shelve``: ``pad["plan"].append(x)``
    changes nothing stored; write it back (``plan = pad["plan"]; plan.append(x); pad["plan"] = plan``)."""

    def __init__(self, rows: WorkingRepository, user_id: str, session_id: str, calls: Calls, *,
                 max_bytes: int, clock: Callable[[], float] = time.time,
                 lock: AbstractContextManager[Any] | None = None) -> None:
        self.rows, self.user_id, self.session_id, self._calls = rows, user_id, session_id, calls
        self.max_bytes, self.clock = max_bytes, clock
        self.lock = lock  # the working memory's, taken by a write (WorkingMemory)

    @usable
    def _load(self) -> dict[str, Any]:
        return self.rows.scratchpad(self.user_id, self.session_id)

    @usable
    def _update(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Read, change and write the pad in one transaction, locked against other writers of the session."""
        with self.lock or nullcontext(), self.rows.unit() as u:
            u.lock_session(self.user_id, self.session_id)
            data = u.scratchpad(self.user_id, self.session_id)
            before = pad_bytes(data)
            change(data)
            check_pad_growth(before, pad_bytes(data), self.max_bytes)
            u.save_scratchpad(self.user_id, self.session_id, data, self.clock())

    def __getitem__(self, key: str) -> Any:
        return self._load()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        value = check_pad_entry(key, value)
        self._update(lambda data: data.__setitem__(key, value))

    def __delitem__(self, key: str) -> None:
        self._update(lambda data: data.__delitem__(key))

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def to_dict(self) -> dict[str, Any]:
        return self._load()


def admit(u: WorkingWrites, user_id: str, session_id: str, new: Sequence[tuple[WorkingItem, np.ndarray | None]],
          config: WorkingConfig, now: float) -> set[str]:
    """Write ``new`` items (with their vectors) into a session, then evict the least important
    of them all past ``config.capacity`` (a new one too), each with an ``evict`` entry in the
    audit log: how every write enters a session; returns the ids it evicted. The session's items
    are read, decided on and written under its lock, in ``u``: another worker adding to the
    session at the same time cannot leave it over capacity, nor evict (and audit) an item twice."""
    u.lock_session(user_id, session_id)
    held = u.working_items(user_id, session_id)
    _, evicted = evict([*held, *(item for item, _ in new)], config.capacity, now, config.decay_per_hour)
    for item, vector in new:
        u.insert_working_item(item, vector)
    gone: set[str] = set()
    for old in evicted:
        if u.evict_working_item(old.id):  # a prune (which does not take the lock) may have got there first
            u.audit(old.user_id, "working", old.id, "evict", {"text": old.text}, now)
            gone.add(old.id)
    return gone


def restore(rows: WorkingRepository, embedder: Embedder, config: WorkingConfig, lock: threading.RLock,
            items: Sequence[WorkingItem], now: float) -> int:
    """Write exported items as they were, in one transaction: ids, times, importance and access
    counts kept; each embedded as :meth:`WorkingMemory.remember` embeds it, so ranking by
    relevance finds it. A session is held to this memory's ``capacity`` as ``remember`` holds
    it (:func:`admit`): an import into a smaller one keeps the most important items. The
    caller skips ids already stored. Returns how many were written."""
    vecs = embed_batched(embedder, [i.text for i in items])
    sessions: dict[tuple[str, str], list[tuple[WorkingItem, np.ndarray | None]]] = {}
    for item, vector in zip(items, vecs):
        sessions.setdefault((item.user_id, item.session_id), []).append((item, vector))
    with lock, rows.unit() as u:
        for user_id, session_id in sorted(sessions):  # session locks in one order: two imports never deadlock
            admit(u, user_id, session_id, sessions[user_id, session_id], config, now)
    return len(items)


REEMBED_BATCH = 1_000  # items embedded and written per transaction by :func:`reembed`


def reembed(rows: WorkingRepository, embedder: Embedder, lock: threading.RLock) -> int:
    """Embed every live item of every session again with ``embedder`` and store the vectors:
    what an embedder change (or ``rebuild_index``) does, as it re-embeds turns, facts and
    episodes. Without it an item keeps the vector of the model that remembered it: of another
    dimension it is embedded again at each ranking, of the same one it is compared with a
    query's vector of another space (a wrong relevance) until it fades. Returns how many."""
    items = rows.live_working_items(None)
    for start in range(0, len(items), REEMBED_BATCH):
        part = items[start:start + REEMBED_BATCH]
        vectors = embed_batched(embedder, [i.text for i in part])
        with lock, rows.unit() as u:
            u.set_working_vectors([(i.id, v) for i, v in zip(part, vectors)])
    return len(items)


def touch_items(rows: WorkingRepository, user_id: str, ids: Sequence[str], now: float) -> None:
    """Count one access per listed id (the items a context handed to a model)."""
    if ids:
        with rows.unit() as u:
            u.touch_working(user_id, ids, now)


class WorkingMemory:
    """One session's working memory. Get it with :meth:`TieredMemory.working_memory`.

    Its times come from ``clock``, the memory's (``TieredMemory(clock=)``, else
    ``time.time``): an item's ``created_at`` when remembered, the ``now`` its decay is judged
    at in ``items`` and in eviction (unless a call passes ``now``), the scratchpad's ``updated_at``.

    Example:
        >>> wm = memory.working_memory("s1", user_id="u1")  # doctest: +SKIP
        >>> item = wm.remember("user is debugging the payment webhook", importance=0.9,  # doctest: +SKIP
        ...                    type="goal")
        >>> wm.scratchpad["step"] = 2  # doctest: +SKIP
    """

    def __init__(self, rows: WorkingRepository, embedder: Embedder, config: WorkingConfig,
                 lock: AbstractContextManager[Any], *, user_id: str, session_id: str, calls: Calls,
                 clock: Callable[[], float] = time.time) -> None:
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        self.rows, self.embedder, self.config, self.lock = rows, embedder, config, lock
        self.user_id, self.session_id, self.clock = user_id, session_id, clock
        self._calls = calls  # the memory's: its close() waits for these calls, then refuses them
        # lock: what a write takes (Parts.writing's: the user's lock, then the write lock; WritingLock)
        self.scratchpad = Scratchpad(rows, user_id, session_id, calls, max_bytes=config.scratchpad_max_bytes,
                                     clock=clock, lock=lock)

    @usable
    def remember(self, text: str, *, importance: float = 0.5, type: str = "note",
                 metadata: dict[str, Any] | None = None, now: float | None = None) -> WorkingItem:
        """Add an item; evicts the least important ones beyond ``capacity``, the new one too if it
        is the least important (as every eviction, with an ``evict`` entry in the audit log).

        Returns:
            The item as written, with ``evicted=True`` if it was evicted at once: the session
            holds no item of its id then (``forget`` returns False).
        """
        text, type, importance, metadata = check_note(text, type, importance, metadata)
        now = to_epoch(now, self.clock())  # seconds, a datetime or ISO text, within 1900..2200
        item = WorkingItem(id=uuid.uuid4().hex, user_id=self.user_id, session_id=self.session_id, text=text,
                           type=type, importance=importance, created_at=now, metadata=metadata)
        vector = embed(self.embedder, [text])[0]
        with self.lock, self.rows.unit() as u:
            gone = admit(u, self.user_id, self.session_id, [(item, vector)], self.config, now)
        return replace(item, evicted=True) if item.id in gone else item

    @usable
    def items_raw(self) -> list[WorkingItem]:
        return self.rows.working_items(self.user_id, self.session_id)

    @usable
    def items(self, query: str | None = None, *, k: int | None = None, now: float | None = None,
              vector: np.ndarray | None = None) -> list[WorkingItem]:
        """Items best first: by decayed importance, or blended with relevance to ``query``
        (``vector`` is its embedding when the caller has it already)."""
        check_count(k, "k", minimum=0, optional=True)
        if query is not None:
            check_query(query)  # a str of valid text (lone surrogates would fail in the embedder)
        now = to_epoch(now, self.clock())
        pairs = self.rows.working_vectors(self.user_id, self.session_id)
        items = [i for i, _ in pairs]
        relevance = None
        if query and query.strip() and items:
            qv = embed_query(self.embedder, query) if vector is None else vector
            vecs: list[np.ndarray] = [v for _, v in pairs if v is not None and v.shape == qv.shape]
            if len(vecs) < len(pairs):  # made by another embedder (the store switched models): embed again
                vecs = list(embed(self.embedder, [i.text for i in items]))
            relevance = [float(np.dot(v, qv)) for v in vecs]
        ranked = rank(items, now, self.config.decay_per_hour, relevance)
        return ranked[:k] if k is not None else ranked

    @usable
    def forget(self, item_id: str) -> bool:
        """Remove one item (and its text from the process's caches, :mod:`~tiered_memory.textcache`);
        False when this session holds no item of that id."""
        check_id(item_id, "item_id")
        with self.rows.unit() as u:
            gone = u.forget_working_item(self.user_id, self.session_id, item_id)
        if gone:
            forget_texts()
        return gone

    @usable
    def clear(self) -> int:
        """Remove every item and the scratchpad of this session (and the items' texts from the
        process's caches); returns items removed."""
        with self.rows.unit() as u:
            gone = u.clear_working(self.user_id, self.session_id)
        if gone:
            forget_texts()
        return gone

    # async twins: the same methods, run in a worker thread
    aremember = twin(remember)
    aitems = twin(items)
    aforget = twin(forget)
    aclear = twin(clear)
