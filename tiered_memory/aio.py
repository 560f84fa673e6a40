"""The one sync/async story of the library.

:func:`twin` makes the ``a*`` twin of a sync method: the same signature (typed with
``ParamSpec``, so type checkers and IDEs see it), run in a worker thread so no blocking
I/O happens on the caller's event loop. :func:`run_sync` is the one bridge the other
way, for the async LLM protocol: it runs a coroutine from sync code, even where an
event loop is already running (Jupyter).

A cancel never cuts a write short: :func:`to_thread` runs its call whole (the caller gets
``CancelledError`` at once); :func:`call_in_thread` is that for an adapter's call made of
memory calls, counted for ``close()`` from the moment it is made, as a twin's is; a twin of a call
that holds its user's lock throughout (``twin(add, user="user_id")``) waits for that lock in the
user's line on the event loop, not in a worker thread (:func:`call_in_line`), so one user's queued
writes never take the threads that the other users' calls, and the app, need;
:func:`whole` runs an async write of several steps to its end; :func:`open_in_thread`
closes what an open made once its caller is gone.

Every sync call runs on one long-lived event loop in a daemon thread, not on a
fresh ``asyncio.run`` loop per call: async HTTP clients that providers cache per
process (langchain-openai, llama-index's OpenAI classes) keep connections bound
to the loop that opened them, and a new loop per call breaks every other call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import contextlib
import functools
import inspect
import logging
import os
from typing import Any, Callable, Concatenate, Coroutine, Generic, Iterator, ParamSpec, Protocol, TypeVar

from .guard import COUNTED, Guarded

log = logging.getLogger("tiered_memory")
T = TypeVar("T")


class Closable(Protocol):
    def close(self) -> None: ...


class Place(Protocol):
    """A call's place in its user's line (``user_locks.Line``)."""

    async def ready(self) -> None:
        """Return once the call is first in its line and no thread holds the user's lock."""

    def attempt(self, call: Callable[[], T]) -> tuple[T] | None:
        """In a worker thread: ``call()`` holding the user's lock, taken without waiting; ``None``
        (nothing run) if a thread holds it."""

    def leave(self) -> None:
        """Leave the line (idempotent)."""


class Lines(Protocol):
    def line(self, user_id: str) -> Place: ...


class Lined(Guarded, Protocol):
    """What a twin with ``user=`` reads on its object: the memory's calls and its users' lines."""

    _users: Lines


C = TypeVar("C", bound=Closable)
S = TypeVar("S")
P = ParamSpec("P")
_GUARD = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None
_THREAD: threading.Thread | None = None


def thread_pool(max_workers: int, name: str) -> Callable[[], concurrent.futures.ThreadPoolExecutor]:
    """A module's thread pool, as a function that returns it: a forked child (a worker of a
    server that preloaded the app) gets a new one, since its copy of the parent's has no
    threads and counts idle ones it lacks, so a task given to it never ran."""
    held = [concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)]

    def renew() -> None:
        held[0] = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)

    os.register_at_fork(after_in_child=renew)
    return lambda: held[0]


def _after_fork() -> None:  # the child has none of the parent's threads: not its loop, nor a lock one held
    global _GUARD, _LOOP, _THREAD
    _GUARD, _LOOP, _THREAD = threading.Lock(), None, None


os.register_at_fork(after_in_child=_after_fork)
sync_pool = thread_pool(4, "tiered-memory-sync")


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP, _THREAD
    with _GUARD:
        if _LOOP is None or _THREAD is None or not _THREAD.is_alive():
            _LOOP = asyncio.new_event_loop()
            _THREAD = threading.Thread(target=_LOOP.run_forever, name="tiered-memory-loop", daemon=True)
            _THREAD.start()
        return _LOOP


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on the library's loop thread and return its result."""
    loop = _loop()
    if threading.current_thread() is _THREAD:
        # called from code already running on our loop: blocking it would deadlock
        return sync_pool().submit(contextvars.copy_context().run, asyncio.run, coro).result()
    return asyncio.run_coroutine_threadsafe(coro, loop).result()  # its task runs in a copy of our context


def _no_stop_iteration(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    try:
        return fn(*args, **kwargs)
    except StopIteration as e:  # an asyncio future cannot hold it: its awaiter would wait forever
        raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} raised StopIteration") from e


