"""Context assembly for :meth:`TieredMemory.build_context`: gather, then fit (pure ``fit_sections``).

Sections, most important first (truncated last): ``session`` (working memory),
``facts`` (known facts), ``episodes`` (relevant past sessions) and ``turns``
(relevant past turns), plus the ``recent`` buffer, which takes
``BudgetConfig.buffer_share`` of the budget first (oldest whole turns dropped).
The memory budget left is split by ``BudgetConfig.shares``. Items are never split;
everything left out is reported in ``MemoryContext.dropped`` with a reason. Items
that make it into the context count as an access (facts, episodes).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from .context import ContextItem, Dropped, MemoryContext, SectionRequest, fit_sections, item_cost
from .types import MemoryHit, StoredMessage

if TYPE_CHECKING:
    from .layers import Layers
    from .memory import TieredMemory

TITLES = {"session": "Current session notes", "facts": "Known facts about the user",
          "episodes": "Relevant past sessions", "turns": "Relevant past conversation"}
PRIORITY = {"session": 0, "facts": 1, "episodes": 2, "turns": 3}


def _costed(item: ContextItem, count: Callable[[str], int]) -> ContextItem:
    return ContextItem(**{**item.__dict__, "tokens": item_cost(item, count)})


def message_item(m: StoredMessage, count: Callable[[str], int]) -> ContextItem:
    return _costed(ContextItem(id=m.id, text=m.content, tokens=0, role=m.role, timestamp=m.timestamp), count)


def hit_item(h: MemoryHit, count: Callable[[str], int]) -> ContextItem:
    return _costed(ContextItem(id=h.id, text=h.text, tokens=0, role=h.role, timestamp=h.timestamp,
                               score=h.score), count)


def layer_requests(layers: "Layers", query: str, *, user_id: str, session_id: str,
                   count: Callable[[str], int]) -> list[SectionRequest]:
    """Candidates of the session, facts and episodes sections, best first."""
    m = layers.memory
    retrieval = m.config.retrieval
    wm = layers.working(session_id, user_id).items(query or None)
    session = [_costed(ContextItem(id=f"wm:{i.id}", text=i.text, tokens=0, label=i.type, score=i.score), count)
               for i in wm]
    if query.strip():
        facts = [h.fact for h in layers.facts.search(query, user_id=user_id, k=30, type=None,
                                                      retrieval=retrieval, touch=False)]
        episodes = [h.episode for h in layers.episodes.search(query, user_id=user_id, k=5,
                                                              retrieval=retrieval, touch=False)]
    else:
        facts = sorted(layers.facts.select(user_id), key=lambda f: (-f.confidence, -f.updated_at))[:30]
        episodes = list(reversed(layers.episodes.select(user_id)))[:5]
    fact_items = [_costed(ContextItem(id=f"fact:{f.id}", text=f.text, tokens=0, label=f.type), count)
                  for f in facts]
    ep_items = [_costed(ContextItem(id=f"ep:{e.id}", text=e.render(), tokens=0, timestamp=e.end,
                                    label="past session"), count) for e in episodes]
    shares = m.config.budget.shares
    return [SectionRequest(name=n, title=TITLES[n], items=items, share=shares.get(n, 0.0), priority=PRIORITY[n])
            for n, items in (("session", session), ("facts", fact_items), ("episodes", ep_items))]


def assemble(memory: "TieredMemory", query: str, *, user_id: str, session_id: str, max_tokens: int | None,
             layers: "Layers | None") -> MemoryContext:
    budget = max_tokens if max_tokens is not None else memory.config.budget.max_tokens
    count = memory.count_tokens
    buffer = memory.get_buffer(session_id, user_id=user_id)
    recent = [message_item(m, count) for m in buffer]
    recent_budget = int(budget * memory.config.budget.buffer_share)
    dropped = []
    while len(recent) > 1 and sum(i.tokens for i in recent) > recent_budget:
        old = recent.pop(0)
        dropped.append(Dropped(section="recent", id=old.id, tokens=old.tokens, reason="buffer over its share"))
    in_buffer = {m.id for m in buffer}
    hits = memory.search(query, user_id=user_id, k=20) if query.strip() else []
    turns = [hit_item(h, count) for h in hits if h.id not in in_buffer]
    requests = layer_requests(layers, query, user_id=user_id, session_id=session_id,
                              count=count) if layers is not None else []
    requests.append(SectionRequest(name="turns", title=TITLES["turns"], items=turns,
                                   share=memory.config.budget.shares.get("turns", 0.3), priority=PRIORITY["turns"]))
    used = sum(i.tokens for i in recent)
    sections, lost = fit_sections(requests, max(0, budget - used))
    dropped += [Dropped(section=d.section, id=d.id, tokens=d.tokens,
                        reason=f"over budget: lower-priority '{d.section}' truncated first") for d in lost]
    if layers is not None:
        now = time.time()
        kept = {s.name: [i.id.split(":", 1)[1] for i in s.items] for s in sections
                if s.name in ("facts", "episodes")}
        layers.facts.touch(user_id, kept.get("facts", []), now)
        layers.episodes.touch(user_id, kept.get("episodes", []), now)
    return MemoryContext(sections=sections, recent=recent, dropped=dropped, max_tokens=budget)
