"""Deletions still owed to the vector index: one row each in the record store's ``owed_vectors``.

A deletion removes rows from the record store, then their vectors from the index, a second
engine where the two are apart. Should the index fail between the two (a server down, an
engine error, a kill), the vectors of erased text would stay in the index for good: never
found (their rows are gone), yet stored. So what the index still owes is written down in the
record store, and cleared only once the index has deleted it.

Invariants:

- An entry is ``(user_id, kind, item_id)`` with the time it was owed: ``kind`` :data:`TURN`
  (a turn's id: its own vector and its chunks') or :data:`VECTOR` (one vector id: a fact's,
  an episode's key point, a store item's part). Each is a row of its own, written by the
  transaction that deletes the rows (:func:`owe_in`: the record store's ``delete_message`` and
  ``clear_session``, the layer units), so a deletion writes only its own entries, and two
  deletions wait for each other only where they owe the same entry.
- An entry is held from before the index deletes its vectors until the entry is deleted
  (:meth:`OwedRows.paying`): one payer at a time per entry, and a write that stores one of these
  ids again and pays it first (:mod:`tiered_memory.recall.forgetting`) writes its vector after
  the index deleted the old. On PostgreSQL the holder is one transaction that locks the entries'
  rows (:func:`lock_due_in`, :func:`paid_in`): many workers, and only the same entries wait. On
  SQLite a write transaction excludes every other writer (and the store's one connection every
  reader): held across a slow index delete, it held up the whole database. There the process
  holds the entries' ids (one process per file: the folder lock), each on its own: a payer waits
  only while another thread holds one of its ids, never for unrelated ones (a slow delete of one
  user's vectors outside the write lock would otherwise hold up every payment made under it, and
  every write behind that). It takes all its ids at once and holds none while it waits, so no
  two payers wait for each other; a holder needs only the index and the store's connection, not
  the write lock a waiter may hold (a ``forget`` paying outside it takes it after). The entries
  are read once held, before the index delete, and deleted after it in a short transaction,
  each only if no deletion owed it again meanwhile (its ``owed_at`` unchanged).
- A pass over everything owed (``wait=False``: a write's or an open's, ``rebuild_index``'s
  clearing) leaves an entry another payer holds to that payer instead of waiting for it: on
  SQLite an id another thread holds, on PostgreSQL a row another transaction has locked (``skip``:
  ``SKIP LOCKED``), whichever worker's. Such a pass runs under the write lock, and the holder may
  be a ``forget`` deleting slow vectors outside it, in this process or another: waiting, the pass
  held up every write of the process behind it. The entry is not lost: its holder deletes its row
  once the index has deleted its vectors, or fails and leaves it owed (its row unlocked, its
  process's next write or any worker's next open pays it). A payment that must see given ids paid
  (a write storing them again: :func:`~tiered_memory.recall.forgetting.pay_before_storing`) waits.
- ``forget_user`` empties the table for its user with the user's other rows (every table with a
  ``user_id``): the index's ``delete_user`` takes every vector of the user.
- The ``meta`` record :data:`PENDING_DELETIONS` (a JSON list) holds the users whose
  ``forget_user`` started and has not completed, as it always has; the version before this
  table wrote ``["turn", id]`` and ``["vector", id]`` entries into it too, and a worker of that
  version in a rolling upgrade still does. Those are moved into the table (their user
  unknown: :data:`NO_USER`) and paid with the rest (:func:`legacy_entries`).

The SQL here is the portable subset both dialects run; ``p`` is the placeholder (``?`` or
``%s``), ``lock`` what locks the rows read (``" FOR UPDATE"`` on PostgreSQL; nothing on SQLite,
which has no row locks: see above) and ``skip`` what, added to it, leaves out rows another
transaction holds (``" SKIP LOCKED"``).
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

#: the meta key of the users whose forget_user is unfinished (and of earlier versions' entries)
PENDING_DELETIONS = "pending_forget_users"
TURN, VECTOR = "turn", "vector"  # the kinds of an entry
NO_USER = ""  # the user of an entry moved from the meta record, which did not say it

#: The core migration (both dialects) of the table. The key leads with the id, which a write
#: that stores an id again looks up whoever's it was (ids are global keys); ``forget_user``
#: deletes by user.
OWED_VECTORS = """
    CREATE TABLE IF NOT EXISTS owed_vectors (
        kind TEXT NOT NULL,
        item_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        owed_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (kind, item_id, user_id)
    );
    CREATE INDEX IF NOT EXISTS owed_vectors_user ON owed_vectors (user_id);