def _retrieve(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()  # its caller gave up: no 'exception was never retrieved' later


async def to_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread`` (in a copy of the caller's context), with two differences:

    - a call whose caller is cancelled (a timeout around it) still runs whole: with
      ``asyncio.to_thread`` it is dropped if it still waits for a free worker thread,
      and runs whole if one had taken it, so the caller could not tell which;
    - a ``StopIteration`` raised in the thread (a callback's bare ``next()``) is raised as
      ``RuntimeError`` from it, as LangChain's ``run_in_executor`` does, instead of leaving
      the caller waiting forever.
    """
    return await asyncio.shield(_submit(fn, *args, **kwargs))  # a cancel reaches the caller, not the queue


async def call_in_thread(owner: Guarded, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """:func:`to_thread` for a call made of ``owner``'s memory calls (an adapter's write: a read,
    then an ``add_many``), counted as one call of that memory from now, as a twin's is: a
    ``close()`` that begins while it still waits for a thread waits for it (and lets the memory
    calls it makes through), so a cancelled write is stored whole; one made after ``close()``
    began is refused at once with ``UsageError``, before anything runs."""
    admitted = owner._calls.admit()
    try:
        running = _submit(admitted.run, fn, *args, **kwargs)
    except BaseException:
        admitted.drop()
        raise
    running.add_done_callback(lambda f: admitted.drop() if f.cancelled() else None)  # never run
    return await asyncio.shield(running)


async def call_in_line(owner: Lined, user_id: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """:func:`call_in_thread` for a call that holds ``user_id``'s lock throughout: it waits in that
    user's line, on the event loop, until the lock is free and the user's earlier async calls have
    taken it; only then does it take a worker thread, where it takes the lock without waiting (taken
    meanwhile by a sync call, it gives the thread back and waits again). A cancel (the caller gets
    ``CancelledError`` at once) never cuts it short: it stays in the line and runs whole; if the loop
    ends first, it runs in a worker thread that waits for the lock, which the loop's end waits for."""
    admitted = owner._calls.admit()
    try:
        place = owner._users.line(user_id)
    except BaseException:
        admitted.drop()
        raise
    task = asyncio.ensure_future(_in_line(place, functools.partial(admitted.run, fn, *args, **kwargs)))
    _WHOLE.add(task)
    task.add_done_callback(_WHOLE.discard)
    task.add_done_callback(_retrieve)
    def settle(_: object) -> None:  # each a no-op once taken: a task ended before its first step leaves nothing
        place.leave()
        admitted.drop()

    task.add_done_callback(settle)
    return await asyncio.shield(task)


async def _in_line(place: Place, call: Callable[[], T]) -> T:
    attempt: "asyncio.Future[tuple[T] | None] | None" = None
    try:
        while True:
            await place.ready()
            attempt = _submit(place.attempt, call)
            ran = await asyncio.shield(attempt)  # a cancel leaves the attempt running: awaited below
            attempt = None
            if ran is not None:
                return ran[0]
    except asyncio.CancelledError:  # the loop's end (its caller's cancel never reaches this task)
        ran = await attempt if attempt is not None else None
        if ran is not None:
            return ran[0]
        place.leave()
        return await _submit(call)  # waits for the lock in a worker thread, as a sync call does


async def open_in_thread(make: Callable[P, C], /, *args: P.args, **kwargs: P.kwargs) -> C:
    """:func:`to_thread` for a call that opens something (``TieredMemory(path)``: a folder lock,
    engine threads): if the caller is cancelled, what the call opens is closed, not left open
    with nobody to close it. The worker closes it as soon as it is made; made already (the
    cancel came before the caller took it), the caller hands it to a worker thread to close."""
    opening = _Opening(make)
    try:
        return await to_thread(opening.run, *args, **kwargs)
    except asyncio.CancelledError:
        made = opening.abandon()
        if made is not None:
            _submit(_close_unowned, made)
        raise


class _Opening(Generic[C]):
    """One open, handed to its caller, or closed when the caller gave up first."""

    def __init__(self, make: Callable[..., C]) -> None:
        self._make = make
        self._guard = threading.Lock()
        self._abandoned = False
        self._made: C | None = None

    def run(self, *args: Any, **kwargs: Any) -> C:
        made = self._make(*args, **kwargs)
        with self._guard:
            if not self._abandoned:
                self._made = made
                return made
        _close_unowned(made)
        return made  # to nobody: the caller is gone

    def abandon(self) -> C | None:
        """The caller gave up: what was made already, now the caller's to close, else ``None``
        (the worker closes it when made)."""
        with self._guard:
            self._abandoned = True
            made, self._made = self._made, None
            return made


def _close_unowned(made: Closable) -> None:
    try:
        made.close()
    except Exception:  # noqa: BLE001 - nobody waits for it: logged, not lost
        log.exception("closing %r, which a cancelled open made, failed", made)


_WHOLE: "set[asyncio.Task[Any]]" = set()  # the loop holds tasks weakly: these run to their end


async def whole(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` run to its end even if the caller is cancelled (the caller gets
    ``CancelledError`` at once): for a write made of several steps that must all happen, an
    adapter's (a message stored in the tiered store, then in a framework's own chat buffer),
    which a cancel between them would leave disagreeing. ``coro`` runs in a task of its own,
    started now, even if the caller is cancelled before its first step."""
    task = asyncio.ensure_future(coro)
    _WHOLE.add(task)
    task.add_done_callback(_WHOLE.discard)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _submit(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> "asyncio.Future[T]":
    call = functools.partial(contextvars.copy_context().run, _no_stop_iteration, fn, *args, **kwargs)
    running = asyncio.get_running_loop().run_in_executor(None, call)
    running.add_done_callback(_retrieve)
    return running


def _deliver(future: "asyncio.Future[Any]", result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (timeout, cancel)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def in_daemon_thread(fn: Callable[[], T]) -> "asyncio.Future[T]":
    """A future of the running loop for ``fn()`` run on a new daemon thread: a blocking call
    (a model's sync client) awaited this way leaves the loop free, so a caller's timeout
    returns at once, and an abandoned call never holds up interpreter exit. ``fn`` runs in a
    copy of the caller's context variables, as with ``asyncio.to_thread``: a LangChain or
    LlamaIndex call inside it is a child of the caller's run (callbacks, traces)."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = _no_stop_iteration(fn)
        except Exception as e:  # handed to the awaiting coroutine
            error = e
        except BaseException as e:  # noqa: BLE001 - never leave the caller waiting forever
            error = RuntimeError(f"the call was interrupted: {e!r}")
        try:
            loop.call_soon_threadsafe(_deliver, future, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=context.run, args=(run,), name="tiered-memory-call", daemon=True).start()
    return future


class ReadWriteGate:
    """Many readers or one writer (writers first): reads wait while the vector index is
    being rebuilt, instead of failing on a collection that is gone or seeing half of it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._writing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def twin(method: Callable[Concatenate[S, P], T], *,
         user: str | None = None) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """The async twin of a sync method: same parameters, run by :func:`to_thread`. A method
    guarded by :func:`~.guard.usable` is counted as one of its memory's calls when the twin
    is called, not when a worker thread takes it: a ``close()`` that begins while it waits
    for a thread waits for it too, and one that began before refuses it at once.

    ``user`` names the parameter of a guarded method that holds that user's lock throughout (a
    write or deletion of one user's records; not one that asks a model first): its twin waits for
    the lock in the user's line, on the event loop, not in a worker thread (:func:`call_in_line`).

    Example:
        >>> class Store:
        ...     def get(self, key: str) -> str:
        ...         return key.upper()
        ...     aget = twin(get)
        >>> asyncio.run(Store().aget("k"))
        'K'
    """

    counted = getattr(method, COUNTED, False)
    if user is not None and not counted:
        raise TypeError(f"twin(user=...) needs a method guarded by usable(): {method.__qualname__} is not")
    signature = inspect.signature(method) if user is not None else None

    @functools.wraps(method)
    async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if not counted:
            return await to_thread(method, self, *args, **kwargs)
        if user is not None and signature is not None:
            try:
                who = signature.bind(self, *args, **kwargs).arguments.get(user)
            except TypeError:  # the method raises it, as its sync call does
                who = None
            if isinstance(who, str):  # else the method refuses it at once (InvalidInputError)
                return await call_in_line(self, who, method, self, *args, **kwargs)  # type: ignore[arg-type]
        # usable() guards only a Guarded
        return await call_in_thread(self, method, self, *args, **kwargs)  # type: ignore[arg-type]

    run.__name__ = "a" + method.__name__
    owner = method.__qualname__.rpartition(".")[0]
    run.__qualname__ = f"{owner}.{run.__name__}" if owner else run.__name__
    run.__doc__ = f"Async twin of :meth:`{method.__name__}` (run in a worker thread)."
    return run
