"""Text every store can hold, made so rather than refused (pure).

The core refuses a message or a value holding what no store keeps (NUL characters, lone
surrogates) or a text over ``MemoryConfig.max_content_chars``
(:mod:`~tiered_memory.validation`). What arrives as a side effect of another call (a model's
JSON answer, a turn an adapter records after the model answered) is repaired here instead:
:func:`clean_strings` for decoded JSON, :func:`storable_text` for a message's text, which
also says what it changed. Invariant: what comes back passes the core's checks, and what
already passed comes back unchanged.
"""

from __future__ import annotations

from typing import Any

from .graphemes import cut_point
from .quoting import map_strings

#: ends a text cut short: a stored text cut to ``max_content_chars``, an item cut to its budget
CUT_MARKER = " [... cut: the rest did not fit the token budget]"


def _storable(text: str) -> str:
    text = text.replace("\x00", "")
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def clean_strings(value: Any) -> Any:
    """``value`` (decoded JSON) with every string made storable text: NUL characters (which
    JSON may spell ``\\u0000`` and PostgreSQL cannot store) removed and lone surrogates
    replaced, as no store holds them; pure."""
    return map_strings(value, _storable)


def storable_text(text: str, max_chars: int | None = None) -> tuple[str, list[str]]:
    """``text`` as the core can store it, and what had to change (pure).

    NUL characters are removed and lone surrogates replaced (no store holds them); a text
    longer than ``max_chars`` (the core's ``MemoryConfig.max_content_chars``; ``None``: no
    limit) keeps its head, cut between two characters as a reader sees them (never inside an
    emoji or an accented letter: :func:`~tiered_memory.graphemes.cut_point`), and ends with
    :data:`CUT_MARKER`, so the result is never longer than ``max_chars``. A text the core
    accepts comes back unchanged, with no changes listed. The result may be blank (a text of
    NULs): the caller decides what a blank message becomes.

    Example:
        >>> storable_text("a\\x00b")
        ('ab', ['removed NUL characters'])
    """
    changes: list[str] = []
    if "\x00" in text:
        changes.append("removed NUL characters")
    clean: str = clean_strings(text)
    if clean != text.replace("\x00", ""):
        changes.append("replaced lone surrogates")
    if max_chars is not None and len(clean) > max_chars:
        changes.append(f"cut from {len(clean):,} to {max_chars:,} characters")
        keep = max_chars - len(CUT_MARKER)
        clean = clean[:cut_point(clean, keep)] + CUT_MARKER if keep > 0 else clean[:cut_point(clean, max_chars)]
    return clean, changes
