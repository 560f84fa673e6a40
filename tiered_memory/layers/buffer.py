"""The token-aware buffer of recent turns (pure)."""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, TypeVar

from ..tokens import TokenCount
from ..types import StoredMessage


class Said(Protocol):
    """A message, or an item shown for one: a ``"user"`` role starts a turn."""

    @property
    def role(self) -> str | None: ...


S = TypeVar("S", bound=Said)
M = TypeVar("M", bound=StoredMessage)


def group_turns(messages: Sequence[S]) -> list[list[S]]:
    """Split into turns: a turn starts at each user message and holds what follows it."""
    turns: list[list[S]] = []
    for m in messages:
        if m.role == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def newest_turns(items: Sequence[S], cost: Callable[[S], TokenCount], *, max_cost: TokenCount,
                 max_items: int | None = None) -> list[S]:
    """The newest whole turns of ``items`` (oldest first, and so returned) whose costs add up to at
    most ``max_cost`` and that hold at most ``max_items`` items; the newest turn even when it alone
    is over either (pure)."""
    kept: list[list[S]] = []
    n_items = 0
    spent: TokenCount = 0
    for turn in reversed(group_turns(items)):
        tokens = sum(cost(i) for i in turn)
        if kept and (spent + tokens > max_cost or (max_items is not None and n_items + len(turn) > max_items)):
            break
        kept.append(turn)
        n_items += len(turn)
        spent += tokens
    return [i for turn in reversed(kept) for i in turn]


def select_buffer(
    messages: Sequence[M], *, max_messages: int, max_tokens: int, count: Callable[[str], TokenCount]
) -> tuple[list[M], list[M]]:
    """Keep the newest whole turns within both limits; return (kept, evicted).

    The newest turn is kept even when it alone exceeds a limit, so the buffer is
    never empty while the session has messages.
    """
    kept = newest_turns(messages, lambda m: count(m.content), max_cost=max_tokens, max_items=max_messages)
    return kept, list(messages[: len(messages) - len(kept)])


def newest_within(items: Sequence[S], cost: Callable[[S], TokenCount], *, room: int, whole: int,
                  ) -> tuple[list[S], list[S]]:
    """(kept, left out) of ``items`` (oldest first) for a context (pure): the newest whole turns
    whose costs add up to at most ``room``, and the newest turn even over ``room`` when it costs
    at most ``whole`` (the whole budget, ``room`` being the recent turns' share of it). A newest
    turn over ``whole`` too keeps its newest messages that fit it, at least its last one, which
    the caller cuts when it alone is over. Only then is an answer kept without its question:
    a chat model would otherwise get a conversation that opens with its own reply."""
    kept = newest_turns(items, cost, max_cost=room)
    spent = sum(cost(i) for i in kept)
    while len(kept) > 1 and spent > whole:  # the newest turn alone: more turns would be within room
        spent -= cost(kept.pop(0))
    return kept, list(items[: len(items) - len(kept)])
