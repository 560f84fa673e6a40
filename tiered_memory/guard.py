"""The edge of the facade: a memory that is closed or was inherited through ``fork``
refuses every new call with a typed error (a call already running when ``close()``
starts is let finish: close waits for it), and what the environment raises (an ``OSError``,
a ``sqlite3`` error, whatever a custom vector index throws) reaches the caller as the
library's own errors, with what to do. The handles a memory hands out (a session's
``WorkingMemory`` and its scratchpad, the ``ItemStore`` behind the LangGraph store) share its
:class:`Calls`, so their calls are refused and waited for alike."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
import weakref
from typing import Any, Callable, Iterator, Protocol, TypeVar

from .errors import StoreError, TieredMemoryError, UsageError, VectorIndexError

log = logging.getLogger("tiered_memory")
T = TypeVar("T")


class Calls:
    """The calls running on a memory and on the handles it handed out, so its ``close()``
    lets them finish first (a write whose caller gave up, a cancelled ``a*`` twin's worker
    thread, is still stored whole) and refuses the calls that start after it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._closed = False
        self._closer: int | None = None  # the thread running close()
        self._done = False  # that close has finished
        self._pid = os.getpid()
        self._depth = threading.local()  # calls of this thread (a call may make others)
        self._wake: "weakref.WeakSet[threading.Event]" = weakref.WeakSet()  # set when close begins
        self._deferred: Callable[[], None] | None = None  # a close made inside a call: run as it returns

    def inside(self) -> bool:
        """True in a thread that is running a call."""
        return bool(getattr(self._depth, "n", 0))

    @contextlib.contextmanager
    def _open(self) -> Iterator[None]:
        """The block runs under the lock if a call may start now: refused once :meth:`close`
        has begun (unless made by a running call), or in a forked child (checked before the
        lock, which the fork may have left held)."""
        if self.forked():
            raise forked_error(self._pid)
        with self._cond:
            if self._closed and not self.inside():
                raise closed_error()
            yield

    def check(self) -> None:
        """Refuse as a call would be refused, counting nothing: ``with memory:`` on a closed
        memory, or one inherited through ``fork``, fails at its start, not at its first call."""
        with self._open():
            pass

    def _enter(self, *, here: bool) -> None:
        """Count a call (``here``: run by this thread, now), if one may start (:meth:`_open`)."""
        with self._open():  # checked and counted at once: close() cannot slip in between
            if here:
                self._hold()
            self._running += 1

    def _hold(self) -> None:
        # this thread's depth first and last, under the lock: a signal handler's close() that
        # runs in between (the lock is re-entrant) finds the call it interrupted counted as its own
        self._depth.n = getattr(self._depth, "n", 0) + 1

    def _leave(self, *, here: bool) -> None:
        """Uncount a call (``here``: the one this thread ran); the outermost call of the thread
        that closed inside it shuts the memory as it returns."""
        with self._cond:
            self._running -= 1
            if here:
                self._depth.n -= 1
            self._cond.notify_all()
            shut = None
            if here and self._deferred is not None and not self.inside() and self._closer == threading.get_ident():
                shut, self._deferred = self._deferred, None
        if shut is not None:  # a close() made inside this thread's call: now that it returned
            self._shut(shut, deferred=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """One call, counted while it runs (see :meth:`_enter`)."""
        self._enter(here=True)
        try:
            yield
        finally:
            self._leave(here=True)

    @contextlib.contextmanager
    def _as_call(self) -> Iterator[None]:
        """This thread runs a call :meth:`admit` counted, until the block ends, which uncounts it."""
        with self._cond:
            self._hold()
        try:
            yield
        finally:
            self._leave(here=True)

    def admit(self) -> "Admitted":
        """Count a call now that a worker thread will run later (an ``a*`` twin's): refused at
        once if :meth:`close` has begun, else close() waits for it from this moment, even if
        it still waits for a free thread when close() begins."""
        self._enter(here=False)
        return Admitted(self)

    def refusing(self) -> bool:
        """True once :meth:`close` has begun: new calls are refused (``TieredMemory.closed``)."""
        with self._cond:
            return self._closed

    def forked(self) -> bool:
        """True in a process forked from the one these calls belong to."""
        return os.getpid() != self._pid

    def close(self, shut: Callable[[], None]) -> None:
        """Refuse new calls, wait until every call has returned, then ``shut()`` (close the
        engines). A close made while one has begun returns once that one has finished (at
        once in the thread running it).

        Made inside a call of this thread (a progress callback; a SIGTERM handler that runs
        while the main thread is in a write), it cannot wait for that call, which lies below
        it on the stack: it refuses new calls and returns, and the memory shuts as the
        thread's outermost call returns (that call goes on, whole). Its ``shut()`` failing
        then is logged, not raised into the call that succeeded.
        """
        with self._cond:
            if self._closed:
                if self._closer != threading.get_ident():
                    self._cond.wait_for(lambda: self._done)
                return
            self._closed = True
            self._closer = threading.get_ident()
            for event in list(self._wake):
                event.set()
            if self.inside():
                self._deferred = shut
                return
        self._shut(shut, deferred=False)

    def _shut(self, shut: Callable[[], None], *, deferred: bool) -> None:
        try:
            with self._cond:
                self._cond.wait_for(lambda: self._running == 0)
            shut()
        except Exception:
            if not deferred:
                raise
            log.exception("close() made inside a call of this TieredMemory failed as the call returned")
        finally:
            self.closed()

    def wake_on_close(self, event: threading.Event) -> None:
        """Set ``event`` when :meth:`close` begins (at once if it has): a background thread
        that waits on it between its calls (the LangGraph store's TTL sweeper) ends with the
        memory instead of at its next wake-up. Held weakly: a thread's end forgets it."""
        with self._cond:
            if self._closed:
                event.set()
            else:
                self._wake.add(event)

    def closed(self) -> None:
        """The close that :meth:`close` began has finished: the other closes waiting return."""
        with self._cond:
            self._done = True
            self._cond.notify_all()


class Admitted:
    """A call :meth:`Calls.admit` counted: :meth:`run` runs it as a call of the memory (in any
    thread) and uncounts it; :meth:`drop` uncounts one that will never run."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._guard = threading.Lock()
        self._pending = True

    def _take(self) -> bool:
        with self._guard:
            pending, self._pending = self._pending, False
            return pending

    def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if not self._take():
            raise closed_error()  # dropped: its caller's loop dropped the call
        with self._calls._as_call():
            return fn(*args, **kwargs)

    def drop(self) -> None:
        if self._take():
            self._calls._leave(here=False)


class Guarded(Protocol):
    """What :func:`usable` reads on the object whose methods it guards: the memory's calls
    (a handle holds its memory's)."""

    _calls: Calls


F = TypeVar("F", bound=Callable[..., Any])
COUNTED = "__tiered_memory_counted__"  # set on the methods usable() guards


def forked_error(opened_in: int) -> UsageError:
    return UsageError(
        f"this TieredMemory was opened in process {opened_in} and inherited by this forked "
        "child, where its connections are not safe to use. Open a new TieredMemory in the child "
        "(after the fork), or start workers with multiprocessing's 'spawn' method.")


def closed_error() -> UsageError:
    return UsageError("this TieredMemory is closed; open a new one")


def check_process(opened_in: int, closed: bool) -> None:
    """Refuse the use of a database connection opened in another process (inherited through
    ``fork``) or closed: the record stores call it on every read and write, the last line
    for code that reaches a store without passing through a memory's :class:`Calls`."""
    if os.getpid() != opened_in:
        raise forked_error(opened_in)
    if closed:
        raise closed_error()


def usable(method: F) -> F:
    """Refuse, with a typed error, a call on a closed memory or one inherited through ``fork``
    (its SQLite connection, locks and vector-engine threads belong to the parent: using
    them in the child can corrupt data or hang); count the call, so close() waits for it."""

    @functools.wraps(method)
    def checked(self: Guarded, *args: Any, **kwargs: Any) -> Any:
        try:
            with self._calls.running():
                return method(self, *args, **kwargs)
        except TieredMemoryError:
            raise
        except OSError as e:  # a full disk, a permission, a directory where a file should be
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            raise StoreError(f"{method.__name__} failed: {e.strerror or e}{where}. Check free disk space and "
                             "permissions; what was acknowledged before is kept") from e
        except sqlite3.Error as e:
            raise StoreError(f"{method.__name__} failed in the record store: {e}. Check free disk space; "
                             "what was acknowledged before is kept") from e

    setattr(checked, COUNTED, True)  # its async twin counts the call before a thread takes it
    return checked  # type: ignore[return-value]


@contextlib.contextmanager
def vector_errors_typed(message: str) -> Iterator[None]:
    """Whatever a vector index raises (a custom one may raise anything) becomes
    :class:`VectorIndexError` with ``message`` (its ``{error}`` is the cause)."""
    try:
        yield
    except Exception as e:
        if isinstance(e, TieredMemoryError) and not isinstance(e, VectorIndexError):
            raise
        raise VectorIndexError(message.format(error=e)) from e
