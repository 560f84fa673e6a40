"""A ranked item search whose best candidates hold too few items under its prefix (or matching its
filter) finds the rest with bounded reads: the matching rows only, or the rows of the owner's nearest
vectors, never every row under the prefix; and ranks them as ranking every matching item would."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from hook_support import item_reads
from tiered_memory import MemoryConfig, RetrievalConfig, StaticEmbedder, TieredMemory
from tiered_memory.layers.items import ItemWrite


@pytest.fixture
def small(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    """Twenty candidates per query: a page of five is short as soon as they lie elsewhere."""
    return make_memory("bounds", embedder=StaticEmbedder(),
                       config=MemoryConfig(retrieval=RetrievalConfig(candidates=20)))


def _fill(memory: TieredMemory) -> None:
    close = ["green tea", "black tea", "mint tea", "jasmine tea", "tea leaves", "iced tea"]
    far = ["bicycle wheel", "garden fence", "piano lesson", "tax return", "winter coat", "train ticket",
           "kitchen sink", "football match"]
    memory.item_store().write_many(
        [ItemWrite(namespace=("u", "drinks"), key=f"d{n}", user_id="u", value={"n": n}, text=f"{close[n % 6]} {n}")
         for n in range(240)]
        + [ItemWrite(namespace=("u", "misc"), key=f"m{n}", user_id="u", value={"n": n, "rare": n in (3, 50)},
                     text=f"{far[n % 8]} {n} {'tea' if n % 9 == 0 else ''}") for n in range(160)]
        + [ItemWrite(namespace=("u", "misc"), key="bare", user_id="u", value={"n": -1, "rare": True})])  # no text


def _unbounded(reads: list[str]) -> list[str]:
    """The reads of item rows with no LIMIT and no id list: every row under the prefix."""
    return [s for s in reads if " LIMIT " not in s and " id IN (" not in s]


def _brute(memory: TieredMemory, query: str, keep: Callable[[Any], bool]) -> list[str]:
    rows = [i for i in memory.item_store().db.items_under(("u", "misc")) if keep(i) and i.text]
    vectors = memory.embedder.embed_array([i.text for i in rows])  # type: ignore[attr-defined]
    q = memory.embedder.embed_query(query)
    sims = vectors @ q / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(q))
    return [rows[n].key for n in np.argsort(-sims, kind="stable")]


def test_a_short_page_reads_only_the_rows_the_filter_matches(small: TieredMemory) -> None:
    """Short of its page, the search read every row under the prefix (all owners, every value) to
    rank the few that match; it now reads those rows alone, then fills with the one without text."""
    _fill(small)
    hits: list[Any] = []
    reads = item_reads(small, lambda: hits.extend(small.item_store().search(
        ("u",), query="a cup of tea", user_id="u", filter={"rare": True}, limit=5)))
    assert _unbounded(reads) == []
    assert [h.item.key for h in hits[:2]] == _brute(small, "a cup of tea", lambda i: i.value.get("rare"))
    assert [(h.item.key, h.score) for h in hits[2:]] == [("bare", None)]


def test_a_short_page_of_a_large_prefix_reads_the_nearest_vectors_rows(small: TieredMemory) -> None:
    """The query's twenty candidates all lie in another namespace: the prefix's 161 rows were all
    read. Now the owner's nearest vectors are asked for, ever more, and only their rows read; the
    page is the one ranking every item of the prefix gives."""
    _fill(small)
    hits: list[Any] = []
    reads = item_reads(small, lambda: hits.extend(small.item_store().search(
        ("u", "misc"), query="a cup of tea", user_id="u", limit=5, offset=2)))
    assert _unbounded(reads) == []
    assert [h.item.key for h in hits] == _brute(small, "a cup of tea", lambda i: True)[2:7]
    assert all(h.score is not None for h in hits)