"""

_COLS = "user_id, kind, item_id"
_BATCH = 300  # entries per statement: 900 parameters, under every dialect's bound


class OwedVector(NamedTuple):
    """One deletion the index owes: the vectors of a turn (:data:`TURN`) or one vector (:data:`VECTOR`)."""

    user_id: str
    kind: str
    item_id: str


def entries(user_id: str, *, turns: Iterable[str] = (), vectors: Iterable[str] = ()) -> list[OwedVector]:
    """The entries of ``user_id``'s ``turns`` and ``vectors``, each once, in key order (pure)."""
    return sorted({*(OwedVector(user_id, TURN, t) for t in turns), *(OwedVector(user_id, VECTOR, v) for v in vectors)})


def _many(c: Any) -> Any:
    """``c``'s ``executemany`` (sqlite3's connection has one, psycopg's cursors)."""
    return c.executemany if hasattr(c, "executemany") else c.cursor().executemany


def owe_in(c: Any, owed: Sequence[OwedVector], at: float, *, p: str = "?") -> None:
    """Record ``owed`` inside the caller's open transaction ``c``: what a deletion owes commits
    with the rows' deletion, or not at all. An entry owed already keeps one row (the later time)."""
    if owed:
        _many(c)(f"INSERT INTO owed_vectors ({_COLS}, owed_at) VALUES ({p}, {p}, {p}, {p})"
                      " ON CONFLICT (kind, item_id, user_id) DO UPDATE SET owed_at=excluded.owed_at",
                      [(*e, at) for e in sorted(set(owed))])


def lock_due_in(c: Any, owed: Sequence[OwedVector], *, p: str = "?", lock: str = "") -> list[OwedVector]:
    """Which of ``owed`` are still owed, their rows locked in key order (one order for every
    payer: no deadlock) till ``c`` commits; an entry another payer holds is waited for, and
    then found paid (or, ``lock`` skipping locked rows, left out)."""
    return list(due_at_in(c, owed, p=p, lock=lock))


def due_at_in(c: Any, owed: Sequence[OwedVector], *, p: str = "?", lock: str = "") -> dict[OwedVector, float]:
    """Which of ``owed`` are still owed, with the time each was owed, in key order (its rows
    locked by ``lock``: see :func:`lock_due_in`)."""
    out: dict[OwedVector, float] = {}
    wanted = sorted(set(owed), key=lambda e: (e.kind, e.item_id, e.user_id))
    for start in range(0, len(wanted), _BATCH):
        part = wanted[start:start + _BATCH]
        rows = ", ".join(f"({p}, {p}, {p})" for _ in part)
        out.update((OwedVector(*r[:3]), r[3]) for r in c.execute(
            f"SELECT {_COLS}, owed_at FROM owed_vectors WHERE (kind, item_id, user_id) IN (VALUES {rows})"
            f" ORDER BY kind, item_id, user_id{lock}", [v for e in part for v in (e.kind, e.item_id, e.user_id)]
        ).fetchall())
    return out


