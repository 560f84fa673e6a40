"""How :class:`~.items.ItemStore` searches its items: a listing (no query) and a semantic search.

Both read bounded pages, never every item under the prefix:

- **A listing** reads the prefix newest first, a page at a time (:func:`~.item_rules.page_of`),
  with the filter decided in the database (:mod:`~tiered_memory.store.item_filter_sql`): a
  selective filter reads its page, not the rows it rejects. Its order is one over every namespace
  under the prefix, so its pages put together are the whole listing. Given a user, it lists that
  owner's items only, as a semantic search does.
- **A semantic search** ranks the owner's best candidates (vector and keyword, hybrid, scored
  by cosine similarity). When they hold too few items under the prefix that match the filter,
  the rest are found from the database (the matching rows only, up to a bound) and ranked among
  their own vectors; past that bound, by asking the vector index for ever more of the owner's
  nearest vectors, reading only those rows. An exhausted search fills its page, as LangGraph's
  stores do, with the newest matching items that have nothing to rank (no text, or vectors not
  written yet), a bounded page of them.

Every row read is checked in Python (:func:`~.item_filters.match_filter`, the owner) as well.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..embedding import embed_query
from ..guard import vector_errors_typed
from ..parts import Parts
from ..recall.query import query_terms
from ..records import Item
from ..store.repositories import ItemRepository
from ..validation import MAX_COUNT
from .item_filters import match_filter
from .item_rules import LAYER, MAX_PARTS, ItemHit, best_parts, page_of, rank_by_similarity, text_parts, vector_id

__all__ = ["ItemSearch"]

#: ids read per statement when a deeper vector query's candidates are looked up
ID_READ = 10_000


class ItemSearch:
    """The reads of a search over one memory's item rows (``db``) and vector index."""

    def __init__(self, parts: Parts, db: ItemRepository) -> None:
        self.parts = parts
        self.db = db

    def listing(self, ns: tuple[str, ...], *, filter: Mapping[str, Any] | None, limit: int, offset: int,
                owned: Callable[[Item], bool] | None, user_id: str | None = None) -> list[ItemHit]:
        """Items under ``ns`` matching ``filter`` that ``owned`` keeps (of ``user_id`` alone, when
        given), newest first: bounded reads until the page is full."""
        now = self.parts.now()

        def keep(i: Item) -> bool:
            return ((user_id is None or i.user_id == user_id) and match_filter(i.value, filter)
                    and (owned is None or owned(i)))

        listed = page_of(lambda after, n: self.db.items_page(ns, n, after, live_at=now, filter=filter,
                                                             user_id=user_id), keep, limit=limit, offset=offset)
        return [ItemHit(item=i, score=None) for i in listed]

    def semantic(self, ns: tuple[str, ...], query: str, *, user_id: str, filter: Mapping[str, Any] | None,
                 limit: int, offset: int) -> list[ItemHit]:
        """The page ``[offset, offset + limit)`` of ``user_id``'s items under ``ns`` matching
        ``filter``, ranked by cosine similarity to ``query``."""
        qvec = embed_query(self.parts.embedder, query)
        want = offset + limit
        ranked = self.ranked(ns, query, user_id=user_id, filter=filter, n=want, vector=qvec)
        if len(ranked) < want:
            ranked += self._deeper(ns, qvec, user_id=user_id, filter=filter, n=want - len(ranked),
                                   seen={h.item.id for h in ranked})
        return ranked[offset:want]

    def _deeper(self, ns: tuple[str, ...], qvec: np.ndarray, *, user_id: str, filter: Mapping[str, Any] | None,
                n: int, seen: set[str]) -> list[ItemHit]:
        """Up to ``n`` more of the owner's items under ``ns`` matching ``filter`` (none of ``seen``):
        the best by similarity, then the newest with nothing to rank."""
        now = self.parts.now()
        bound = max(self.parts.config.retrieval.candidates, 4 * n)

        def keep(i: Item) -> bool:
            return i.id not in seen and i.user_id == user_id and match_filter(i.value, filter)

        # the matching rows, up to the bound: when that is all of them, each is ranked among its own vectors
        rest = page_of(lambda after, k: self.db.items_page(ns, k, after, live_at=now, filter=filter, user_id=user_id),
                       keep, limit=bound + 1, offset=0)
        if len(rest) <= bound:
            scored = self._among(rest, qvec, user_id=user_id, n=n)
        else:  # many: the owner's nearest vectors, ever more of them, reading only their rows
            scored = self._nearest(ns, qvec, user_id=user_id, filter=filter, keep=keep, n=n, now=now)
        if len(scored) == n:
            return scored
        done = seen | {h.item.id for h in scored}
        fill = page_of(lambda after, k: self.db.items_page(ns, k, after, live_at=now, filter=filter, user_id=user_id),
                       lambda i: keep(i) and i.id not in done, limit=n - len(scored), offset=0)
        return scored + [ItemHit(item=i, score=None) for i in fill]

    def _nearest(self, ns: tuple[str, ...], qvec: np.ndarray, *, user_id: str, filter: Mapping[str, Any] | None,
                 keep: Callable[[Item], bool], n: int, now: float) -> list[ItemHit]:
        """The best ``n`` items ``keep`` says yes to, by asking the index for the owner's ``k``
        nearest vectors, ``k`` four times larger each round, until ``n`` are found or the owner
        has no more; only the rows of new candidates are read."""
        checked: set[str] = set()
        found: dict[str, tuple[Item, float]] = {}
        k = max(self.parts.config.retrieval.candidates, n * 4) * 4
        while True:
            k = min(k, MAX_COUNT)
            vectors = self.query(qvec[None, :], user_id=user_id, k=k)
            similarity = dict(best_parts(vectors))
            new = [i for i in similarity if i not in checked]
            checked.update(new)
            for start in range(0, len(new), ID_READ):
                for item in self.db.items_under(ns, new[start:start + ID_READ], live_at=now, filter=filter):
                    if keep(item):
                        found[item.id] = (item, similarity[item.id])
            if len(found) >= n or len(vectors) < k or k == MAX_COUNT:
                break
            k *= 4
        order = rank_by_similarity({i: s for i, (_, s) in found.items()}, {},
                                   {i: item.updated_at for i, (item, _) in found.items()})[:n]
        return [_hit(found[i][0], found[i][1], None) for i in order]

    def query(self, vectors: np.ndarray, *, user_id: str, k: int,
              among: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """The item vectors nearest the query's (one query); a vector engine's error is a VectorIndexError."""
        with vector_errors_typed("a store search failed in the vector engine ({error}); nothing was changed"):
            return list(self.parts.index.query(vectors, user_id=user_id, k=k, layers=[LAYER], among=among)[0])

    def ranked(self, ns: tuple[str, ...], query: str, *, user_id: str, filter: Mapping[str, Any] | None,
               n: int, vector: np.ndarray | None = None) -> list[ItemHit]:
        """The owner's items under ``ns`` matching ``filter`` among its best candidates, ranked by
        cosine similarity to ``query`` (``vector`` is its embedding when the caller has it)."""
        cfg = self.parts.config.retrieval
        # a page as deep as LangGraph's "every match" (limit=sys.maxsize) asks for every candidate:
        # held to the count every store and index takes, which no user's items reach
        n = min(max(cfg.candidates, n * 4), MAX_COUNT)
        qvec = (embed_query(self.parts.embedder, query) if vector is None else vector)[None, :]
        vec = self.query(qvec, user_id=user_id, k=n)
        kw = self.db.keyword_items(user_id, query_terms(query), n)
        vec = best_parts(vec)
        candidates = {i.id: i for i in self.db.items_under(ns, [i for i, _ in vec] + [i for i, _ in kw],
                                                           live_at=self.parts.now())
                      if i.user_id == user_id and match_filter(i.value, filter)}
        similarity = {i: s for i, s in vec if i in candidates}
        # keyword matches the vector top-n missed get their similarity too, so every score
        # is on one scale (cosine similarity, higher is better) and a threshold means something
        missed = [vector_id(i, n) for i, _ in kw if i in candidates and i not in similarity
                  for n in range(len(text_parts(candidates[i].text or "")))]
        if missed:
            found = self.query(qvec, user_id=user_id, k=len(missed), among=missed)
            similarity.update(best_parts(found))
        kw_rank = {i: r for r, (i, _) in enumerate((i, s) for i, s in kw if i in candidates)}
        order = rank_by_similarity(similarity, kw_rank, {i: c.updated_at for i, c in candidates.items()})
        return [_hit(candidates[i], similarity[i], kw_rank.get(i)) for i in order]

    def _among(self, items: Sequence[Item], qvec: np.ndarray, *, user_id: str, n: int) -> list[ItemHit]:
        """The best ``n`` of ``items`` by cosine similarity to ``qvec``, found among their own
        vectors only: a search narrower than its owner (a deeper prefix, a filter) ranks what it
        may return, however many of the owner's other items match the query better."""
        items = [i for i in items if i.text]
        among = [vector_id(i.id, p) for i in items for p in range(len(text_parts(i.text or "")))]
        if not among or n <= 0:
            return []
        by_id = {i.id: i for i in items}
        found = self.query(qvec[None, :], user_id=user_id, k=min(len(among), n * MAX_PARTS), among=among)
        similarity = {i: s for i, s in best_parts(found) if i in by_id}
        order = rank_by_similarity(similarity, {}, {i: by_id[i].updated_at for i in similarity})[:n]
        return [_hit(by_id[i], similarity[i], None) for i in order]


def _hit(item: Item, similarity: float, keyword_rank: int | None) -> ItemHit:
    return ItemHit(item=item, score=similarity, explanation={"method": "cosine similarity", "similarity": similarity,
                                                             "keyword_rank": keyword_rank})
