"""The vector index protocol. Implementations: Chroma (default), Qdrant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

# a chunk of a long message is indexed as "<message id>" + CHUNK_SEPARATOR + "<n>"
# (recall/chunking.py); ids never hold control characters, so it is unambiguous
CHUNK_SEPARATOR = "\x1f"
#: every layer a vector may belong to (a user-wide filter of an engine that keys layers into
#: its user field, as Chroma's does, lists them all)
LAYERS = ("turn", "chunk", "episode", "fact", "item")


def shown_url(url: str) -> str:
    """``url`` as an error message may show it: scheme, host, port and path, without any
    user, password or query (where an API key could sit) (pure)."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(url)
        port = f":{u.port}" if u.port is not None else ""
    except ValueError:
        return "<an unreadable URL>"
    return f"{u.scheme}://{u.hostname or ''}{port}{u.path}"


def dimension_hint(error: Exception, collection: str, width: int, held: Callable[[], int | None]) -> str:
    """What to do when ``error`` says ``collection`` holds vectors of another width than the
    embedder's ``width`` (``held()`` reads the collection's, once, on this failure only); ''
    for any other error."""
    if "dimension" not in str(error).lower():
        return ""
    try:
        have = held()
    except Exception:
        return ""
    if have is None or have == width:
        return ""
    return (f"; the collection {collection!r} holds {have}-dimensional vectors and the embedder gives {width}: "
            "open it with the embedder that wrote it, use another collection, or call rebuild_index() to drop "
            "the collection and re-embed the records into it")


def refuse_bad_vectors(items: Sequence["VectorItem"]) -> None:
    """Raise ``VectorIndexError`` before anything of ``items`` is written when a vector holds
    NaN or infinity, or the batch mixes widths (pure): an engine refuses some of them itself
    (pgvector, Chroma) but only part of a batch written in parts, and Qdrant stores an
    infinity, whose cosine then tops every search."""
    from ..errors import VectorIndexError

    widths = {len(i.vector) for i in items}
    if len(widths) > 1:
        raise VectorIndexError(f"one upsert holds vectors of {len(widths)} widths ({sorted(widths)}): "
                               "every vector of an index comes from one embedder; nothing was written")
    if not items:
        return
    with np.errstate(over="ignore"):  # a float64 past float32's range is an infinity to every engine
        bad = ~np.isfinite(np.asarray([i.vector for i in items], dtype=np.float32)).all(axis=1)
    if bad.any():
        first = items[int(np.argmax(bad))].id
        raise VectorIndexError(f"the vector of {first!r} is not finite (it holds NaN or infinity): the "
                               "embedder returned a broken vector; nothing was written")


def refuse_bad_queries(vectors: np.ndarray) -> None:
    """Raise ``VectorIndexError`` when a query vector holds NaN or infinity (pure): engines
    answered one with nothing (embedded Chroma, a user Qdrant holds in memory) or with an
    error of their own wording, so a broken query embedding looked like an empty memory."""
    from ..errors import VectorIndexError

    if not np.all(np.isfinite(np.asarray(vectors, dtype=np.float64))):
        raise VectorIndexError("a query vector is not finite (it holds NaN or infinity): the embedder "
                               "returned a broken vector for the query")


@dataclass(frozen=True, kw_only=True)
class VectorItem:
    id: str
    vector: Sequence[float]
    user_id: str
    layer: str = "turn"
    session_id: str = ""
    timestamp: float = 0.0


class VectorIndex(Protocol):
    """Cosine-similarity index of unit vectors, filtered by user (and optionally layer, session)."""

    def upsert(self, items: list[VectorItem]) -> None: ...

    def query(
        self, vectors: np.ndarray, *, user_id: str, k: int,
        layers: Sequence[str] | None = None, session_id: str | None = None,
        among: Sequence[str] | None = None,
    ) -> list[list[tuple[str, float]]]:
        """For each row of ``vectors``, up to ``k`` (id, cosine similarity), best first.

        ``among``: search only these ids. The caller has scoped them already (the user's
        indexed turns, from the record store, which stays the authority on ownership);
        an index may then skip its costly metadata filter, which is what makes it fast, but
        still returns none of another user's (or layer's) vectors: the ids only narrow. An index
        whose user filter costs no more than that (a class attribute ``cheap_user_filter =
        True``, as pgvector's indexed user column) is not sent the user's whole id list."""

    def delete(self, ids: list[str]) -> None: ...

    def delete_user(self, user_id: str) -> None: ...

    def ids(self, user_id: str | None = None) -> set[str]: ...

    def count(self, user_id: str | None = None) -> int: ...

    def reset(self) -> None:
        """Drop every vector (used by ``rebuild_index``)."""

    def close(self) -> None: ...


@runtime_checkable
class ExactScope(Protocol):
    """An index that can scan one user's turns exactly, without being told their ids (optional)."""

    def scans_exactly(self, user_id: str) -> bool:
        """Whether a query of ``user_id`` is an exact scan of that user's vectors now, so that
        the caller need not pass ``among`` to scope it."""
        ...

    def held_rows(self, user_id: str) -> int:
        """How many vectors of ``user_id`` the exact scan holds (0 when it holds none)."""
        ...

    def query_held(self, vector: np.ndarray, *, user_id: str, ks: Mapping[str, int],
                   session_id: str | None = None) -> dict[str, list[tuple[str, float]]] | None:
        """For one query vector, the best ``ks[layer]`` (id, cosine) of each layer, as
        :meth:`VectorIndex.query` per layer gives them, from one scan of the user's vectors
        held in memory; ``None`` when they are not held."""
        ...


#: (user id, message ids or ``None`` for all) -> {message id: session id}
Sessions = Callable[[str, Sequence[str] | None], Mapping[str, str]]


@runtime_checkable
class SessionSink(Protocol):
    """An index that keeps no session of its own and asks the record store for it (optional;
    Chroma, embedded or served: each metadata key is a row Chroma writes)."""

    def use_sessions(self, sessions: Sessions) -> None:
        """Where each message's session comes from, before the first write."""
        ...


@runtime_checkable
class WritesBehind(Protocol):
    """An index that may write upserts from a background thread (optional; the embedded
    Chroma). See :mod:`.write_behind` for what a reader sees meanwhile."""

    def upsert_behind(self, items: list[VectorItem]) -> None:
        """Queue ``items``; a failure shows in :meth:`settle_behind`, or is raised here when
        the index writes at once."""

    def settle_behind(self, *, wait: bool) -> tuple[list[str], Exception | None]:
        """The ids whose background write failed since the last call, and the first error
        (``wait``: first let what is queued reach the engine)."""
        ...
