"""Which record store owns a collection on a shared vector server (Chroma, Qdrant).

Several apps may share one server, each with its own collection; two apps given the same one
by mistake would delete and rewrite each other's vectors (``rebuild_index``, ``forget_user``,
compaction, the rebuild after an embedder change). So a collection records the id of the
record store that owns it (the store's ``store_id`` meta value, written once when the store
is created, the same for every worker of a PostgreSQL store), and a memory checks it at open,
before it writes anything (:func:`judge_owner`, pure; the shell is
``backends.claim_collection``):

- a collection marked with this store's id opens as before;
- one marked with another store's id is refused (:func:`refusal`): nothing is written;
- an unmarked one (new, or made by a version without marks) is claimed, unless it holds turn
  vectors and none of the first ones read (``SAMPLE``) is a message of this store: then it is
  another app's. The rule is cheap (one page of ids, one lookup) and errs towards keeping an
  upgrade working: a collection two apps already shared is claimed by the first to open it,
  and the second is then refused and told to move.

pgvector keeps its vectors in the record store's own schema, so it needs no mark.
"""

from __future__ import annotations

from typing import Literal, Protocol, Sequence, runtime_checkable

from .base import CHUNK_SEPARATOR

#: the collection's metadata key holding its owner's store id
OWNER_KEY = "tiered_memory_owner"
#: how many of an unmarked collection's ids are read to judge whose it is
SAMPLE = 100

Verdict = Literal["mine", "claim", "foreign", "unmarked-foreign"]


@runtime_checkable
class OwnedCollection(Protocol):
    """An index whose collection records the record store that owns it (optional; Chroma and
    Qdrant, on a server or not)."""

    def collection_name(self) -> str: ...

    def owner(self) -> str | None:
        """The store id the collection is marked with, or ``None`` (unmarked, or not made yet)."""
        ...

    def mark_owner(self, store_id: str, *, written: bool = False) -> None:
        """Mark the collection as ``store_id``'s (``written``: it is already), now and whenever
        it is made again (a reset, a compaction, a collection made on the first write)."""
        ...

    def first_ids(self, n: int) -> list[str]:
        """Up to ``n`` ids of the collection's vectors (any ``n``: the cheapest page)."""
        ...


def turn_ids(ids: Sequence[str]) -> set[str]:
    """The message ids behind the turn and chunk vectors among ``ids`` (fact, episode and
    item vector ids carry a ``:``) (pure)."""
    return {i.split(CHUNK_SEPARATOR)[0] for i in ids if ":" not in i}


def judge_owner(mark: str | None, me: str, turns: set[str], held: set[str]) -> Verdict:
    """Whose the collection is: ``mark`` is its owner mark, ``me`` this store's id, ``turns``
    the message ids of the first vectors read from it (when unmarked), ``held`` those of them
    that this store holds (pure)."""
    if mark is not None:
        return "mine" if mark == me else "foreign"
    return "unmarked-foreign" if turns and not held else "claim"


def refusal(verdict: Verdict, collection: str, *, sampled: int = 0) -> str:
    """The error message of a refused collection: what is wrong and how to fix it (pure)."""
    why = (f"the vector collection {collection!r} belongs to another record store (another app's "
           "SQLite folder or PostgreSQL database/schema)" if verdict == "foreign" else
           f"the vector collection {collection!r} was made by an earlier version and holds vectors of "
           f"another record store (none of the {sampled} turn vectors read first is a message of this one)")
    return (f"{why}; two apps sharing a collection would delete each other's vectors. Give this app its own "
            "collection: end the server URL with ?collection=NAME (or pass collection=NAME); nothing was "
            "written to it. If this app moved to a new record store, delete the old collection: the start-up "
            "repair or rebuild_index() refills it from the records.")
