"""``close()`` lets every running call finish, not only the facade's: a call made through a
handle the memory handed out (a session's working memory, the item store behind the
LangGraph store) while ``close()`` starts is stored whole, and one made after it is refused
with ``UsageError`` (never a closed engine's own error). Each race is held deterministically
by :class:`~tiered_memory.testing.HeldEmbedder`: the handle's call waits inside the
embedder until ``close()`` has begun refusing new calls."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import pytest

from langchain_tiered_memory import TieredMemoryStore
from tiered_memory import TieredMemory, UsageError
from tiered_memory.embedding import Embedder
from tiered_memory.layers.items import ItemWrite
from tiered_memory.testing import HeldEmbedder

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _refused(call: Callable[[], Any]) -> bool:
    try:
        call()
    except UsageError:
        return True
    return False


def _until_closing(memory: TieredMemory) -> None:
    """Return once ``close()`` has begun: the memory refuses new calls (polled, not timed)."""
    while not _refused(memory.stats):
        time.sleep(0.005)


def _race_close(memory: TieredMemory, held: HeldEmbedder, call: Callable[[], Any]) -> Any:
    """Run ``call`` until it waits in the embedder, close the memory meanwhile, then let the
    call go on; returns what the call returned (or raises what it raised)."""
    held.hold()
    with ThreadPoolExecutor(2) as pool:
        running: Future[Any] = pool.submit(call)
        assert held.entered.wait(60), "the call never reached the embedder"
        closing = pool.submit(memory.close)
        _until_closing(memory)
        held.release()
        try:
            return running.result()
        finally:
            closing.result()


def test_a_working_memory_write_running_when_close_starts_is_stored(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    held = HeldEmbedder(embedder)
    memory = make_memory("wm", embedder=held)
    wm = memory.working_memory("s", user_id="u")
    item = _race_close(memory, held, lambda: wm.remember("the user is moving to Porto", importance=0.9))
    assert _refused(wm.items)  # the handle is refused once the memory is closed
    again = make_memory("wm", embedder=held)
    assert [i.id for i in again.working_memory("s", user_id="u").items()] == [item.id]


def test_a_langgraph_put_running_when_close_starts_is_stored_with_its_vector(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    held = HeldEmbedder(embedder)
    memory = make_memory("lg", embedder=held)
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u", "prefs"), "music", {"text": "Listens to jazz while coding"})
    _race_close(memory, held, lambda: store.put(("u", "prefs"), "drink", {"text": "Drinks green tea every morning"}))
    again = make_memory("lg", embedder=held)
    # read through the item store, which repairs nothing: the vector was written before close
    hits = again.item_store().search(("u",), query="what does she drink in the morning?", user_id="u", limit=1)
    assert [h.item.key for h in hits] == ["drink"] and hits[0].score is not None


@pytest.mark.servers
@pytest.mark.record_stores("sqlite")  # the record store is the pgvector server's, given below
def test_a_langgraph_put_running_when_close_starts_is_stored_on_pgvector(
        make_memory: Callable[..., TieredMemory], embedder: Embedder, make_pgvector_url: Callable[[], str]) -> None:
    """Rows and vectors in one PostgreSQL transaction: the put commits both before close."""
    held, url = HeldEmbedder(embedder), make_pgvector_url()
    memory = make_memory("pgv", embedder=held, record_store=url, vector_store="pgvector")
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u", "prefs"), "music", {"text": "Listens to jazz while coding"})
    _race_close(memory, held, lambda: store.put(("u", "prefs"), "drink", {"text": "Drinks green tea every morning"}))
    again = make_memory("pgv", embedder=held, record_store=url, vector_store="pgvector")
    hits = again.item_store().search(("u",), query="what does she drink in the morning?", user_id="u", limit=1)
    assert [h.item.key for h in hits] == ["drink"] and hits[0].score is not None


def test_a_langgraph_search_running_when_close_starts_gets_its_hits(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    held = HeldEmbedder(embedder)
    memory = make_memory("lg-search", embedder=held)
    store = TieredMemoryStore(memory, fields=["text"])
    store.put(("u", "prefs"), "drink", {"text": "Drinks green tea every morning"})
    hits = _race_close(memory, held, lambda: store.search(("u",), query="morning drink", limit=1))
    assert [h.key for h in hits] == ["drink"]


async def test_an_async_langgraph_put_running_when_aclose_starts_is_stored(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    held = HeldEmbedder(embedder)
    memory = make_memory("lg-async", embedder=held)
    store = TieredMemoryStore(memory, fields=["text"])
    await store.aput(("u", "prefs"), "music", {"text": "Listens to jazz while coding"})
    held.hold()
    putting = asyncio.create_task(store.aput(("u", "prefs"), "drink", {"text": "Drinks green tea every morning"}))
    assert await asyncio.to_thread(held.entered.wait, 60)
    closing = asyncio.create_task(memory.aclose())
    while not _refused(memory.stats):
        await asyncio.sleep(0.005)
    held.release()
    await putting
    await closing
    again = make_memory("lg-async", embedder=held)
    assert again.item_store().get(("u", "prefs"), "drink") is not None


def test_an_item_store_handle_refuses_after_close_with_a_usage_error(memory: TieredMemory) -> None:
    items = memory.item_store()
    items.write_many([ItemWrite(namespace=("u", "prefs"), key="drink", user_id="u",
                                value={"text": "green tea"}, text="green tea")])
    memory.close()
    for call in (lambda: items.search(("u",), query="tea", user_id="u"),
                 lambda: items.recall("tea", user_id="u", k=3),
                 lambda: items.search(("u",)), lambda: items.get(("u", "prefs"), "drink"),
                 lambda: items.write_many([ItemWrite(namespace=("u", "prefs"), key="k", user_id="u",
                                                     value={"a": 1}, text="a")]),
                 lambda: items.namespaces(), lambda: items.sweep(), lambda: items.repair()):
        with pytest.raises(UsageError, match="closed"):
            call()

