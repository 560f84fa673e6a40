"""A write of TieredMemoryBlock that fails (a full record store, a failing vector engine) inside a
real ``llama_index.core.memory.Memory``: nothing the chat store took is lost, nothing is stored twice.

``Memory._manage_queue`` archives the flushed messages in its chat store before it hands them to
its blocks, and never hands them over again; so the block keeps a batch it could not store and
stores it first at its next call (:mod:`llamaindex_tiered_memory.pending`)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.memory import Memory  # noqa: E402
from llama_index.core.storage.chat_store.sql import MessageStatus  # noqa: E402

from li_support import FILLER, TOKENIZER, chat, small_memory, turn  # noqa: E402

from llamaindex_tiered_memory import TieredMemoryBlock, WriteThroughMemory, aend_session  # noqa: E402
from tiered_memory import Embedder, TieredMemory, TieredMemoryError, VectorIndexError  # noqa: E402
from tiered_memory.testing import FailingVectorIndex  # noqa: E402
from tiered_memory.vector.chroma import ChromaVectorIndex  # noqa: E402

FIRST = ("My dog is called Biscuit, she is a beagle.", "Biscuit is a lovely name.")
# long answers: each flush needs new pages of the record store, so a page limit makes it fail
TURNS = [FIRST, *[(q, a + " " + "More about that. " * 60) for q, a in FILLER]]


class Breaker:
    """Makes the memory's next writes fail, one way or another, and then lets them work again."""

    def __init__(self, kind: str, folder: Path, embedder: Embedder) -> None:
        self.kind = kind
        folder.mkdir(parents=True, exist_ok=True)
        self.index = FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), fail_on=set(), times=None)
        self.memory = TieredMemory(folder, embedder=embedder, vector_store=self.index)

    def break_(self) -> None:
        if self.kind == "vector":
            self.index.fail_on = {"upsert"}
        else:  # SQLite's own page limit stands in for a full disk: the rows are not written
            pages = self.memory.store.query("PRAGMA page_count")[0][0]  # type: ignore[attr-defined]
            self.memory.store.query(f"PRAGMA max_page_count={pages}")  # type: ignore[attr-defined]

    def heal(self) -> None:
        self.index.healthy()
        self.memory.store.query("PRAGMA max_page_count=1073741823")  # type: ignore[attr-defined]


@pytest.fixture(params=["store", "vector"])
def breaker(request: pytest.FixtureRequest, tmp_path: Path, embedder: Embedder) -> Iterator[Breaker]:
    b = Breaker(request.param, tmp_path / "store", embedder)
    yield b
    b.memory.close()


def stored(memory: TieredMemory, session_id: str, user_id: str = "u1") -> list[str]:
    return [m.content for m in memory.get_messages(session_id, user_id=user_id)]


async def archived(mem: Memory) -> list[str]:
    return [m.content or "" for m in await mem.aget_all(status=MessageStatus.ARCHIVED)]


async def put_turns(mem: Memory, turns: list[tuple[str, str]]) -> list[Exception]:
    errors: list[Exception] = []
    for q, a in turns:
        try:
            await mem.aput_messages(turn(q, a))
        except TieredMemoryError as e:
            errors.append(e)
    return errors


async def test_a_flush_the_store_could_not_take_is_stored_at_the_next_call(
        breaker: Breaker, caplog: pytest.LogCaptureFixture) -> None:
    """The flushed batch was archived by Memory, then the block's write failed: its turns were
    in neither the queue nor long-term memory (a failing store), and the error reached the
    caller of ``Memory.aput`` although the chat store had taken the message."""
    mem = small_memory(TieredMemoryBlock(memory=breaker.memory, user_id="u1"), "s1")
    errors = await put_turns(mem, TURNS[:2])
    assert await archived(mem) and stored(breaker.memory, "s1") == await archived(mem)  # flushes work
    breaker.break_()
    with caplog.at_level(logging.WARNING, logger="llamaindex_tiered_memory"):
        errors += await put_turns(mem, TURNS[2:4])
    assert breaker.index.failures or len(await archived(mem)) > len(stored(breaker.memory, "s1"))  # it failed
    assert "could not be stored yet" in caplog.text
    breaker.heal()
    errors += await put_turns(mem, TURNS[4:])
    assert errors == []  # the chat store took every message: no put failed
    assert stored(breaker.memory, "s1") == await archived(mem)  # every flushed turn, once, in order
    hits = breaker.memory.search("What is my dog called?", user_id="u1", k=3)
    assert any("Biscuit" in h.text for h in hits)


async def test_a_kept_batch_is_stored_by_the_next_read(breaker: Breaker) -> None:
    mem = small_memory(TieredMemoryBlock(memory=breaker.memory, user_id="u1"), "s1")
    breaker.break_()
    await put_turns(mem, TURNS[:4])
    assert await archived(mem)
    breaker.heal()
    block = mem.memory_blocks[0]
    text = await block.aget([chat("user", "What is my dog called?")], session_id="s1")
    assert TURNS[1][0] in text  # stored before the read, so recalled by it
    assert stored(breaker.memory, "s1") == await archived(mem)
    assert block.pending == 0


