"""Long messages found by their parts: where a message is cut into chunks, and how a
chunk's vector id points back to its message. Pure functions.

One vector for an assistant answer of thousands of characters is the mean of everything
in it, so the paragraph that answers a question hardly moves it. A message longer than
:data:`CHUNK_OVER` characters is therefore indexed twice over: its own vector (id = the
message id, layer ``turn``) and one vector per chunk (id ``<message id>\\x1f<n>``, layer
``chunk``), each chunk about :data:`CHUNK_SIZE` characters, cut at a sentence or word
end, overlapping the one before by about :data:`CHUNK_OVERLAP`. A message never has more
than :data:`MAX_CHUNKS` chunks (longer ones get longer chunks), so deleting a message's
vectors needs no lookup: :func:`vector_ids` names every id it may have.

A long message's own vector is not embedded from its whole text: it is the unit
length-weighted mean of its chunks' vectors (:func:`pooled_vector`), so each character goes
through the embedder once (the bundled embedders' vector of a long text is a mean of its
parts' vectors anyway). Every path that indexes a message (``add_many``, repair,
``rebuild_index``, ``import_jsonl``) computes it this one way, so a rebuild gives the same
vectors.

Invariants: the record store keeps the whole message and is the only source; chunks are
derived (``rebuild_index`` and repair re-chunk from the stored text); a chunk hit stands
for its message, which must still be in the record store for the user.
"""

from __future__ import annotations

from typing import Collection, Sequence

import numpy as np

from ..store.base import LONG_MESSAGE_CHARS
from ..vector.base import CHUNK_SEPARATOR
from .query import SENTENCE_BREAK

CHUNK_OVER = LONG_MESSAGE_CHARS  # characters: longer messages are also indexed by their chunks
CHUNK_SIZE = 700
CHUNK_OVERLAP = 150
MAX_CHUNKS = 64
CHUNK_LAYER = "chunk"
SEPARATOR = CHUNK_SEPARATOR  # ids never hold control characters (check_id): a chunk id names one message


def chunk_spans(text: str, *, over: int = CHUNK_OVER, size: int = CHUNK_SIZE, overlap: int = CHUNK_OVERLAP,
                max_chunks: int = MAX_CHUNKS) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the chunks of ``text``; ``[]`` when it is short.

    Each chunk ends at the last sentence end (else whitespace) inside its window, when one
    lies past the window's middle; the next starts ``overlap`` characters before that end,
    moved forward to a word start. Spans cover the whole text, in order.
    """
    n = len(text)
    if n <= over:
        return []
    size = max(size, -(-n // max_chunks) + overlap)  # never more than max_chunks
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n:
        end = min(n, start + size)
        if end < n:
            window = text[start:end]
            breaks = [m.end() for m in SENTENCE_BREAK.finditer(window) if m.end() > size // 2]
            if breaks:
                end = start + breaks[-1]
            else:
                space = window.rfind(" ", size // 2)
                if space > 0:
                    end = start + space + 1
        spans.append((start, end))
        if end >= n or len(spans) == max_chunks:
            if end < n:  # the last chunk takes the rest
                spans[-1] = (start, n)
            break
        nxt = max(start + 1, end - overlap)
        while 0 < nxt < end and not text[nxt - 1].isspace():
            nxt += 1  # start at a word
        start = nxt if nxt < end else end
    return spans


def pooled_vector(chunk_vectors: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """A long message's own vector from its chunks' unit vectors (pure): their mean weighted
    by each chunk's length in characters, of unit length (a zero sum stays zero)."""
    weights = np.asarray([end - start for start, end in spans], dtype=np.float32)
    total = weights @ np.asarray(chunk_vectors, dtype=np.float32)
    norm = float(np.linalg.norm(total))
    pooled: np.ndarray = (total / norm if norm else total).astype(np.float32)
    return pooled


def chunk_id(message_id: str, n: int) -> str:
    return f"{message_id}{SEPARATOR}{n}"


def message_of(vector_id: str) -> tuple[str, int | None]:
    """``"m1\\x1f3"`` -> ``("m1", 3)``; a whole-message id -> ``(id, None)``."""
    head, sep, tail = vector_id.partition(SEPARATOR)
    if sep and tail.isdigit():
        return head, int(tail)
    return vector_id, None


def vector_ids(message_ids: Sequence[str], long: Collection[str] | None = None) -> list[str]:
    """Every vector id the messages may have: their own and all possible chunk ids (only for
    the ids in ``long``, when the caller knows which messages are over :data:`CHUNK_OVER`)."""
    return [v for m in message_ids
            for v in (m, *(chunk_id(m, n) for n in range(MAX_CHUNKS) if long is None or m in long))]


def best_chunks(chunk_hits: Sequence[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    """From chunk vector hits (best first), each message's best chunk and its similarity."""
    out: dict[str, tuple[int, float]] = {}
    for vid, sim in chunk_hits:
        message, n = message_of(vid)
        if n is not None and (message not in out or sim > out[message][1]):
            out[message] = (n, sim)
    return out


def best_span_by_terms(text: str, terms: Sequence[str]) -> int | None:
    """The chunk of a long ``text`` that holds most of ``terms`` (lower-cased substrings);
    None when the text is not chunked or holds none of them."""
    spans = chunk_spans(text)
    if not spans or not terms:
        return None
    low = text.lower()
    counts = [sum(low.count(t, s, e) for t in terms) for s, e in spans]
    best = max(range(len(spans)), key=lambda i: (counts[i], -i))
    return best if counts[best] else None
