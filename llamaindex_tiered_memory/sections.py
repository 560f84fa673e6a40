"""The long-term sections :class:`~.block.TieredMemoryBlock` shows, the order it shows them in, and
the text it renders them to (pure): the core's context less what the model sees already, with the
core's recent buffer (this session's stored turns before those the block passed as shown: the
short-term queue's) as "earlier in this conversation".

The text holds no ``{``: LlamaIndex's chat engines (``ContextChatEngine``,
``CondensePlusContextChatEngine``) put the chat history into a ``ChatPromptTemplate``, which fills
``{context_str}``, ``{query_str}`` (any ``{name}`` it knows) in every message, the memory's too, so
a stored ``{context_str}`` would pull the retrieved documents, unquoted, into the quoted memory.
LlamaIndex fills them with its ``SafeFormatter``, which needs the ``{`` (a lone ``}`` is left as
it is), so only ``{`` is escaped: each escape costs tokens."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from tiered_memory import MemoryContext, Section
from tiered_memory.context.render import ContextItem, drop_lowest, render_memory
from tiered_memory.tokens import TokenCount

from .messages import shown_already

__all__ = ["EARLIER_TITLE", "SECTION_ORDER", "cut", "inert", "long_term_sections", "render_block", "within"]

# Most important first (the core's order, with this session's earlier turns after the
# facts). Rendered in this order, so truncation can drop from the end.
SECTION_ORDER = ("session", "facts", "earlier", "episodes", "turns")
EARLIER_TITLE = "Earlier in this conversation"
_BRACE = {ord("{"): "\\u007b"}  # a JSON escape, as the core writes < and >


def _rank(name: str) -> int:
    return SECTION_ORDER.index(name) if name in SECTION_ORDER else len(SECTION_ORDER)


def long_term_sections(context: MemoryContext, current_texts: set[str],
                       earlier: Optional[Sequence[ContextItem]] = None) -> list[Section]:
    """The sections the block shows, most important first (pure).

    ``earlier`` (by default the core's recent buffer: the turns a flush took out of the
    Memory's queue, or, stored as put, those before the queue) becomes the "earlier" section; turns already in the current messages
    (``current_texts``, as stored: see :func:`shown_already`) are left out, whole or cut,
    since the model sees them anyway, and so are past turns that "earlier" shows.
    """
    sections = []
    shown = [i for i in (context.recent if earlier is None else earlier) if not shown_already(i.text, current_texts)]
    if shown:
        sections.append(Section(name="earlier", title=EARLIER_TITLE, items=shown))
    ids = {i.id for i in shown}
    for s in context.sections:
        items = [i for i in s.items if i.role is None or not (i.id in ids or shown_already(i.text, current_texts))]
        if items:
            sections.append(Section(name=s.name, title=s.title, items=items))
    return sorted(sections, key=lambda s: _rank(s.name))


def inert(text: str) -> str:
    """A rendered memory with its ``{`` written as a JSON escape (pure). Only its quoted items can
    hold braces (its labels and headings never do), so each item still decodes to its stored text,
    and no prompt template finds a ``{name}`` in it to fill."""
    return text.translate(_BRACE)


def render_block(sections: Sequence[Section]) -> str:
    """The text the block returns: :func:`~tiered_memory.context.render.render_memory` of
    ``sections``, made :func:`inert` (pure)."""
    return inert(render_memory(sections))


def cut(sections: Sequence[Section], tokens: TokenCount, count: Callable[[str], TokenCount]) -> Optional[list[Section]]:
    """``sections`` without their lowest-ranked items until :func:`render_block` of them is ``tokens``
    shorter in ``count`` (pure): :func:`~tiered_memory.context.render.drop_lowest`, counting the
    escapes; this conversation's earlier turns lose their oldest whole turns first, so what is left
    of them leads into the short-term queue. ``None`` when nothing is left."""
    return drop_lowest(sections, tokens, lambda text: count(inert(text)), oldest_first={"earlier"})


def within(sections: Sequence[Section], budget: TokenCount, count: Callable[[str], TokenCount]) -> list[Section]:
    """``sections`` whose :func:`render_block` costs at most ``budget`` tokens in ``count`` (pure): the
    core fitted them to the budget unescaped, and the escapes may push them over."""
    over = count(render_block(sections)) - budget
    return list(sections) if over <= 0 else cut(sections, over, count) or []
