"""The long-term sections :class:`~.block.TieredMemoryBlock` shows, and the order it shows them in (pure):
the core's context less what the model sees already, with the core's recent buffer (this session's
stored turns before those the block passed as shown: the short-term queue's) as "earlier in this
conversation"."""

from __future__ import annotations

from typing import Optional, Sequence

from tiered_memory import MemoryContext, Section
from tiered_memory.context.render import ContextItem

from .messages import shown_already

__all__ = ["EARLIER_TITLE", "SECTION_ORDER", "long_term_sections"]

# Most important first (the core's order, with this session's earlier turns after the
# facts). Rendered in this order, so truncation can drop from the end.
SECTION_ORDER = ("session", "facts", "earlier", "episodes", "turns")
EARLIER_TITLE = "Earlier in this conversation"


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
