"""Exact per-user scan: each user's turn vectors held in memory, searched by a matrix product.

A memory's turn search is scoped to one user. An engine's metadata filter makes that
scope cost more than the search (Chroma's ``where`` on ``user_id``), and a list of the
user's ids does not scale past some thousands. Scanning the user's own vectors is exact
and costs what numpy costs: about 30 ms for 100,000 384-d vectors on one core.

Invariants:

- Only an index that is the one writer of its data may use it (an embedded engine in the
  memory's locked folder): every write reaches :meth:`ExactScan.add` / ``delete`` /
  ``drop``, so what is held never goes stale. An index shared with other processes
  (a server) must not. The index deletes from what is held both before and after the
  engine's delete: a user loaded by a query in between read the engine still holding them.
- What is held is a cache of the engine, never the truth: a user is loaded from the
  engine in a background thread on first use, queries go to the engine until it is
  loaded, and writes made meanwhile are replayed over what was read.
- Memory is bounded: users are evicted least recently used beyond ``budget_rows``; a
  user larger than the budget is never held (the engine serves them).
- The record store stays the authority on ownership: callers drop hits it does not hold.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .base import VectorItem

log = logging.getLogger("tiered_memory")

FEW = 8  # a query among fewer than 1/FEW of a user's rows gathers them (a copy) and scans those alone
BLOCK = 1024  # rows per matrix-vector product: larger products are threaded by OpenBLAS,
# which on a loaded machine costs 10-50x (measured by bench/scale.py's floor)
Held = tuple[list[str], np.ndarray, list[str], list[str]]  # ids, vectors, layers, sessions
Loader = Callable[[str, int], "Held | None"]


def top_k(matrix: np.ndarray, alive: np.ndarray, queries: np.ndarray, k: int,
          allowed: np.ndarray | None = None) -> list[list[tuple[int, float]]]:
    """For each query, the best ``k`` (row, cosine) among live (and ``allowed``) rows,
    best first (pure). ``matrix`` rows and queries are unit vectors."""
    mask = alive if allowed is None else alive & allowed
    live = int(mask.sum())
    return [best_of(similarities(matrix, q), mask, k) if live and k > 0 else []
            for q in np.asarray(queries, dtype=np.float32)]


def best_among(ids: Sequence[str], vectors: Sequence[Sequence[float]] | np.ndarray, queries: np.ndarray,
               k: int) -> list[list[tuple[str, float]]]:
    """For each query, the best ``k`` (id, cosine) of ``vectors`` (unit, named by ``ids``),
    best first (pure): what an engine's id-scoped query returns, exactly (none of no ``ids``)."""
    if not len(ids):
        return [[] for _ in queries]
    matrix = np.asarray(vectors, dtype=np.float32).reshape(len(ids), -1)
    return [[(ids[r], s) for r, s in row] for row in top_k(matrix, np.ones(len(ids), dtype=bool), queries, k)]


