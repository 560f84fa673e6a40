"""Context assembly for :meth:`TieredMemory.build_context`: gather, then fit (pure ``fit_sections``).

Sections, most important first (truncated last): ``session`` (working memory),
``facts`` (known facts: constraints, and the others as close to the query as the past turns,
``BudgetConfig.fact_relevance``), ``episodes`` (relevant past sessions, each headed by its
day), ``items`` (the user's LangGraph store items, only with ``include_items=True``; share
``"items"``, default 0.2) and ``turns`` (relevant past turns, as many asked of the search as
the room holds in short chat messages, :func:`turn_candidates`), plus the ``recent`` buffer,
which takes ``BudgetConfig.buffer_share`` of the budget first (oldest whole turns dropped; the newest
turn is kept whole within the whole budget, :func:`~tiered_memory.layers.buffer.newest_within`).
The memory budget left (after the preamble, the block's tags and the headings of the
sections that have candidates, so that :meth:`MemoryContext.memory_text` plus the recent
turns fit the budget) is split by ``BudgetConfig.shares``. Items are never split;
everything left out is reported in ``MemoryContext.dropped`` with a reason. Past turns the caller
shows the model already (``shown``: its own messages, such as a framework's short-term queue) are
left out before fitting: the recent buffer is the session's newest turns other than those (the
turns that lead into them; its turns over its share are then past turns to recall, not dropped),
and the ``turns`` candidates leave them out as they leave out the buffer's, so their room goes to
other memories; so are their twins that say the same (the same text stored again under another id:
:func:`shown_twins`), and the recent turns' twins (a user who says again what they said last week,
a re-imported copy). Texts the caller shows that may not be stored (``shown_texts``: a framework's
queue kept outside the memory) leave out, likewise, the past turns that say one of them, in any role
(:func:`heard_texts`: a user who asks again what they asked last week), and the recent turns that say
one, once the recent turns are chosen (a question asked again in this conversation): left out before
that, a repeated question would join its answer to the turn before and drop both. The room they would
take goes to the sections. They are not reported as dropped: the model sees them. The search is asked for
more turns by as many as may be left out so (:func:`turn_candidates`), and as many turns are kept as
it would hand on without them, in its order (:func:`best_kept`). With
``include_recent=False`` (a caller that shows ``memory_text`` alone) there is no recent buffer: the
session's turns not shown are past turns to recall, and the whole budget goes to the sections. A past turn that a
kept fact or episode quotes whole is left out for the next one (:func:`without_repeats`). Working-memory
items whose decayed importance fell below ``ConsolidationConfig.prune_below`` have faded
and are not shown (``consolidate`` prunes them; an access would spare them), and are reported
(:data:`FADED_REASON`).

The query is embedded once and that vector serves every section. Assembly writes
nothing: :func:`accessed` says which kept items the caller should count as accessed.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Collection, Sequence

import numpy as np

from ..embedding import embed_query
from ..layers.buffer import newest_within, select_buffer
from ..layers.episodic import said_nothing
from ..layers.item_recall import item_text
from ..layers.items import ItemStore
from ..layers.longterm import Layers
from ..layers.working import decayed
from ..parts import AccessLayer, Parts
from ..recall.query import words
from ..recall.search import search_turns
from ..store.base import RecordStore
from ..tokens import TokenCount
from ..types import MemoryHit, StoredMessage
from .render import (ContextItem, Dropped, MemoryContext, Section, SectionRequest, cut_to_tokens, fit_sections,
                     frame_tokens, item_cost, repeated_turns, within_budget)

TITLES = {"session": "Current session notes", "facts": "Known facts about the user",
          "episodes": "Relevant past sessions", "turns": "Relevant past conversation",
          "items": "Saved memories"}
PRIORITY = {"session": 0, "facts": 1, "episodes": 2, "items": 2, "turns": 3}
ITEM_SHARE = 0.2  # when BudgetConfig.shares names no "items" share
TURN_CANDIDATES = 40  # at least: enough whole LoCoMo turns to fill a 2,000-token context (20 filled ~1,100)
TURN_TOKENS = 40  # a short chat message's cost in the context: a room of R tokens asks for R // 40 turns
ITEM_CANDIDATES = 10
FACT_CANDIDATES = 30
EPISODE_CANDIDATES = 5
REPEAT_REASON = "already quoted by"  # a past turn left out because a kept fact or episode says it
FADED_REASON = "faded: its decayed importance is under ConsolidationConfig.prune_below"


def _costed(item: ContextItem, count: Callable[[str], TokenCount]) -> ContextItem:
    return ContextItem(**{**item.__dict__, "tokens": item_cost(item, count)})


def message_item(m: StoredMessage, count: Callable[[str], TokenCount]) -> ContextItem:
    return _costed(ContextItem(id=m.id, text=m.content, tokens=0, role=m.role, timestamp=m.timestamp), count)


def hit_item(h: MemoryHit, count: Callable[[str], TokenCount]) -> ContextItem:
    """A turn hit as a context item; of a long message, only the part that matched, labelled
    as a part (the id still names the whole message)."""
    part = h.explanation.get("part")
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return _costed(ContextItem(id=h.id, text=part["text"], tokens=0, role=h.role, timestamp=h.timestamp,
                                   score=h.score, label=f"part {part['index'] + 1}/{part['count']} of a long message"),
                       count)
    return _costed(ContextItem(id=h.id, text=h.text, tokens=0, role=h.role, timestamp=h.timestamp,
                               score=h.score), count)


def similarity(hit_explanation: dict[str, Any]) -> float | None:
    """The cosine of a hit to the query, from its explanation's vector signal (``None`` when
    the vector search did not bring it)."""
    signals = hit_explanation.get("signals")
    vector = signals.get("vector") if isinstance(signals, dict) else None
    value = vector.get("value") if isinstance(vector, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def relevant_fact(fact_type: str, fact_similarity: float | None, best_turn: float | None, floor: float) -> bool:
    """Does a fact earn a place in the context (pure)? Constraints always do: they bind every
    answer. Other facts when they are about as close to the query as past turns: their cosine
    at least ``floor`` times the best turn's (when there are no turns to compare, yes)."""
    if fact_type == "constraint" or best_turn is None or best_turn <= 0 or floor <= 0:
        return True
    return fact_similarity is not None and fact_similarity >= floor * best_turn


