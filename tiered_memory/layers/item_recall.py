"""Store items in recall: how an item found for a query becomes a search hit and a context
item (pure functions, table-tested).

``TieredMemory.search(..., include_items=True)`` and ``build_context(..., include_items=True)``
(and the LangChain middleware's ``include_items``) add the user's own items (those written
through the LangGraph store whose namespace maps to that user; never the shared ones, never
another user's) to what the turns give. An item hit has ``layer="item"``, an id
``"item:<id>"``, its namespace and key in ``metadata``, and its cosine similarity to the
query as its score. Turn scores add keyword, recency and neighbour terms to a similarity
on the same scale, so :func:`merge_by_score` can put both in one list; in the context,
items are their own section, rendered as quoted data like every other section.
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import Sequence

from ..records import Item
from ..types import MemoryHit
from .items import FIELD_SEP, ItemHit

__all__ = ["ITEM_LAYER", "as_memory_hit", "item_text", "merge_by_score"]

ITEM_LAYER = "item"


def item_text(item: Item) -> str:
    """What an item reads as in results and context: its indexed texts, one per line."""
    return (item.text or "").replace(FIELD_SEP, "\n").strip()


def as_memory_hit(hit: ItemHit) -> MemoryHit:
    """A search hit for an item found by :meth:`ItemStore.recall` (which always scores)."""
    item = hit.item
    score = float(hit.score if hit.score is not None else 0.0)
    return MemoryHit(id=f"item:{item.id}", text=item_text(item), score=score, layer=ITEM_LAYER,
                     session_id=None, timestamp=item.updated_at,
                     metadata={"namespace": list(item.namespace), "key": item.key},
                     explanation={**hit.explanation, "source": "store item"})


def merge_by_score(turns: Sequence[MemoryHit], items: Sequence[MemoryHit], k: int) -> list[MemoryHit]:
    """The first ``k`` of both ranked lists merged by score, each list's own order kept (turn
    recall puts reactions last whatever their score); a tie keeps the turn first (pure)."""
    return list(islice(heapq.merge(turns, items, key=lambda h: -h.score), k))
