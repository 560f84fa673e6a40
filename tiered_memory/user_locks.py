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

The async twins of the calls that hold their user's lock throughout (:func:`~.aio.twin` with
``user=``: the turns' writes and deletions, the facts' and episodes' edits, an import scoped to the
user) wait for it in a :class:`Line` of that user, on their event loop, not in a worker thread: a
user whose deletion runs never has its queued writes hold the threads of the loop's executor, which
the other users' calls (and the app's own work) need. The line's first call takes a thread once no
thread holds the lock, and there takes the lock without waiting (:meth:`Line.attempt`; taken
meanwhile by a sync call, it gives the thread back and waits again), so a user's lined calls hold
one worker thread at most, and take the lock in the order they were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections import Counter, deque
from typing import Any, Callable, Iterator, TypeVar, cast

from .vector.base import VectorIndex, VectorItem

#: the index methods that write vectors: they wait while a user of theirs is being deleted
WRITES = ("upsert", "upsert_behind")
T = TypeVar("T")


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
        self._held: Counter[str] = Counter()  # how deep threads hold each user's lock
        self._lines: dict[str, deque[Line]] = {}  # each user's async calls waiting for its lock
        self._deleting: Counter[str] = Counter()

    @contextlib.contextmanager
    def user(self, user_id: str) -> Iterator[None]:
        """Hold ``user_id``'s lock (re-entrant); none when this thread holds the write lock already."""
        if holds(self._write_lock):
            yield
            return
        lock = self._join(user_id)
        try:
            lock.acquire()
            with self._holding(user_id, lock):
                yield
        finally:
            self._part(user_id)

    def line(self, user_id: str) -> "Line":
        """A place at the end of ``user_id``'s line, for an async call made now (on the running loop)."""
        return Line(self, user_id, asyncio.get_running_loop())

    def _join(self, user_id: str) -> threading.RLock:
        with self._changed:
            lock, users = self._locks.get(user_id) or (threading.RLock(), 0)
            self._locks[user_id] = (lock, users + 1)
            return lock

    def _part(self, user_id: str) -> None:
        with self._changed:
            lock, users = self._locks[user_id]
            if users == 1:
                del self._locks[user_id]
            else:
                self._locks[user_id] = (lock, users - 1)

    @contextlib.contextmanager
    def _holding(self, user_id: str, lock: threading.RLock) -> Iterator[None]:
        """The block of a thread that has just taken ``lock``; its end releases it, and wakes the first
        of the user's line once no thread holds it (counted after the release: never woken too soon)."""
        with self._changed:
            self._held[user_id] += 1
        try:
            yield
        finally:
            lock.release()
            with self._changed:
                self._held[user_id] -= 1
                if not self._held[user_id]:
                    del self._held[user_id]
                    self._wake(user_id)

    def _wake(self, user_id: str) -> None:
        """Under ``_changed``: wake the first of ``user_id``'s line (it looks again)."""
        line = self._lines.get(user_id)
        while line:
            if line[0].wake():
                return
            line.popleft()  # its loop is closed: nobody waits there any more
        self._lines.pop(user_id, None)

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


class Line:
    """An async call's place in its user's line (:meth:`UserLocks.line`), from the call until it
    holds the user's lock in a worker thread, or leaves. Only the first of the line looks for a
    thread, once no thread holds the lock: the user's async calls hold one worker thread at most,
    and take the lock in the order they were made."""

    def __init__(self, users: UserLocks, user_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self._users, self._user_id, self._loop = users, user_id, loop
        self._woken: asyncio.Future[None] | None = None
        with users._changed:
            users._lines.setdefault(user_id, deque()).append(self)

    async def ready(self) -> None:
        """Return once this call is the first of its line and no thread holds the user's lock."""
        users = self._users
        while True:
            with users._changed:
                line = users._lines.get(self._user_id)
                if line and line[0] is self and not users._held[self._user_id]:
                    return
                self._woken = woken = self._loop.create_future()
            await woken

    def wake(self) -> bool:
        """Under the locks' ``_changed``, from any thread: have :meth:`ready` look again. False if
        this call's loop is closed."""
        woken = self._woken
        if woken is None:
            return True  # not waiting: it looks before it waits
        try:
            self._loop.call_soon_threadsafe(_settle, woken)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def attempt(self, call: Callable[[], T]) -> tuple[T] | None:
        """In a worker thread: ``call()`` run holding the user's lock, taken without waiting (this call
        then leaves the line, and the next waits for the lock); ``None``, having run nothing, if a
        thread took the lock since :meth:`ready` returned."""
        users = self._users
        lock = users._join(self._user_id)
        try:
            if not lock.acquire(blocking=False):
                return None
            with users._holding(self._user_id, lock):
                self.leave()
                return (call(),)
        finally:
            users._part(self._user_id)

    def leave(self) -> None:
        """Leave the line (once done, or given up): the next, if first now, looks again."""
        users = self._users
        with users._changed:
            line = users._lines.get(self._user_id)
            if line is None or self not in line:
                return
            first = line[0] is self
            line.remove(self)
            if not line:
                del users._lines[self._user_id]
            elif first:
                users._wake(self._user_id)


def _settle(woken: "asyncio.Future[None]") -> None:
    if not woken.done():
        woken.set_result(None)


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