def layer_requests(layers: Layers, query: str, vector: np.ndarray | None, *, user_id: str, session_id: str,
                   count: Callable[[str], TokenCount], best_turn: float | None = None,
                   ) -> tuple[list[SectionRequest], list[Dropped]]:
    """Candidates of the session, facts and episodes sections, best first (facts that are not
    :func:`relevant_fact` left out), and the working-memory items left out as faded."""
    parts = layers.parts
    retrieval = parts.config.retrieval
    now = parts.now()
    floor = parts.config.consolidation.prune_below  # what consolidate would prune is not shown either
    session: list[ContextItem] = []
    faded: list[ContextItem] = []
    for i in layers.working(session_id, user_id).items(query or None, vector=vector, now=now):
        item = _costed(ContextItem(id=f"wm:{i.id}", text=i.text, tokens=0, label=i.type, score=i.score), count)
        if decayed(i.importance, i.created_at, now, parts.config.working.decay_per_hour) >= floor:
            session.append(item)
        else:
            faded.append(item)
    if vector is not None:
        bar = parts.config.budget.fact_relevance
        facts = [h.fact for h in layers.facts.search(query, user_id=user_id, k=FACT_CANDIDATES, type=None,
                                                      retrieval=retrieval, vector=vector)
                 if relevant_fact(h.fact.type, similarity(h.explanation), best_turn, bar)]
        episodes = [h.episode for h in layers.episodes.search(query, user_id=user_id, k=EPISODE_CANDIDATES,
                                                              retrieval=retrieval, vector=vector)]
    else:
        facts = sorted(layers.facts.select(user_id), key=lambda f: (-f.confidence, -f.updated_at))[:FACT_CANDIDATES]
        episodes = [e for e in reversed(layers.episodes.select(user_id)) if not said_nothing(e)][:EPISODE_CANDIDATES]
    fact_items = [_costed(ContextItem(id=f"fact:{f.id}", text=f.text, tokens=0, label=f.type), count)
                  for f in facts]
    ep_items = [_costed(ContextItem(id=f"ep:{e.id}", text=e.render(), tokens=0, timestamp=e.end, by_day=True), count)
                for e in episodes]  # the section's title says they are past sessions: no label
    shares = parts.config.budget.shares
    return ([SectionRequest(name=n, title=TITLES[n], items=items, share=shares.get(n, 0.0), priority=PRIORITY[n])
             for n, items in (("session", session), ("facts", fact_items), ("episodes", ep_items))],
            [Dropped(section="session", id=i.id, tokens=i.tokens, reason=FADED_REASON) for i in faded])


