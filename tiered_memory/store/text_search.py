"""Keyword queries in each engine's own syntax, from the plain terms recall passes (pure),
and SQLite's same-text lookup for the near-duplicate check (given the store's ``query``).

Recall hands the stores a list of keywords; no query syntax crosses the protocol, so a
stored or typed word can never be read as an operator by either engine.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

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


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def text_key(text: str) -> str:
    """``lower(trim(text))`` as SQLite computes it (ASCII case, spaces at the ends) (pure)."""
    return text.strip(" ").translate(_ASCII_LOWER)


def same_text_sqlite(query: Callable[[str, Sequence[Any]], list[tuple[Any, ...]]], user_id: str,
                     texts: Sequence[str]) -> dict[str, str]:
    """SQLite's ``same_text``: one range of the ``messages_user_text`` index per 500 texts."""
    wanted = sorted({text_key(t) for t in texts})
    found: dict[str, str] = {}
    for start in range(0, len(wanted), 500):
        part = wanted[start:start + 500]
        for mid, key in query(
                "SELECT id, lower(trim(content)) FROM messages INDEXED BY messages_user_text WHERE user_id=?"
                f" AND lower(trim(content)) IN ({','.join('?' * len(part))}) AND indexed=1"
                " AND duplicate_of IS NULL ORDER BY rowid", [user_id, *part]):
            found.setdefault(key, mid)
    return {t: found[text_key(t)] for t in texts if text_key(t) in found}


#: Below this many rows of one user, keyword search reads that user's rows through the
#: b-tree on ``user_id`` and matches each; at or above it, through the GIN index on the
#: ``tsvector``. The GIN index holds every user's rows, so for a common term it returns
#: the matches of the whole store and only then drops other users' (measured: a
#: 100-memory user's search cost ~275 ms of record-store time in a 1,000,000-memory
#: store, bench/README.md). A user's own rows are cheap to match until there are many.
USER_SCAN_ROWS = 20_000


def scan_user_rows(rows: int, threshold: int = USER_SCAN_ROWS) -> bool:
    """Whether a keyword search should start from the user's ``rows`` rows (pure): true
    below ``threshold``. ``rows`` may be counted only up to ``threshold`` (a bounded count)."""
    return rows < threshold
