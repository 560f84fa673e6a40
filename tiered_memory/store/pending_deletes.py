"""Deletions still owed to the vector index: one record in the store's ``meta`` table.

A deletion removes rows from the record store, then their vectors from the index, a second
engine where the two are apart. Should the index fail between the two (a server down, an
engine error, a kill), the vectors of erased text would stay in the index for good: never
found (their rows are gone), yet stored. So what the index still owes is written down in the
record store, and cleared only once the index has deleted it:

- a user whose ``forget_user`` started and has not completed (written before it starts:
  the whole deletion, rows and vectors, runs again);
- a turn's id (its vector and its chunks' are owed), written by the record store in the
  transaction that deletes the turn (``delete_message``, ``clear_session``);
- a vector id (a fact's, an episode's key points, a store item's), written by the layer unit
  in the transaction that deletes its row.

The memory deletes what is owed at open and before its next write (``TieredMemory``; see
:mod:`tiered_memory.writes`). One record for all of it, read and changed by the functions
here (pure, but :func:`pend_in`, which runs inside the caller's transaction): its key is
the one ``forget_user`` has always used, and its value a JSON list whose strings are users,
so a store written by an earlier version reads as it did, and an earlier version reading
this one finishes the users' deletions and skips the entries it does not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

#: the meta key of the record (named for its first entries, the users of ``forget_user``)
PENDING_DELETIONS = "pending_forget_users"
LOCK_NAME = f"tiered-memory:meta:{PENDING_DELETIONS}"  # PostgreSQL: the key's lock, as change_meta takes it
TURN, VECTOR = "turn", "vector"  # the tags of the entries that are not users: ["turn", id]


@dataclass(frozen=True)
class Owed:
    """What the record holds: users to forget, turns and other vectors to delete."""

    users: frozenset[str] = field(default_factory=frozenset)
    turns: frozenset[str] = field(default_factory=frozenset)
    vectors: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.users or self.turns or self.vectors)


def owed(raw: str | None) -> Owed:
    """The record's value read (an unreadable record owes nothing) (pure)."""
    try:
        entries = json.loads(raw) if raw else []
    except ValueError:
        entries = []
    if not isinstance(entries, list):
        return Owed()
    users: set[str] = set()
    turns: set[str] = set()
    vectors: set[str] = set()
    for e in entries:
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


def change_in(c: Any, *, add: Owed = Owed(), remove: Owed = Owed(), p: str = "?",
              lock: Callable[[], object] | None = None) -> None:
    """Change the record as :func:`changed` does, inside the caller's open transaction ``c``
    (whose ``execute`` takes ``p`` placeholders): what a deletion owes commits with the
    rows' deletion, or not at all. ``lock`` takes the key's lock first where writers are many
    (PostgreSQL: :data:`LOCK_NAME`), so no concurrent change of the record is lost."""
    if not add and not remove:
        return
    if lock is not None:
        lock()
    found = c.execute(f"SELECT value FROM meta WHERE key={p}", (PENDING_DELETIONS,)).fetchone()
    c.execute(f"INSERT INTO meta (key, value) VALUES ({p}, {p}) ON CONFLICT (key) DO UPDATE SET value=excluded.value",
              (PENDING_DELETIONS, changed(found[0] if found else None, add=add, remove=remove)))


def pend_in(c: Any, *, turns: Iterable[str] = (), vectors: Iterable[str] = (), p: str = "?",
            lock: Callable[[], object] | None = None) -> None:
    """Record ``turns`` and ``vectors`` as owed, in ``c``'s transaction (:func:`change_in`)."""
    change_in(c, add=Owed(turns=frozenset(turns), vectors=frozenset(vectors)), p=p, lock=lock)