def session_buffer(parts: Parts, user_id: str, session_id: str,
                   shown: frozenset[str] = frozenset()) -> list[StoredMessage]:
    """The session's recent whole turns within the buffer's message and token limits, of its
    messages other than those the caller ``shown`` the model already: the turns before those."""
    buf = parts.config.buffer
    limit = buf.max_messages * 2 + len(shown)
    while True:
        fetched = parts.store.get_messages(user_id, session_id, limit=limit)
        msgs = [m for m in fetched if m.id not in shown]
        kept, _ = select_buffer(msgs, max_messages=buf.max_messages, max_tokens=buf.max_tokens,
                                count=parts.count_tokens)
        # every message fetched kept, the oldest no question: the newest turn (an agent's, with
        # its tool calls) began before them and is kept whole, so fetch back to its start
        if len(fetched) < limit or (msgs and (len(kept) < len(msgs) or msgs[0].role == "user")):
            return kept
        limit *= 2


def says_the_same(hit: MemoryHit, shown: StoredMessage) -> bool:
    """Whether a found turn says what a shown message says, in the same role, case, spacing and
    punctuation aside (pure): a near-duplicate in other words (another date) tells the model more."""
    return what_it_says(hit.role, hit.text) == what_it_says(shown.role, shown.content)


def what_it_says(role: str | None, text: str) -> tuple[str | None, tuple[str, ...]]:
    """A turn's role and words, case, spacing and punctuation aside (pure): two turns that say the
    same (:func:`says_the_same`) have the same."""
    return role, tuple(words(text.casefold()))


def what_is_said(text: str) -> tuple[str, ...] | str:
    """A text's words, case, spacing and punctuation aside, in any role (:func:`what_it_says` without
    one); a text of no words (an emoji), itself, stripped, so that it matches no other (pure)."""
    return what_it_says(None, text)[1] or text.strip()


def heard_texts(texts: Collection[str]) -> frozenset[tuple[str, ...] | str]:
    """What the texts a caller shows the model say (:func:`what_is_said`), in any role (pure): a stored
    turn saying one of them is shown already (``build_context``'s ``shown_texts``)."""
    return frozenset(what_is_said(t) for t in texts)


def shown_twins(store: RecordStore, user_id: str, shown: frozenset[str], hits: Sequence[MemoryHit],
                recent: Sequence[ContextItem] = ()) -> set[str]:
    """The ``hits`` that repeat a ``shown`` message or a ``recent`` turn (as the model is shown it):
    another id saying the same (:func:`says_the_same`), such as the same text stored again, or said
    again in this session. Decided on the text, not through the duplicates' original: the shown
    message and a found one may both be stored as duplicates of an original neither shown nor found
    (one the recent turns hold). One query, of the shown messages' texts, when there are hits; the
    recent turns' are at hand. All are the user's own: ``hits``, ``shown`` and ``recent`` of
    ``user_id`` alone."""
    if not hits or not (shown or recent):
        return set()
    said = {what_it_says(i.role, i.text) for i in recent}
    if shown:
        said |= {what_it_says(m.role, m.content) for m in store.get_by_ids(user_id, sorted(shown)).values()}
    return {h.id for h in hits if h.id not in shown and what_it_says(h.role, h.text) in said}


def fit_newest(item: ContextItem, buffer: list[StoredMessage], budget: int, count: Callable[[str], TokenCount],
               ) -> tuple[list[ContextItem], list[StoredMessage], list[Dropped]]:
    """The newest turn cut (with a marker) to fit the budget, or left out and reported. The cut
    is measured as the turn is shown, its head and quoting included: quoting lengthens some text
    (``<`` is written ``\\u003c``) far more than other, so no margin taken off the raw text fits both."""
    def shown(text: str) -> TokenCount:
        return item_cost(replace(item, text=text), count)

    limit = budget
    for _ in range(8):  # a cut may cost a token or two more than its search measured: shrink until it fits
        cut = cut_to_tokens(item.text, limit, shown) if limit > 0 else None
        if cut is None:
            break
        costed = replace(item, text=cut, tokens=shown(cut))
        if costed.tokens <= budget:
            message = next(m for m in buffer if m.id == item.id)
            return [costed], [replace(message, content=cut)], []
        limit -= math.ceil(costed.tokens - budget)  # a token budget: a count may be a float
    return [], [], [Dropped(section="recent", id=item.id, tokens=item.tokens,
                            reason="the newest turn is longer than the whole budget")]


def item_request(items: ItemStore, query: str, vector: np.ndarray, *, user_id: str,
                 count: Callable[[str], TokenCount], share: float) -> SectionRequest:
    """The ``items`` section: the user's LangGraph store items for the query, best first."""
    found = items.recall(query, user_id=user_id, k=ITEM_CANDIDATES, vector=vector)
    costed = [_costed(ContextItem(id=f"item:{h.item.id}", text=item_text(h.item), tokens=0, label="saved item",
                                  timestamp=h.item.updated_at, score=h.score), count) for h in found]
    return SectionRequest(name="items", title=TITLES["items"], items=costed, share=share, priority=PRIORITY["items"])


