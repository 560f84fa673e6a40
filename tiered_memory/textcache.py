"""The caches that hold users' texts in process memory, and the one call that empties them.

Recall's pure text functions remember their answers keyed by the text they read (a turn's
stems, its capitalised words, whether it holds a number), the token counter remembers each
text's count, an embedder its recent queries and the keyword index how many rows hold a
query's terms. None hands one user's text to another (an answer is a function of the text
alone), but each keeps the text after its user asked to be forgotten, where a memory dump
would find it.

Invariants:

- Every cache keyed by (or holding) a user's text registers here with :func:`holds_texts`:
  anything with a ``cache_clear()`` method (an ``lru_cache``, or an object of ours).
- Every call that removes text from the store calls :func:`forget_texts` after its rows are
  gone (after the commit: a search before it could cache the text again), which empties
  every registered cache: ``forget_user``, ``forget``, ``clear_session``, ``delete_fact``,
  ``delete_episode``, :meth:`~.layers.working.WorkingMemory.forget` and ``clear``,
  ``consolidate`` when ``delete_raw`` deleted turns, and :class:`~.layers.items.ItemStore`'s
  ``write_many`` (once per batch that deletes or overwrites an item: the LangGraph store's
  ``batch``, ``put``, ``delete``) and ``sweep``. Calls after which the store still holds the
  text (a fact's history, the audit log, the archive, pruned rows) need not: see
  docs/guarantees.md. The caches are keyed by text, not by user, so they are emptied whole:
  every user's next search fills them again (measured on a 2,000-turn user with the static
  embedder: a search 6.5 ms warm, 6-12 ms the first one after; the emptying itself 0.15 ms;
  a one-off script).
- Objects are held weakly: a closed memory's token counter or embedder is not kept alive.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol, TypeVar


class Clearable(Protocol):
    def cache_clear(self) -> None: ...


C = TypeVar("C", bound=Clearable)

_held: weakref.WeakSet[Clearable] = weakref.WeakSet()
_lock = threading.Lock()


def holds_texts(cache: C) -> C:
    """Register ``cache`` as holding users' texts (a decorator over ``lru_cache``, or a call in
    a cache object's constructor); returns it."""
    with _lock:
        _held.add(cache)
    return cache


def forget_texts() -> None:
    """Empty every registered cache (after a user's, a session's or a message's rows are gone)."""
    with _lock:
        caches = list(_held)
    for cache in caches:
        cache.cache_clear()
