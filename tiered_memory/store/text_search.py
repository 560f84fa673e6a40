"""Keyword queries in each engine's own syntax, from the plain terms recall passes (pure).

Recall hands the stores a list of keywords; no query syntax crosses the protocol, so a
stored or typed word can never be read as an operator by either engine.
"""

from __future__ import annotations

import re
from typing import Sequence

_NON_WORD = re.compile(r"[^\w]+", re.UNICODE)


def fts5_any(terms: Sequence[str]) -> str | None:
    """An FTS5 expression OR-ing the terms, each a quoted string (``"a" OR "b"``)."""
    terms = [terms] if isinstance(terms, str) else terms  # one term, not its characters
    quoted = ['"' + t.replace('"', '""') + '"' for t in dict.fromkeys(terms) if t.strip()]
    return " OR ".join(quoted) if quoted else None


def tsquery_any(terms: Sequence[str]) -> str | None:
    """A ``to_tsquery`` expression OR-ing the terms (``a | b``); only word characters
    survive, so the result is always valid tsquery syntax."""
    terms = [terms] if isinstance(terms, str) else terms
    words: list[str] = []
    for t in terms:
        for w in _NON_WORD.split(t):
            if w and w not in words:
                words.append(w)
    return " | ".join(words) if words else None