def turn_candidates(room: TokenCount, pool: int, left_out: int = 0) -> int:
    """How many turns to ask the search for (pure): as many short messages as ``room`` tokens
    hold, at least :data:`TURN_CANDIDATES`, and at most half the search's candidate ``pool``
    (``RetrievalConfig.candidates``), beyond which every search would fetch a bigger pool; plus
    two for each turn left out of the hits after the search (``left_out``: the recent buffer's and
    the ``shown`` messages), which may be among them with a twin that says the same
    (:func:`shown_twins`), so the turns kept fill the room as without them. As many again at most,
    and never beyond half the pool: a bigger pool changes the scores and order of the turns kept."""
    wanted = max(TURN_CANDIDATES, min(pool // 2, int(room // TURN_TOKENS)))  # a float count leaves a float room
    return wanted + min(2 * left_out, wanted, max(0, pool // 2 - wanted))


def best_kept(hits: Sequence[MemoryHit], wanted: int) -> list[MemoryHit]:
    """The first ``wanted`` of ``hits`` (those kept of a search asked for more, :func:`turn_candidates`),
    in their order (pure): as the search would have returned without the turns left out. The best
    turns of sessions not yet among the hits (``explanation["spread"]``, which the search puts last)
    are kept; the others past ``wanted`` are trimmed, the lowest ranked first."""
    extra = len(hits) - max(0, wanted)
    ranked = [n for n, h in enumerate(hits) if "spread" not in h.explanation]
    if extra <= 0:
        return list(hits)
    if extra > len(ranked):
        return list(hits[:wanted])
    trimmed = set(ranked[-extra:])
    return [h for n, h in enumerate(hits) if n not in trimmed]


def recent_room(budget: int, buffer_share: float) -> int:
    """The tokens the recent turns may take of ``budget`` (pure): ``buffer_share`` of it, and
    never more than all of it (a share over 1, which the config accepts, would let the recent
    turns alone pass the budget)."""
    return int(budget * min(max(buffer_share, 0.0), 1.0))


def fit(requests: list[SectionRequest], room: TokenCount, count: Callable[[str], TokenCount],
        ) -> tuple[list[Section], list[Dropped]]:
    """``requests`` fitted into ``room`` tokens of rendered memory, the frame (preamble, tags,
    headings) included (pure)."""
    sections, lost = fit_sections(requests, max(0, room - frame_tokens(requests, count)))
    shown = [r for r in requests if any(s.name == r.name and s.items for s in sections)]
    if len(shown) < len([r for r in requests if r.items]):  # tags kept for sections left empty: fit again
        sections, lost = fit_sections(requests, max(0, room - frame_tokens(shown, count)))
    sections, cut = within_budget(sections, room, count)
    return sections, lost + cut


def without_repeats(requests: list[SectionRequest], room: TokenCount, count: Callable[[str], TokenCount],
                    ) -> tuple[list[SectionRequest], dict[str, str]]:
    """``requests`` without the past turns that a fact or episode the fit will keep already
    quotes (:func:`repeated_turns`), so their room goes to other turns, and those turns, with
    the id of the item that quotes each (pure). The kept items come from a first
    :func:`fit_sections`: turns, last in priority, never change which of the others fit."""
    turns = next((r for r in requests if r.name == "turns" and r.items), None)
    if turns is None:
        return requests, {}
    first, _ = fit_sections(requests, max(0, room - frame_tokens(requests, count)))
    holders = [i for s in first if s.name != "turns" for i in s.items]
    said = repeated_turns(turns.items, holders) if holders else {}
    if not said:
        return requests, {}
    return [replace(r, items=[i for i in r.items if i.id not in said]) if r is turns else r for r in requests], said


def assemble(parts: Parts, layers: Layers | None, query: str, *, user_id: str, session_id: str,
             max_tokens: int | None, items: ItemStore | None = None,
             shown: frozenset[str] = frozenset(), include_recent: bool = True,
             shown_texts: frozenset[str] = frozenset()) -> MemoryContext:
    budget = max_tokens if max_tokens is not None else parts.config.budget.max_tokens
    count = parts.count_tokens
    # without a recent section (a caller that shows only memory_text) the session's turns not shown
    # are past turns to recall like any other, and the whole budget goes to the sections
    heard = heard_texts(shown_texts)
    buffer = session_buffer(parts, user_id, session_id, shown) if include_recent else []
    recent, over = newest_within([message_item(m, count) for m in buffer], lambda i: i.tokens,
                                 room=recent_room(budget, parts.config.budget.buffer_share), whole=budget)
    # the session's buffer is the conversation itself, reported under "recent" when left out: never
    # a past turn to recall, not even once the newest turn is cut or left out below. When the caller
    # shows its own messages (the conversation), the buffer only leads into them: the turns over its
    # share are past turns like any other, and the caller's messages take no room at all
    dropped = [] if shown else [Dropped(section="recent", id=old.id, tokens=old.tokens,
                                        reason="buffer over its share") for old in over]
    left_out = {m.id for m in buffer} - ({i.id for i in over} if shown else set()) | shown
    if recent and recent[0].tokens > budget:  # the newest turn alone is longer than the whole budget
        recent, buffer, lost = fit_newest(recent[0], buffer, budget, count)
        dropped += lost
    if heard:  # chosen with their turns (an answer keeps its place), then left out: the caller shows them
        recent = [i for i in recent if what_is_said(i.text) not in heard]
    vector = embed_query(parts.embedder, query) if query.strip() else None
    used = sum(i.tokens for i in recent)
    # the budget holds the rendered memory (its preamble, block tags and headings too) and the recent turns
    room = max(0, budget - used)
    retrieval = parts.config.retrieval
    # asked for more by as many as may be left out of the hits below, so that as many are kept
    hits = search_turns(store=parts.store, index=parts.index, embedder=parts.embedder, config=retrieval,
                        query=query, user_id=user_id,
                        k=turn_candidates(room, retrieval.candidates, len(left_out) + len(heard)),
                        vector=vector) if vector is not None else []
    # a shown message's twin (the same text stored again, another id) is shown too, and so is a recent turn's
    left_out |= shown_twins(parts.store, user_id, shown, [h for h in hits if h.id not in left_out], recent)
    left_out |= {h.id for h in hits if heard and what_is_said(h.text) in heard}
    past = best_kept([h for h in hits if h.id not in left_out], turn_candidates(room, retrieval.candidates))
    turns = [hit_item(h, count) for h in past]
    # the bar facts are held to: the past turns', not the session's own (the question just stored is 1)
    best_turn = max((x for x in (similarity(h.explanation) for h in past) if x is not None), default=None)
    requests, faded = layer_requests(layers, query, vector, user_id=user_id, session_id=session_id,
                                     count=count, best_turn=best_turn) if layers is not None else ([], [])
    dropped += faded
    if items is not None and vector is not None:
        requests.append(item_request(items, query, vector, user_id=user_id, count=count,
                                     share=parts.config.budget.shares.get("items", ITEM_SHARE)))
    requests.append(SectionRequest(name="turns", title=TITLES["turns"], items=turns,
                                   share=parts.config.budget.shares.get("turns", 0.0), priority=PRIORITY["turns"]))
    pruned, said = without_repeats(requests, room, count)
    sections, lost = fit(pruned, room, count)
    if said and not set(said.values()) <= {i.id for s in sections for i in s.items}:
        sections, lost = fit(requests, room, count)  # a quoting item was cut after all: show the turns
        said = {}
    dropped += [Dropped(section=d.section, id=d.id, tokens=d.tokens,
                        reason=f"over budget: lower-priority '{d.section}' truncated first") for d in lost]
    dropped += [Dropped(section="turns", id=i.id, tokens=i.tokens, reason=f"{REPEAT_REASON} '{said[i.id]}'")
                for i in turns if i.id in said]
    kept = {i.id for i in recent}
    return MemoryContext(sections=sections, recent=recent, dropped=dropped, max_tokens=budget,
                         recent_messages=[m for m in buffer if m.id in kept])


# each section's layer (store items are not access-counted); an item id is "fact:<id>",
# "ep:<id>" or "wm:<id>" in these, a turn's own id in "turns", which may itself hold a colon
_SECTION_LAYER: dict[str, AccessLayer] = {"facts": "fact", "episodes": "episode", "session": "working",
                                          "turns": "turn"}


def accessed(context: MemoryContext) -> dict[AccessLayer, list[str]]:
    """The ids of what ``context`` hands to a model, by layer, read from the section each item
    is in (a message id may look like another layer's, such as ``"wm:1"``); the recent buffer is
    the conversation itself, not a recall, and is not counted."""
    out: dict[AccessLayer, list[str]] = {}
    for section in context.sections:
        layer = _SECTION_LAYER.get(section.name)
        if layer is None:
            continue
        for item in section.items:
            out.setdefault(layer, []).append(item.id if layer == "turn" else item.id.partition(":")[2])
    return out