def owed_for_in(c: Any, *, turns: Sequence[str] = (), vectors: Sequence[str] = (), p: str = "?") -> list[OwedVector]:
    """The entries, of any user, of these turn ids and vector ids (what a write storing them
    again must pay first)."""
    out: list[OwedVector] = []
    for kind, ids in ((TURN, sorted(set(turns))), (VECTOR, sorted(set(vectors)))):
        for start in range(0, len(ids), _BATCH):
            part = ids[start:start + _BATCH]
            out += [OwedVector(*r) for r in c.execute(
                f"SELECT {_COLS} FROM owed_vectors WHERE kind={p} AND item_id IN ({', '.join([p] * len(part))})",
                [kind, *part]).fetchall()]
    return out


def owed_in(c: Any, limit: int, *, p: str = "?") -> list[OwedVector]:
    """Up to ``limit`` entries, in key order (the primary key's: a backlog of any size is read
    batch by batch without sorting it)."""
    return [OwedVector(*r) for r in c.execute(
        f"SELECT {_COLS} FROM owed_vectors ORDER BY kind, item_id, user_id LIMIT {p}", (limit,)).fetchall()]


def paid_in(c: Any, paid: Sequence[OwedVector], *, p: str = "?") -> None:
    """Delete the entries the index has paid, each by its key (an entry owed again since stays
    only if a deletion wrote it after this transaction: the payer holds the rows it read)."""
    if paid:
        _many(c)(f"DELETE FROM owed_vectors WHERE kind={p} AND item_id={p} AND user_id={p}",
                      [(e.kind, e.item_id, e.user_id) for e in paid])


def paid_as_read_in(c: Any, paid: dict[OwedVector, float], *, p: str = "?") -> None:
    """Delete the entries the index has paid, each only if it is still owed as it was read (an
    entry a deletion owed again since, at a later time, stays: its vectors may be newer)."""
    if paid:
        _many(c)(f"DELETE FROM owed_vectors WHERE kind={p} AND item_id={p} AND user_id={p} AND owed_at={p}",
                 [(e.kind, e.item_id, e.user_id, at) for e, at in paid.items()])


class OwedRows:
    """The ``owed_vectors`` table of one record store (its ``owed_rows``), outside a deletion.

    Args:
        transaction: the store's write transaction (a connection taking ``p`` placeholders).
        read: runs a function of a connection outside a write transaction.
        p: the dialect's placeholder. lock: what locks rows read (see the module docstring);
            without one, a payment holds its entries' ids in this process instead, each on its own.
        skip: added to ``lock`` by a payment that does not wait: rows another transaction holds
            are left out.
    """

    def __init__(self, transaction: Callable[[], AbstractContextManager[Any]],
                 read: Callable[[Callable[[Any], Any]], Any], *, p: str = "?", lock: str = "", skip: str = "") -> None:
        self._transaction, self._read, self._p, self._lock, self._skip = transaction, read, p, lock, skip
        # without row locks: the ids this process's payers hold, each with the thread holding it
        self._held: dict[str, int] | None = None if lock else {}
        self._changed = threading.Condition()

    def owe(self, owed: Sequence[OwedVector]) -> None:
        """Record ``owed`` (a deletion's own entries are written by its transaction: :func:`owe_in`)."""
        if owed:
            with self._transaction() as c:
                owe_in(c, owed, time.time(), p=self._p)

    def owed(self, limit: int) -> list[OwedVector]:
        """Up to ``limit`` entries still owed (:func:`owed_in`)."""
        return list(self._read(lambda c: owed_in(c, limit, p=self._p)))

    def owed_for(self, *, turns: Sequence[str] = (), vectors: Sequence[str] = ()) -> list[OwedVector]:
        """The entries, of any user, of these turn ids and vector ids."""
        return list(self._read(lambda c: owed_for_in(c, turns=turns, vectors=vectors, p=self._p)))

    @contextmanager
    def paying(self, owed: Sequence[OwedVector], *, wait: bool = True) -> Iterator[list[OwedVector]]:
        """Pay ``owed``: yields those still owed, held (another payer, or a write paying one of them
        first, waits) while the caller deletes their vectors from the index, and deletes them when
        the block ends; an error in the block leaves them all owed. Held by a transaction's row
        locks, or, without them, by this process outside any transaction, each id on its own (the
        module docstring). ``wait=False`` (a pass over everything owed): an entry another payer
        holds (its id another thread's, its row another transaction's, any worker's) is not waited
        for and not yielded, but left to that payer, which pays it or leaves it owed."""
        if not owed:
            yield []
            return
        if self._held is None:
            with self._transaction() as c:
                due = lock_due_in(c, owed, p=self._p, lock=self._lock if wait else self._lock + self._skip)
                yield due
                paid_in(c, due, p=self._p)
            return
        taken, left = self._hold(self._held, {e.item_id for e in owed}, wait=wait)
        try:
            mine = [e for e in owed if e.item_id not in left]
            read: dict[OwedVector, float] = self._read(lambda c: due_at_in(c, mine, p=self._p)) if mine else {}
            yield list(read)
            if read:
                with self._transaction() as c:
                    paid_as_read_in(c, read, p=self._p)
        finally:
            with self._changed:
                for i in taken:
                    del self._held[i]
                self._changed.notify_all()

    def _hold(self, held: dict[str, int], ids: set[str], *, wait: bool) -> tuple[set[str], set[str]]:
        """Hold ``ids``: once no other thread holds any (``wait``), or those no other thread holds
        (not ``wait``). Returns the ids taken (an id this thread holds already, in a payment around
        this one, stays that payment's) and those left to other threads. Keyed by id, whoever's
        entry: vector ids are global, and a write storing one again pays every user's entry of it."""
        me = threading.get_ident()

        def others() -> set[str]:
            return {i for i in ids if held.get(i, me) != me}

        with self._changed:
            if wait:
                self._changed.wait_for(lambda: not others())
            left = others()
            taken = {i for i in ids - left if i not in held}
            held.update(dict.fromkeys(taken, me))
        return taken, left


