"""The long-term sections :class:`~.block.TieredMemoryBlock` shows, and the order it shows them in (pure):
the core's context less what the model sees already, with this session's stored turns just before
the short-term queue as "earlier in this conversation"."""

from __future__ import annotations

from typing import Optional, Sequence

from tiered_memory import MemoryContext, Section
from tiered_memory.context.render import ContextItem
from tiered_memory.layers.buffer import newest_turns
from tiered_memory.tokens import TokenCount

from .messages import shown_already

__all__ = ["EARLIER_TITLE", "SECTION_ORDER", "before_the_queue", "long_term_sections"]

# Most important first (the core's order, with this session's earlier turns after the
# facts). Rendered in this order, so truncation can drop from the end.
SECTION_ORDER = ("session", "facts", "earlier", "episodes", "turns")
EARLIER_TITLE = "Earlier in this conversation"


def _rank(name: str) -> int:
    return SECTION_ORDER.index(name) if name in SECTION_ORDER else len(SECTION_ORDER)


def long_term_sections(context: MemoryContext, current_texts: set[str],
                       earlier: Optional[Sequence[ContextItem]] = None) -> list[Section]:
    """The sections the block shows, most important first (pure).

    ``earlier`` (by default the core's recent buffer, whose turns a flush took out of the
    Memory's queue) becomes the "earlier" section; turns already in the current messages
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


def before_the_queue(stored: Sequence[ContextItem], current_texts: set[str], room: TokenCount,
                     max_items: int) -> list[ContextItem]:
    """The session's newest stored turns not in the current messages, oldest first, within
    ``room`` tokens and ``max_items`` items (pure): whole turns, and of a newest turn over the
    room its newest items. ``stored`` are the session's latest stored messages, oldest first."""
    older = [i for i in stored if not shown_already(i.text, current_texts)]
    kept = newest_turns(older, lambda i: i.tokens, max_cost=room, max_items=max_items)
    while kept and sum(i.tokens for i in kept) > room:
        kept.pop(0)
    return kept
