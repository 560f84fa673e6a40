"""One user's writes against that user's deletion, under the memory's one write lock.

The write lock serialises writes. ``forget_user``, ``forget`` and ``clear_session`` delete the
user's rows under it, then have the vector index delete their vectors *outside* it (by filter,
or by id): on a vector server under load, or for a user with many vectors, that delete takes a
while, and the other users' writes go on meanwhile. Two things keep the same user's writes from
losing their vectors to that delete:

- :class:`UserLocks` holds a lock per user, taken *before* the write lock by the calls that write
  or delete one user's records: ``add_many``, ``forget``, ``clear_session``, ``forget_user``, and
  through :meth:`~.parts.Parts.writing` the facts', episodes' and store items' writes (a put of
  several users' items takes theirs in order) and an import scoped to one user. The user's own
  calls wait for its deletion to finish, without holding the write lock.
- :func:`gated_index` is the vector index as the memory's parts see it: a write of vectors of a
  user whose delete runs, made by a caller that holds the write lock already (an import of every
  user, the indexing of rows a failure left pending, a call from a progress callback), waits until
  the delete returns. It waits holding the write lock; the delete needs no lock the waiter holds
  (the index's, and the record store's for the entries a delete by id pays), so it always returns.

Lock order: a user's lock, then the write lock, never the reverse. A call made while its thread
holds the write lock already (a write finishing an interrupted deletion, a progress callback's
call) takes no user lock: the write lock serialises it, and the gate covers its vectors.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections import Counter
from typing import Any, Callable, Iterator, cast

from .vector.base import VectorIndex, VectorItem

#: the index methods that write vectors: they wait while a user of theirs is being deleted
WRITES = ("upsert", "upsert_behind")


def holds(lock: threading.RLock) -> bool:
    """Whether the current thread holds ``lock`` (``threading.Condition`` asks it the same way)."""
    owned: Callable[[], bool] = getattr(lock, "_is_owned")
    return owned()


class UserLocks:
    """A lock per user (made on first use, dropped when no call holds it) and the users whose
    vectors are being deleted outside the write lock."""

    def __init__(self, write_lock: threading.RLock) -> None:
        self._write_lock = write_lock
        self._changed = threading.Condition()
        self._locks: dict[str, tuple[threading.RLock, int]] = {}
        self._deleting: Counter[str] = Counter()

    @contextlib.contextmanager
    def user(self, user_id: str) -> Iterator[None]:
        """Hold ``user_id``'s lock (re-entrant); none when this thread holds the write lock already."""
        if holds(self._write_lock):
            yield
            return
        with self._changed:
            lock, users = self._locks.get(user_id) or (threading.RLock(), 0)
            self._locks[user_id] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._changed:
                lock, users = self._locks[user_id]
                if users == 1:
                    del self._locks[user_id]
                else:
                    self._locks[user_id] = (lock, users - 1)

    @contextlib.contextmanager
    def deleting(self, user_id: str) -> Iterator[None]:
        """While ``user_id``'s vectors are being deleted: writes of that user's vectors wait.
        Entered holding the write lock, so no write under it slips in before the gate closes."""
        with self._changed:
            self._deleting[user_id] += 1
        try:
            yield
        finally:
            with self._changed:
                self._deleting[user_id] -= 1
                if not self._deleting[user_id]:
                    del self._deleting[user_id]
                self._changed.notify_all()

    def wait(self, items: list[VectorItem]) -> None:
        """Return once no user of ``items`` is being deleted."""
        if not self._deleting:  # the usual case: no lock taken
            return
        users = {i.user_id for i in items}
        with self._changed:
            self._changed.wait_for(lambda: not users & self._deleting.keys())


class _Gated:
    """The base of every gated index view: what the view's class does not name is the index's own,
    read and set through."""

    _inner: Any
    _users: UserLocks

    def __getattr__(self, name: str) -> Any:  # what the index answers dynamically (a wrapper's)
        return _gate(self._users, name, getattr(self._inner, name))

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


def _gate(users: UserLocks, name: str, target: Any) -> Any:
    """``target``, the index's ``name``; a vector write (:data:`WRITES`) waits first while a user
    of its items is being deleted. The one gate: the view's forwarded methods and the attributes
    it reads through both come here."""
    if name not in WRITES or not callable(target):
        return target

    def gated(items: list[VectorItem]) -> None:
        users.wait(items)
        target(items)
    return gated


def _forward(name: str) -> Any:
    def call(self: _Gated, *args: Any, **kwargs: Any) -> Any:
        return _gate(self._users, name, getattr(self._inner, name))(*args, **kwargs)
    return call


def _read(name: str) -> Callable[[_Gated], Any]:
    def read(self: _Gated) -> Any:
        return getattr(self._inner, name)
    return read


_VIEWS: dict[type, type] = {}


def _view(cls: type) -> type:
    """A class whose public methods and class attributes are ``cls``'s, forwarded: what a type
    check of the index's optional protocols finds (``isinstance`` reads the class statically from
    Python 3.12 on, so a ``__getattr__`` alone would hide them)."""
    body: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name)
        if inspect.isfunction(attr) or isinstance(attr, (staticmethod, classmethod)):
            body[name] = _forward(name)
        elif isinstance(attr, property):
            body[name] = property(_read(name))
        else:
            body[name] = attr  # a class attribute (``cheap_user_filter``)
    return type(f"Gated{cls.__name__}", (_Gated,), body)


def gated_index(index: VectorIndex, users: UserLocks) -> VectorIndex:
    """``index`` whose vector writes wait while ``users`` says a user of theirs is being deleted;
    every other call, attribute read and attribute set is the index's own."""
    cls = type(index)
    view = _VIEWS.get(cls) or _VIEWS.setdefault(cls, _view(cls))
    made: object = object.__new__(view)
    object.__setattr__(made, "_inner", index)
    object.__setattr__(made, "_users", users)
    return cast(VectorIndex, made)