# ---- the meta record: users of unfinished forget_user calls, and earlier versions' entries ----
@dataclass(frozen=True)
class Owed:
    """What the meta record holds: users to forget; turns and vectors an earlier version owed."""

    users: frozenset[str] = field(default_factory=frozenset)
    turns: frozenset[str] = field(default_factory=frozenset)
    vectors: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.users or self.turns or self.vectors)


def owed(raw: str | None) -> Owed:
    """The record's value read (an unreadable record owes nothing) (pure)."""
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        found = []
    if not isinstance(found, list):
        return Owed()
    users: set[str] = set()
    turns: set[str] = set()
    vectors: set[str] = set()
    for e in found:
        if isinstance(e, str):
            users.add(e)
        elif isinstance(e, list) and len(e) == 2 and isinstance(e[1], str):
            {TURN: turns, VECTOR: vectors}.get(e[0], set()).add(e[1])
    return Owed(frozenset(users), frozenset(turns), frozenset(vectors))


def changed(raw: str | None, *, add: Owed = Owed(), remove: Owed = Owed()) -> str:
    """The record's value with ``add`` written in and ``remove`` taken out (pure)."""
    was = owed(raw)
    users = (was.users | add.users) - remove.users
    turns = (was.turns | add.turns) - remove.turns
    vectors = (was.vectors | add.vectors) - remove.vectors
    return json.dumps([*sorted(users), *([TURN, t] for t in sorted(turns)), *([VECTOR, v] for v in sorted(vectors))],
                      ensure_ascii=False)


def legacy_entries(raw: str | None) -> tuple[list[OwedVector], Owed]:
    """The turn and vector entries an earlier version wrote into the meta record, as rows of the
    table (user :data:`NO_USER`), and what to remove from the record once they are (pure)."""
    was = owed(raw)
    moved = Owed(turns=was.turns, vectors=was.vectors)
    return entries(NO_USER, turns=was.turns, vectors=was.vectors), moved
