"""The pure rules of namespaced items (:mod:`.items`): their records, namespaces and how
they match, the vector id of each part of an item's text, TTLs, and the order of search
results. No I/O: each is a function with table tests (``tests/test_items.py``).

Items whose namespace maps to no user belong to :data:`SHARED_OWNER`, a control
character apart from every real user id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import InvalidInputError
from ..records import Item
from ..store.repositories import ItemCursor
from ..validation import check_id, check_storable

LAYER = "item"
#: the owner of items whose namespace maps to no user: a control character keeps it apart
#: from every real user id (``check_id`` refuses those), so no user can claim or forget it
SHARED_OWNER = "\x01shared"


def check_owner(user_id: object) -> str:
    """A user id, or :data:`SHARED_OWNER`."""
    return SHARED_OWNER if user_id == SHARED_OWNER else check_id(user_id, "user_id")


@dataclass(frozen=True, kw_only=True)
class ItemHit:
    """A search result; ``score`` is ``None`` for items listed without ranking."""

    item: Item
    score: float | None
    explanation: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ItemWrite:
    """A put (``value`` set) or a delete (``value`` is ``None``) of one item."""

    namespace: tuple[str, ...]
    key: str
    user_id: str
    value: Mapping[str, Any] | None
    text: str | None = None
    #: minutes until the item expires (restarted by refreshing reads); ``None``: never
    ttl_minutes: float | None = None


def check_key(key: object) -> str:
    """An item key: a non-empty str that storage can hold (no NUL, no lone surrogates)."""
    return check_storable(key, "item key", blank=True)


def check_namespace(namespace: object, *, allow_empty: bool = False) -> tuple[str, ...]:
    """A namespace is a tuple of non-empty labels. Any character but NUL (which no
    record store can keep in text) is allowed, as in LangGraph: ``*`` and ``.`` are
    plain characters in a label (``*`` is a wildcard only in ``list_namespaces``
    match patterns, as LangGraph defines)."""
    if not isinstance(namespace, (tuple, list)):
        raise InvalidInputError(f"namespace must be a tuple of str, got {type(namespace).__name__}")
    if not namespace and not allow_empty:
        raise InvalidInputError("namespace must have at least one label")
    return tuple(check_storable(label, "namespace label", blank=True) for label in namespace)


def match_namespace(namespace: Sequence[str], pattern: Sequence[str], kind: str,
                    exact_at: int | None = None) -> bool:
    """``kind`` is ``"prefix"`` or ``"suffix"``; ``"*"`` in ``pattern`` matches any label,
    except where it falls on namespace position ``exact_at`` (the user's label), where it
    is matched literally, so a user id ``"*"`` never lists other users' namespaces."""
    if len(namespace) < len(pattern):
        return False
    if kind == "prefix":
        start = 0
    elif kind == "suffix":
        start = len(namespace) - len(pattern)
    else:
        raise InvalidInputError(f"namespace match must be 'prefix' or 'suffix', got {kind!r}")
    return all((p == "*" and start + j != exact_at) or namespace[start + j] == p
               for j, p in enumerate(pattern))


#: separates the field texts inside an item's ``text``: one vector per part
FIELD_SEP = "\x1e"
MAX_PARTS = 16


def text_parts(text: str) -> list[str]:
    """The separately embedded parts of an item's text (pure): its field texts, at most
    :data:`MAX_PARTS` (the rest joined into the last). A text without :data:`FIELD_SEP`
    (every item written before per-field vectors) is one part."""
    parts = [t for t in text.split(FIELD_SEP) if t.strip()] or [text]
    if len(parts) > MAX_PARTS:
        parts = parts[:MAX_PARTS - 1] + ["\n".join(parts[MAX_PARTS - 1:])]
    return parts


def vector_id(item_id: str, part: int) -> str:
    """The vector id of one part of an item (part 0 keeps the id items always had)."""
    return f"item:{item_id}" if part == 0 else f"item:{item_id}#{part}"


def item_of_vector(vid: str) -> str:
    """The item id a vector id belongs to (pure)."""
    return vid.removeprefix("item:").split("#", 1)[0]


def check_ttl(ttl_minutes: object, name: str = "ttl") -> float | None:
    """A TTL in minutes (or an interval, which the error calls ``name``): a finite number > 0,
    or ``None`` (never expires)."""
    if ttl_minutes is None:
        return None
    if (isinstance(ttl_minutes, bool) or not isinstance(ttl_minutes, (int, float))
            or not math.isfinite(ttl_minutes) or ttl_minutes <= 0):
        raise InvalidInputError(f"{name} must be a number of minutes > 0, or None, got {ttl_minutes!r}")
    return float(ttl_minutes)


def expiry(ttl_minutes: float | None, now: float) -> float | None:
    """When an item written at ``now`` with this TTL expires (pure)."""
    return None if ttl_minutes is None else now + ttl_minutes * 60.0


def best_parts(scored: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Vector hits as (item id, its best part's similarity), best first (pure)."""
    best: dict[str, float] = {}
    for vid, score in scored:
        item = item_of_vector(vid)
        if item not in best or score > best[item]:
            best[item] = score
    return sorted(best.items(), key=lambda p: -p[1])


def rank_by_similarity(similarity: Mapping[str, float], keyword_rank: Mapping[str, int],
                       updated_at: Mapping[str, float]) -> list[str]:
    """Ids best first: by similarity, ties broken by keyword rank, then the newest (pure)."""
    return sorted(similarity, key=lambda i: (-similarity[i], keyword_rank.get(i, len(keyword_rank)),
                                             -updated_at.get(i, 0.0), i))


def truncate_namespaces(namespaces: Sequence[tuple[str, ...]], max_depth: int | None) -> list[tuple[str, ...]]:
    """Distinct namespaces (cut to ``max_depth`` labels), sorted."""
    cut = {ns[:max_depth] if max_depth is not None else ns for ns in namespaces}
    return sorted(cut)


#: the fewest and the most rows one read of a listing asks for (:func:`page_of`)
PAGE_MIN, PAGE_MAX = 10, 1000


def page_of(read: Callable[[ItemCursor | None, int], Sequence[tuple[Item, ItemCursor]]],
            keep: Callable[[Item], bool], *, limit: int, offset: int) -> list[Item]:
    """The page ``[offset, offset + limit)`` of the items ``keep`` says yes to, in the order
    ``read`` gives them, read a bounded page at a time (pure but for ``read``).

    ``read(after, n)`` returns up to ``n`` items past the cursor ``after`` (``None``: from the
    start), each with its cursor; fewer than ``n`` means there are no more. The first read asks
    for ``offset + limit`` rows (all it takes when every item is kept, as in LangGraph's SQL
    ``LIMIT``/``OFFSET``), each later one for twice as many as the one before, within
    :data:`PAGE_MIN` and :data:`PAGE_MAX`; reading stops once the page is full, so a page of a
    large prefix reads the rows up to it, never the whole prefix."""
    if limit <= 0:
        return []
    kept: list[Item] = []
    skip, after, size = offset, None, min(max(offset + limit, PAGE_MIN), PAGE_MAX)
    while True:
        rows = read(after, size)
        for item, _ in rows:
            if not keep(item):
                continue
            if skip:
                skip -= 1
                continue
            kept.append(item)
            if len(kept) == limit:
                return kept
        if len(rows) < size:
            return kept
        after, size = rows[-1][1], min(size * 2, PAGE_MAX)