def similarities(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The cosine of ``query`` to every row (unit vectors), :data:`BLOCK` rows a product."""
    n = len(matrix)
    sims = np.empty(n, dtype=np.float32)
    for s in range(0, n, BLOCK):
        np.dot(matrix[s:s + BLOCK], query, out=sims[s:s + BLOCK])
    return sims


def best_of(sims: np.ndarray, mask: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The best ``k`` (row, cosine) of ``sims`` among the rows ``mask`` keeps, best first."""
    live = int(mask.sum())
    if live == 0 or k <= 0:
        return []
    sims = np.where(mask, sims, np.float32(-np.inf))
    n, take = len(sims), min(k, live)
    best = np.argpartition(-sims, take - 1)[:take] if take < n else np.arange(n)
    best = best[np.argsort(-sims[best], kind="stable")]
    return [(int(i), float(sims[i])) for i in best if sims[i] > -np.inf]


class UserVectors:
    """One user's vectors: a growable float32 matrix, its ids, layers and sessions (as
    small codes), and a live mask."""

    def __init__(self, dim: int, capacity: int = 256) -> None:
        self.matrix = np.zeros((capacity, dim), dtype=np.float32)
        self.alive = np.zeros(capacity, dtype=bool)
        self.layer = np.zeros(capacity, dtype=np.int32)
        self.session = np.zeros(capacity, dtype=np.int32)
        self.ids: list[str] = []
        self.row: dict[str, int] = {}
        self.codes: dict[str, int] = {}  # layer and session names -> codes (one namespace)

    @property
    def size(self) -> int:
        return len(self.ids)

    def fits(self, queries: np.ndarray) -> bool:
        """Whether ``queries`` (one vector or rows of them) are as wide as the held vectors."""
        return not self.ids or int(np.shape(queries)[-1]) == self.matrix.shape[1]

    def _code(self, name: str) -> int:
        return self.codes.setdefault(name, len(self.codes))

    def _grow(self) -> None:  # doubling: an append costs O(1) amortised
        n = len(self.matrix)
        grown = np.zeros((2 * n, self.matrix.shape[1]), dtype=np.float32)
        grown[:n] = self.matrix
        self.matrix = grown
        for name in ("alive", "layer", "session"):
            old = getattr(self, name)
            new = np.zeros(2 * n, dtype=old.dtype)
            new[:n] = old
            setattr(self, name, new)

    def add(self, ids: Sequence[str], vectors: np.ndarray, layers: Sequence[str], sessions: Sequence[str]) -> None:
        if not self.ids and len(vectors) and self.matrix.shape[1] != vectors.shape[1]:
            self.matrix = np.zeros((len(self.matrix), vectors.shape[1]), dtype=np.float32)  # a new user: any width
        for mid, vec, layer, session in zip(ids, vectors, layers, sessions):
            at = self.row.get(mid)
            if at is None:
                at = len(self.ids)
                if at == len(self.matrix):
                    self._grow()
                self.ids.append(mid)
                self.row[mid] = at
            self.matrix[at] = vec
            self.alive[at] = True
            self.layer[at] = self._code(layer)
            self.session[at] = self._code(session)

    def delete(self, ids: Iterable[str]) -> None:
        for mid in ids:
            at = self.row.get(mid)
            if at is not None:
                self.alive[at] = False
                self.matrix[at] = 0  # a forgotten message's vector is not kept (a vector can be read back into words)

    def query(self, queries: np.ndarray, k: int, among: Sequence[str] | None, layers: Sequence[str] | None = None,
              session_id: str | None = None) -> list[list[tuple[str, float]]]:
        n = self.size
        keep = None
        if among is not None:
            rows = np.asarray([self.row[i] for i in among if i in self.row], dtype=np.int64)
            if len(rows) * FEW < n:  # the product of those rows alone, not of the user's every row
                rows = np.unique(rows)
                rows = rows[self._in_scope(rows, layers, session_id)]
                found = top_k(self.matrix[rows], np.ones(len(rows), dtype=bool), queries, k)
                return [[(self.ids[int(rows[r])], s) for r, s in hits] for hits in found]
            keep = np.zeros(n, dtype=bool)
            keep[rows] = True
        scope = self._in_scope(slice(0, n), layers, session_id)
        found = top_k(self.matrix[:n], scope, queries, k, keep)
        return [[(self.ids[r], s) for r, s in hits] for hits in found]

    def _in_scope(self, rows: np.ndarray | slice, layers: Sequence[str] | None, session_id: str | None) -> np.ndarray:
        """Which of ``rows`` (a few, or a slice of every row) are live, of ``layers`` and of
        ``session_id`` (None: any; none for a layer or session never written): one mask for a
        scan of the user's every row and for one of a few rows (a search of duplicates'
        originals, or a filter's few matches, costs their rows, however many the user holds)."""
        keep = np.array(self.alive[rows], dtype=bool)  # a copy: a slice of alive is a view
        if layers is not None:
            keep &= np.isin(self.layer[rows], [self.codes.get(name, -1) for name in layers])
        if session_id is not None:
            keep &= self.session[rows] == self.codes.get(session_id, -1)
        return keep

    def query_layers(self, query: np.ndarray, ks: Mapping[str, int],
                     session_id: str | None = None) -> dict[str, list[tuple[str, float]]]:
        """For one query, the best ``ks[layer]`` of each layer (of ``session_id``): what a
        :meth:`query` per layer returns, from one product over the user's rows."""
        n = self.size
        sims = similarities(self.matrix[:n], np.asarray(query, dtype=np.float32))
        scope = self._in_scope(slice(0, n), None, session_id)
        out: dict[str, list[tuple[str, float]]] = {}
        for layer, k in ks.items():
            rows = best_of(sims, scope & (self.layer[:n] == self.codes.get(layer, -1)), k)
            out[layer] = [(self.ids[r], s) for r, s in rows]
        return out


class ExactScan:
    """The users held in memory, least recently used first, within ``budget_rows``.

    Args:
        loader: ``(user_id, limit) -> (ids, vectors, layers, sessions)`` of the user's
            vectors read from the engine, or ``None`` when the user has more than ``limit``.
        budget_rows: vectors held in all (384-d: 1.5 MB per 1,000).
    """

    def __init__(self, loader: Loader, budget_rows: int = 200_000) -> None:
        self._loader = loader
        self.budget_rows = budget_rows
        self._users: OrderedDict[str, UserVectors] = OrderedDict()
        self._too_big: set[str] = set()
        self._loading: dict[str, list[tuple[str, Held | list[str]]]] = {}  # writes to replay
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def ready(self, user_id: str, *, wait: bool = False) -> bool:
        """Whether ``user_id`` is held; if not, a background load starts (unless the user is
        too big). ``wait``: wait for that load and answer after it."""
        with self._lock:
            if user_id in self._users:
                self._users.move_to_end(user_id)
                return True
            if user_id in self._too_big or self.budget_rows <= 0:
                return False
            loader = self._threads.get(user_id)
            if loader is None:
                self._loading[user_id] = []
                loader = self._threads[user_id] = threading.Thread(
                    target=self._load, args=(user_id,), name="tiered-memory-exact-load", daemon=True)
                loader.start()
        if wait:
            loader.join()
            with self._lock:
                return user_id in self._users
        return False

    def held_rows(self, user_id: str) -> int:
        """How many vectors of ``user_id`` are held (0 when the user is not)."""
        held = self._held(user_id)
        return 0 if held is None else held.size

    def query(self, user_id: str, queries: np.ndarray, k: int, among: Sequence[str] | None = None,
              layers: Sequence[str] | None = None, session_id: str | None = None,
              ) -> list[list[tuple[str, float]]] | None:
        """The user's best ``k`` per query, or ``None`` when the user is not held (or the
        queries are of another width than the held vectors: the engine's typed error says so)."""
        held = self._held(user_id)
        return None if held is None or not held.fits(queries) else held.query(queries, k, among, layers, session_id)

    def query_layers(self, user_id: str, query: np.ndarray, ks: Mapping[str, int],
                     session_id: str | None = None) -> dict[str, list[tuple[str, float]]] | None:
        """The user's best ``ks[layer]`` of each layer for one query, from one scan
        (:meth:`UserVectors.query_layers`), or ``None`` when the user is not held."""
        held = self._held(user_id)
        return None if held is None or not held.fits(query) else held.query_layers(query, ks, session_id)

    def _held(self, user_id: str) -> UserVectors | None:
        with self._lock:
            return self._users.get(user_id)

    def add(self, user_id: str, rows: Held) -> None:
        with self._lock:
            self._add_locked(user_id, rows)

    def _add_locked(self, user_id: str, rows: Held) -> None:
        if user_id in self._loading:
            self._loading[user_id].append(("add", rows))
        held = self._users.get(user_id)
        if held is not None:
            held.add(*rows)
            self._evict()

    def add_items(self, items: Iterable[VectorItem]) -> None:
        """What an upsert wrote, grouped by user (an engine calls this after its own write).
        A user neither held nor loading gets them from the engine when loaded, so nothing
        is stacked for it (one lock: a load that starts after the check reads the engine
        once the write is in it)."""
        by_user: dict[str, list[VectorItem]] = {}
        for i in items:
            by_user.setdefault(i.user_id, []).append(i)
        for user, mine in by_user.items():
            with self._lock:
                self._unhold_elsewhere(user, [i.id for i in mine])
                if user in self._users or user in self._loading:
                    self._add_locked(user, ([i.id for i in mine], np.asarray([i.vector for i in mine], dtype=np.float32),
                                            [i.layer for i in mine], [i.session_id for i in mine]))

    def _unhold_elsewhere(self, user_id: str, ids: list[str]) -> None:
        """Forget ``ids`` held for users other than ``user_id``: an upsert moved them to it (an
        engine keys a vector by id alone), and a held copy would still answer the old user's
        queries. Costs the smaller of the ids and each held user's rows, per held user."""
        wanted = set(ids)
        for other, held in self._users.items():
            if other != user_id:
                moved = [i for i in ids if i in held.row] if len(ids) <= held.size else \
                    [i for i in held.row if i in wanted]
                if moved:
                    held.delete(moved)

    def delete(self, ids: list[str]) -> None:
        gone = set(ids)
        with self._lock:
            for log_ in self._loading.values():
                log_.append(("delete", list(ids)))
            for held in self._users.values():
                held.delete(gone)

    def drop(self, user_id: str | None = None) -> None:
        """Forget one user (``forget_user``) or everyone (``reset``); a load in flight is discarded."""
        with self._lock:
            if user_id is None:
                self._users.clear()
                self._too_big.clear()
                self._loading.clear()
            else:
                self._users.pop(user_id, None)
                self._too_big.discard(user_id)
                self._loading.pop(user_id, None)

    def _load(self, user_id: str) -> None:
        try:
            found = self._loader(user_id, self.budget_rows)
        except Exception as e:  # the engine serves the user meanwhile; the next query retries
            log.debug("loading the vectors of %r for the exact scan failed: %s", user_id, e)
            with self._lock:
                self._loading.pop(user_id, None)
                self._threads.pop(user_id, None)
            return
        with self._lock:
            self._threads.pop(user_id, None)
            replay = self._loading.pop(user_id, None)
            if replay is None:  # dropped while loading
                return
            if any(op == "delete" for op, _ in replay):
                return  # a delete may have shifted the engine's pages under the read: the next query reloads
            if found is None:
                self._too_big.add(user_id)
                return
            ids, vectors, layers, sessions = found
            held = UserVectors(vectors.shape[1] if len(vectors) else 1, capacity=max(256, len(ids)))
            held.add(ids, vectors, layers, sessions)
            for op, arg in replay:
                if op == "add" and isinstance(arg, tuple):
                    held.add(*arg)
                elif isinstance(arg, list):
                    held.delete(arg)
            self._users[user_id] = held
            self._evict()

    def _evict(self) -> None:
        total = sum(u.size for u in self._users.values())
        while total > self.budget_rows and self._users:
            user, held = self._users.popitem(last=False)
            total -= held.size
            if not self._users:  # a single user beyond the budget: the engine serves them
                self._too_big.add(user)
