"""A LangGraph store item whose text is gone from the store (deleted, overwritten, or expired
and swept) leaves the process's text caches too: the sibling of
``test_forget_process_memory.py`` for the store, walked the same way."""

from __future__ import annotations

from typing import Callable

import pytest
from langgraph.store.base import GetOp, PutOp
from test_forget_process_memory import held

from langchain_tiered_memory import TieredMemoryStore
from tiered_memory import TieredMemory
from tiered_memory.textcache import holds_texts

WORD = "Blorptangerine"  # no other test writes it
NS = ("ana", "memories")


@pytest.mark.parametrize("remove", ["delete", "overwrite", "batch", "sweep"])
def test_an_item_gone_from_the_store_leaves_no_text_in_any_cache(make_memory: Callable[..., TieredMemory],
                                                                 remove: str) -> None:
    now = [1_800_000_000.0]
    memory = make_memory(clock=lambda: now[0])
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(NS, "pet", {"text": f"Has a hamster called {WORD}"}, ttl=1.0 if remove == "sweep" else None)
    store.put(NS, "food", {"text": "Likes mango"})
    memory.build_context("what pet does the user have?", user_id="ana", session_id="s1", include_items=True)
    assert held(memory, [WORD]) == {WORD}  # counted for the context
    if remove == "delete":
        store.delete(NS, "pet")
    elif remove == "overwrite":
        store.put(NS, "pet", {"text": "Has no pets any more"})
    elif remove == "batch":  # a delete and an overwrite in one batch empty the caches once
        clears = holds_texts(CountedClears())
        store.put(NS, "drink", {"text": "Drinks tea"})  # a new item removes no text: the caches stay
        assert clears.count == 0
        store.batch([GetOp(NS, "food"), PutOp(NS, "pet", None), PutOp(NS, "food", {"text": "Likes mango a lot"}),
                     PutOp(NS, "book", {"text": "Reads Dune"})])
        assert clears.count == 1
    else:
        now[0] += 120.0  # past the one-minute TTL
        assert store.sweep_ttl() == 1
    pet = store.get(NS, "pet")
    assert pet is None or WORD not in pet.value["text"]
    assert held(memory, [WORD]) == set()
    assert store.search(NS, query="mango")[0].key == "food"  # the other items are still found


class CountedClears:
    """A cache of nothing that counts how often the caches are emptied."""

    def __init__(self) -> None:
        self.count = 0

    def cache_clear(self) -> None:
        self.count += 1
