"""Secrets kept out of what an error says: a password or an API key masked in our messages and in
the errors chained below them, which every logged traceback prints too ("The above exception was
the direct cause of the following exception").

A secret is masked in each form an error may quote it in: as given, escaped the way ``repr``
escapes it as a string or as bytes (h11 quotes a refused header as ``b'key\\n'``), and
percent-encoded or decoded (as it sits in a URL). White space at its ends is left to see: it is
often the mistake the error is about (a key read from a file with its line end).

Invariants: the functions are pure (:class:`RememberedTokens` keeps what a token provider returned,
calling it once a call, no more); an error whose chain quotes no secret is chained as it is
(its type and attributes stay there for callers), one that quotes a secret is replaced by
:class:`MaskedError` stand-ins that name each original type and keep each traceback (which shows
source lines, not values).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import quote, unquote

MASK = "***"


class RememberedTokens:
    """A token provider (``auth_token_provider=`` of a client: a fresh bearer token before each
    request), wrapped: each call calls it once and returns what it returns, and the last ``keep``
    different tokens are remembered, to mask (iterating gives them, the newest last)."""

    def __init__(self, provider: Callable[[], Any], keep: int = 16) -> None:
        self.provider = provider
        self._tokens: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        token = self.provider()
        if isinstance(token, str):
            with self._lock:
                if token not in self._tokens:
                    self._tokens.append(token)
        return token

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(tuple(self._tokens))


class MaskedError(Exception):
    """Stands in, in a chain of errors, for a backend's error whose text quoted a secret: its text
    is ``module.Type: the original text, masked``, its traceback the original's."""


def _forms(secret: str) -> set[str]:
    """The forms a message may quote ``secret`` in, without the white space at its ends."""
    core = secret.strip()
    if not core:
        return set()
    found = {form for plain in (core, unquote(core))
             for form in (plain, repr(plain)[1:-1], repr(plain.encode("utf-8", "backslashreplace"))[2:-1],
                          quote(plain, safe=""))}
    return {f for f in found if f.strip()}


def mask(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with each of ``secrets`` (``None`` and empty ones skipped), in each form an error
    may quote it, replaced by ``***``; the longest first, so no piece of a secret is left."""
    for form in sorted({f for s in secrets if s for f in _forms(s)}, key=len, reverse=True):
        text = text.replace(form, MASK)
    return text


def _text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # as traceback prints it
        return "<exception str() failed>"


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors a traceback prints below it, in that order."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def masked_cause(error: BaseException, secrets: Iterable[str | None]) -> BaseException:
    """What to chain our error to (``raise ... from masked_cause(e, secrets)``): ``error`` itself
    when neither it nor any error chained below it quotes one of ``secrets``; else the chain
    again as :class:`MaskedError` stand-ins, each with its original's type, masked text, notes
    and traceback, linked as the originals were (a cause, or an error raised while handling)."""
    secrets = [s for s in secrets if s]
    chain = _chain(error)
    texts = [[_text(e), *map(str, getattr(e, "__notes__", ()))] for e in chain]
    if all(mask(t, secrets) == t for lines in texts for t in lines):
        return error
    stand_ins = []
    for original, (text, *notes) in zip(chain, texts):
        kind = type(original)
        stand_in = MaskedError(f"{kind.__module__}.{kind.__qualname__}: {mask(text, secrets)}")
        if notes:  # (add_note is Python 3.11's)
            stand_in.__notes__ = [mask(note, secrets) for note in notes]
        stand_ins.append(stand_in.with_traceback(original.__traceback__))
    for original, above, below in zip(chain, stand_ins, stand_ins[1:]):
        if original.__cause__ is not None:
            above.__cause__ = below
        else:
            above.__context__ = below
    return stand_ins[0]
