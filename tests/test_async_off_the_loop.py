"""The async paths run their blocking work (embedding, the stores) off the caller's event
loop: the core's ``a*`` twins and the adapters' async methods alike. Each call is held inside
the embedder by :class:`~tiered_memory.testing.HeldEmbedder`; the test's own coroutine then
runs on the same loop while the call waits there, which it could not if the call had
embedded on the loop (the held embedder would block it, time out and fail the call)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

pytest.importorskip("llama_index.core")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402

from langchain_tiered_memory import TieredChatMessageHistory, TieredMemoryRetriever, TieredMemoryStore  # noqa: E402
from llamaindex_tiered_memory import TieredMemoryBlock  # noqa: E402
from tiered_memory import TieredMemory  # noqa: E402
from tiered_memory.embedding import Embedder  # noqa: E402
from tiered_memory.testing import HeldEmbedder  # noqa: E402

Call = Callable[[TieredMemory], Awaitable[Any]]

CALLS: dict[str, Call] = {
    "aadd_many": lambda m: m.aadd_many([{"role": "user", "content": "I grow tomatoes"}], session_id="s", user_id="u"),
    "asearch": lambda m: m.asearch("what do I grow?", user_id="u"),
    "abuild_context": lambda m: m.abuild_context("what do I grow?", user_id="u", session_id="s2"),
    "working_memory.aremember": lambda m: m.working_memory("s", user_id="u").aremember("a greenhouse"),
    "history.aadd_messages": lambda m: TieredChatMessageHistory(m, "s", user_id="u").aadd_messages(
        [HumanMessage("I grow peppers too"), AIMessage("Nice")]),
    "history.aget_messages": lambda m: TieredChatMessageHistory(
        m, "s", user_id="u", include_memory=True).aget_messages(),
    "retriever.ainvoke": lambda m: TieredMemoryRetriever(memory=m, user_id="u").ainvoke("what do I grow?"),
    "store.aput": lambda m: TieredMemoryStore(m, fields=["text"]).aput(("u", "garden"), "crop", {"text": "tomatoes"}),
    "store.asearch": lambda m: TieredMemoryStore(m, fields=["text"]).asearch(("u",), query="crops"),
    "block.aget": lambda m: TieredMemoryBlock(memory=m, user_id="u", session_id="s2").aget(
        [ChatMessage(role="user", content="what do I grow?")]),
    "block.aput": lambda m: TieredMemoryBlock(memory=m, user_id="u", session_id="s").aput(
        [ChatMessage(role="user", content="and basil")]),
}


@pytest.mark.parametrize("name", list(CALLS))
async def test_the_async_path_embeds_off_the_event_loop(
        name: str, make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    held = HeldEmbedder(embedder, timeout=20)
    memory = make_memory(embedder=held)
    memory.add("user", "I grow tomatoes on the balcony", session_id="s", user_id="u")
    held.hold()
    running = asyncio.create_task(CALLS[name](memory))
    assert await asyncio.to_thread(held.entered.wait, 60), "the call never reached the embedder"
    held.release()  # reached while the call waits in the embedder: the loop was free meanwhile
    await running
