"""The token-aware buffer of recent turns (pure)."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from ..types import StoredMessage

M = TypeVar("M", bound=StoredMessage)


def group_turns(messages: Sequence[M]) -> list[list[M]]:
    """Split into turns: a turn starts at each user message and holds what follows it."""
    turns: list[list[M]] = []
    for m in messages:
        if m.role == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return turns


def select_buffer(
    messages: Sequence[M], *, max_messages: int, max_tokens: int, count: Callable[[str], int]
) -> tuple[list[M], list[M]]:
    """Keep the newest whole turns within both limits; return (kept, evicted).

    The newest turn is kept even when it alone exceeds a limit, so the buffer is
    never empty while the session has messages.
    """
    turns = group_turns(messages)
    kept: list[list[M]] = []
    n_msgs = n_tokens = 0
    for turn in reversed(turns):
        t_tokens = sum(count(m.content) for m in turn)
        if kept and (n_msgs + len(turn) > max_messages or n_tokens + t_tokens > max_tokens):
            break
        kept.append(turn)
        n_msgs += len(turn)
        n_tokens += t_tokens
    kept_flat = [m for turn in reversed(kept) for m in turn]
    evicted = list(messages[: len(messages) - len(kept_flat)])
    return kept_flat, evicted