async def test_aend_session_stores_a_kept_batch_and_a_retried_end_stores_nothing_twice(breaker: Breaker) -> None:
    """Ending after a failed end, whose write failed after the commit (a vector engine's failure),
    stored the queue a second time; and a batch kept from a failed flush must be stored before
    the session ends, in its place."""
    mem = small_memory(TieredMemoryBlock(memory=breaker.memory, user_id="u1"), "s1")
    breaker.break_()
    await put_turns(mem, TURNS[:4])
    with pytest.raises(TieredMemoryError):
        await aend_session(mem)
    assert await mem.aget_all(status=MessageStatus.ACTIVE)  # the queue is kept to end again
    breaker.heal()
    await aend_session(mem)
    assert await mem.aget_all(status=MessageStatus.ACTIVE) == []
    assert stored(breaker.memory, "s1") == await archived(mem)


async def test_a_failed_write_through_put_retried_is_stored_once(breaker: Breaker) -> None:
    """A write-through put whose write failed after the commit (a vector engine's failure) raised,
    the chat store untouched: the caller's retry stored the message a second time."""
    block = TieredMemoryBlock(memory=breaker.memory, user_id="u1", every_turn=True)
    mem = WriteThroughMemory.from_defaults(session_id="s1", memory_blocks=[block], tokenizer_fn=TOKENIZER,
                                           token_limit=400, chat_history_token_ratio=0.25, token_flush_size=40)
    question, answer = TURNS[1][0], TURNS[1][1] * 8  # long: the store needs new pages for it
    await mem.aput(chat("user", question))
    breaker.break_()
    with pytest.raises(TieredMemoryError):
        await mem.aput(chat("assistant", answer))
    assert [m.content for m in await mem.aget_all()] == [question]  # the put was refused whole
    breaker.heal()
    await mem.aput(chat("assistant", answer))  # the caller's retry
    errors = await put_turns(mem, TURNS[2:5])
    assert errors == []
    assert stored(breaker.memory, "s1") == [m.content for m in await mem.aget_all()]


async def test_a_kept_batch_goes_with_a_pickled_block(breaker: Breaker) -> None:
    """An agent's Context pickles its Memory's blocks; a batch the block kept is stored by the copy."""
    block = TieredMemoryBlock(memory=breaker.memory, user_id="u1")
    mem = small_memory(block, "s1")
    breaker.break_()
    await put_turns(mem, TURNS[:4])
    assert block.pending > 0
    copy = pickle.loads(pickle.dumps(block))
    assert copy.pending == block.pending
    breaker.heal()
    await copy.aget([chat("user", "What is my dog called?")], session_id="s1")
    assert copy.pending == 0
    assert stored(breaker.memory, "s1") == await archived(mem)
    await block.awrite_pending()  # the original's batch too: the same ids, stored once
    assert block.pending == 0
    assert stored(breaker.memory, "s1") == await archived(mem)


def test_a_block_pickled_before_it_kept_batches_unpickles(memory: TieredMemory) -> None:
    """A block pickled by the previous release has no kept batches in its state; unpickled,
    every call failed on the missing attribute."""
    state = TieredMemoryBlock(memory=memory, user_id="u1").__getstate__()
    del state["__pydantic_private__"]["_pending"]
    old = TieredMemoryBlock.__new__(TieredMemoryBlock)
    old.__setstate__(state)
    assert old.pending == 0
    assert old.record([chat("user", "My sister lives in Oslo.")], session_id="s1")
    assert stored(memory, "s1") == ["My sister lives in Oslo."]


async def test_a_write_through_put_one_block_failed_is_stored_once_by_the_others(
        breaker: Breaker, memory: TieredMemory) -> None:
    """With two blocks, the second failing: the put raised after the first had stored the message,
    and the caller's retry stored it in the first block's memory a second time."""
    ok = TieredMemoryBlock(memory=memory, user_id="u1", every_turn=True)
    broken = TieredMemoryBlock(name="second", memory=breaker.memory, user_id="u1", every_turn=True)
    mem = WriteThroughMemory.from_defaults(session_id="s1", memory_blocks=[ok, broken], tokenizer_fn=TOKENIZER)
    question, answer = TURNS[1][0], TURNS[1][1] * 8
    await mem.aput(chat("user", question))
    breaker.break_()
    with pytest.raises(TieredMemoryError):
        await mem.aput(chat("assistant", answer))
    breaker.heal()
    await mem.aput(chat("assistant", answer))  # the caller's retry
    assert stored(memory, "s1") == stored(breaker.memory, "s1") == [question, answer]
