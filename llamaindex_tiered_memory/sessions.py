"""Every turn into long-term memory, and the end of a session, for a ``Memory`` holding
:class:`~.block.TieredMemoryBlock` s: :class:`WriteThroughMemory` stores each message as it
is put; :func:`aend_session` flushes the short-term queue and lets the core summarise.
"""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable, List, Sequence

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import model_validator
from llama_index.core.memory import Memory
from llama_index.core.storage.chat_store.base_db import MessageStatus

from tiered_memory.aio import run_sync, whole
from tiered_memory.errors import ConfigurationError, InvalidInputError, TypedArgumentsModel

from .block import TieredMemoryBlock
from .pending import Batch


def _tiered_blocks(memory: Memory) -> list[TieredMemoryBlock]:
    return [b for b in memory.memory_blocks if isinstance(b, TieredMemoryBlock)]


class WriteThroughMemory(TypedArgumentsModel, Memory):
    """A ``Memory`` that also stores every message in its :class:`TieredMemoryBlock` s
    as soon as it is put (not only when the short-term queue flushes).

    Those blocks must have ``every_turn=True`` so flushed messages are not stored twice.
    Build it like ``Memory``: ``WriteThroughMemory.from_defaults(memory_blocks=[...])``.
    Messages that replace the history (``aset``, an agent's ``chat_history=``) are not
    stored: they usually come from somewhere that already keeps them. A bad argument (a block
    without ``every_turn=True``) is refused with :class:`~tiered_memory.errors.InvalidArgumentsError`,
    which is pydantic's ``ValidationError`` too.

    Example:
        >>> block = TieredMemoryBlock(memory=TieredMemory("/tmp/tm"), user_id="u1",
        ...                           every_turn=True)  # doctest: +SKIP
        >>> chat = WriteThroughMemory.from_defaults(session_id="s1", memory_blocks=[block],
        ...                                         tokenizer_fn=offline_tokenizer())  # doctest: +SKIP
    """

    @classmethod
    def class_name(cls) -> str:
        return "WriteThroughMemory"

    @model_validator(mode="after")
    def _blocks_take_every_turn(self) -> "WriteThroughMemory":
        blocks = _tiered_blocks(self)
        if not blocks:
            raise ConfigurationError("WriteThroughMemory needs at least one TieredMemoryBlock")
        lazy = [b.name for b in blocks if not b.every_turn]
        if lazy:
            raise ConfigurationError(
                f"set every_turn=True on memory block(s) {lazy}: with WriteThroughMemory every "
                "message is stored when put, and flushed messages would be stored twice")
        for b in blocks:
            b._recorded.add(self.session_id)  # its turns are stored as put, even those of a restored queue
            if b.tokenizer_fn is None:  # cut in the unit this Memory measures the saving in
                b.tokenizer_fn = self.tokenizer_fn
        return self

    async def aput(self, message: ChatMessage) -> None:
        await whole(self._put_through([message], functools.partial(super().aput, message)))

    async def aput_messages(self, messages: List[ChatMessage]) -> None:
        await whole(self._put_through(messages, functools.partial(super().aput_messages, messages)))

    async def _put_through(self, messages: Sequence[ChatMessage], buffer: Callable[[], Awaitable[None]]) -> None:
        # both steps, even if the caller is cancelled between them, so the chat buffer and the
        # store agree; a store write that fails leaves the buffer untouched. A put that fails
        # after a block stored the messages (the next block's store, the chat store) is
        # retried by its caller: those blocks then reuse the ids and store nothing twice
        written: list[tuple[TieredMemoryBlock, Batch]] = []
        try:
            for block in _tiered_blocks(self):
                batch = await block._record(messages, self.session_id)
                if batch is not None:
                    written.append((block, batch))
            await buffer()
        except BaseException:
            for block, batch in written:
                block._pending.not_stored(batch)
            raise


async def aend_session(memory: Memory) -> None:
    """End the conversation held by ``memory``.

    Everything still in the short-term queue is flushed to the memory blocks (as
    ``Memory`` does when the queue is full), so it reaches long-term memory; then each
    tiered store summarises the session when its core supports ``end_session``. The
    ``Memory`` starts the next turn with an empty short-term queue.

    A store that holds no text of this session for the block's user (a fresh ``Memory``,
    or only images and tool calls) has nothing to summarise: it is skipped, without an
    error and without an episode. Ending a session twice is harmless.

    Raises:
        InvalidInputError: ``memory`` is not a ``llama_index.core.memory.Memory``.
        UsageError, StoreError, VectorIndexError: the first block could not store the queue, or
            the flushes it kept (its memory is closed, its disk full): the queue is kept, so
            ending again stores it, once.
    """
    if not isinstance(memory, Memory):
        raise InvalidInputError(f"aend_session takes a llama_index Memory, got {type(memory).__name__}")
    for block in _tiered_blocks(memory):
        await block.awrite_pending()  # flushes a block kept go first (this session's turns in order)
    await whole(_flush_queue(memory))  # a cancel between the blocks' writes and the archive skips neither
    seen: set[tuple[int, str]] = set()
    for block in _tiered_blocks(memory):
        key = (id(block.memory), block.user_id)
        end = getattr(block.memory, "aend_session", None)
        if key in seen or end is None:
            continue
        seen.add(key)
        if not await block.memory.aget_messages(memory.session_id, user_id=block.user_id, limit=1):
            continue  # nothing stored: the core would raise NotFoundError for an empty session
        await end(memory.session_id, user_id=block.user_id)


async def _flush_queue(memory: Memory) -> None:
    """The short-term queue, given to the memory blocks, then archived."""
    active = await memory.sql_store.get_messages(memory.session_id, status=MessageStatus.ACTIVE)
    if not active:
        return
    # archived once a block has taken them: a failure before that (the tiered memory closed,
    # its disk full) leaves them in the queue to end again, and none is stored twice after it
    # (the block reuses the ids of what it failed to store). Once one has taken them, the
    # others keep what they cannot store, as after a flush of Memory's own
    taken = False
    try:
        for block in memory.memory_blocks:
            if isinstance(block, TieredMemoryBlock):
                await block._flushed(active, memory.session_id, kept=taken)
            else:
                await block.aput(active, from_short_term_memory=True, session_id=memory.session_id)
            taken = True
    finally:
        if taken or not memory.memory_blocks:
            await memory.sql_store.archive_oldest_messages(memory.session_id, n=len(active))


def end_session(memory: Memory) -> None:
    """Sync twin of :func:`aend_session`."""
    run_sync(aend_session(memory))

