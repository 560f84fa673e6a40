"""A memory folder read beside the process that holds it: what the CLI's read commands open
while an application runs on the folder.

An embedded folder serves one process (:mod:`.folder_lock`), but its record store can be
read by others, as the ``sqlite3`` shell does: :class:`ReadOnlyMemory` opens
``records.sqlite3`` read-only (SQLite ``mode=ro``; a WAL reader sees committed transactions
and never blocks the writer) and nothing else. Its invariants:

- It writes nothing: no migration, repair, access count or meta value (SQLite refuses any
  write on the connection). The ``-wal`` and ``-shm`` that SQLite makes beside a database no
  connection had open are removed as it closes, by SQLite, when it is the last reader. A
  store whose schema is older than this code is refused, since only an open with the folder
  to itself may migrate it.
- It needs no embedder to read rows: a store whose vectors an application's own embedder made
  opens without it (the CLI's reads of such a folder, :mod:`.cli_open`), and only what would
  embed (a working memory ranked by a query) raises
  :class:`~tiered_memory.errors.EmbedderRequiredError`.
- The vector index is the holder's and is not opened (:class:`~.vector.absent.NoVectors`):
  searches rank keyword matches by the same scoring as :meth:`TieredMemory.search`, without
  similarity, and say so in each hit's ``explanation["vectors"]``; the vector count is unknown.
- Every read is the record store's or the layer repositories' own, the queries
  :class:`~tiered_memory.TieredMemory` runs.
"""

from __future__ import annotations

import functools
import os
import threading
import time

import numpy as np

from .config import MemoryConfig, check_config
from .embedding import ArrayEmbedder, Embedder, default_embedder
from .errors import EmbedderRequiredError
from .guard import Calls
from .layers.semantic import check_type
from .layers.working import WorkingMemory
from .memory_folder import check_export_target
from .portable import export_jsonl
from .recall.search import search_turns
from .recall.sessions import search_sessions
from .records import Episode, Fact, FactChange
from .store.sqlite import SQLiteRecordStore
from .store.sqlite_layers import SQLiteLayerStore
from .types import MemoryHit, SessionHit, SessionInfo, Stats
from .validation import check_count, check_id, check_path, check_query
from .vector.absent import NoVectors

#: each hit's ``explanation["vectors"]``: how it was found
KEYWORD_ONLY = ("keyword-only: the vector index belongs to the process that holds the folder, so hits "
                "are keyword matches ranked by words, names, dates, neighbours and recency")
_NO_QUERY_VECTOR = np.zeros(1, dtype=np.float32)  # handed to an index that holds no vectors: never embedded
#: why the vector index is not read (``ReadOnlyMemory.why``), when another process holds the folder
HELD = "the index belongs to the process that holds the folder"


class _Unmade(ArrayEmbedder):
    """The application's own embedder a store recorded, which this process cannot make: a read
    needs none, and whatever would embed gets the refusal (:class:`EmbedderRequiredError`)."""

    def __init__(self, refusal: EmbedderRequiredError) -> None:
        self.name, self._refusal = refusal.recorded, str(refusal)

    def embed_array(self, texts: list[str]) -> np.ndarray:
        raise EmbedderRequiredError(self._refusal, recorded=self.name)

    def query_array(self, text: str) -> np.ndarray:
        raise EmbedderRequiredError(self._refusal, recorded=self.name)


class ReadOnlyMemory:
    """The record store of ``path`` opened read-only (see the module's docstring).

    Args:
        path: an embedded memory folder (its ``records.sqlite3`` must exist).
        config: tuning of the searches and of working memory's ranking.
        embedder: what ranks a working memory by a query; default: the store's built-in one
            (a store of an application's own embedder reads without it).
        why: why the vector index is not read, for messages (``why``; default :data:`HELD`).

    Raises:
        StoreError: the store's schema is older than this code.
        CorruptStoreError: the file is not a readable tiered-memory database.
    """

    read_only = True

    def __init__(self, path: str | os.PathLike[str], config: MemoryConfig | None = None, *,
                 embedder: Embedder | None = None, why: str = HELD) -> None:
        self.path = check_path(path)
        self.config = check_config(config or MemoryConfig())
        self.why, self._embedder = why, embedder
        self.store = SQLiteRecordStore(self.path / "records.sqlite3", read_only=True)
        try:
            # the layer tables are made when an application first uses a layer: without them
            # there is no fact, episode, item or working memory to read
            self.rows = SQLiteLayerStore(self.store) if self.store.schema_version("layers") else None
        except BaseException:
            self.store.close()
            raise
        self._index = NoVectors()

    @functools.cached_property
    def embedder(self) -> Embedder:
        """The embedder given, else the store's, as the CLI would open it (made, not loaded: only
        a working memory ranked by a query embeds, and never into the store); for a store of an
        application's own embedder, a stand-in that refuses to embed."""
        if self._embedder is not None:
            return self._embedder
        try:
            return default_embedder(self.config.embed_batch_size, recorded=self.store.get_meta("embedder"))
        except EmbedderRequiredError as e:
            return _Unmade(e)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "ReadOnlyMemory":
        self.store.check_usable()  # a closed reader's block would fail at its first read
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> Stats:
        """The record store's counts; ``vectors`` is ``None`` (the index is not opened)."""
        c = self.store.counts()
        return Stats(users=c["users"], sessions=c["sessions"], messages=c["messages"],
                     indexed=c["indexed"], duplicates=c["duplicates"], vectors=None)

    def sessions(self, user_id: str) -> list[SessionInfo]:
        return self.store.sessions(check_id(user_id, "user_id"))

    def facts(self, user_id: str, type: str | None = None, include_invalid: bool = False) -> list[Fact]:
        check_id(user_id, "user_id")
        check_type(type)
        return self.rows.facts_of(user_id, type=type, include_invalid=include_invalid) if self.rows else []

    def fact_history(self, user_id: str, fact_id: str | None = None) -> list[FactChange]:
        check_id(user_id, "user_id")
        return self.rows.fact_history(user_id, fact_id) if self.rows else []

    def episodes(self, user_id: str, session_id: str | None = None) -> list[Episode]:
        check_id(user_id, "user_id")
        if session_id is not None:
            check_id(session_id, "session_id")
        return self.rows.episodes_of(user_id, session_id) if self.rows else []

    def working_memory(self, session_id: str, *, user_id: str) -> WorkingMemory | None:
        """The session's working memory, to read (``items``, ``scratchpad``); ``None`` where
        the store has no layer tables yet."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        if self.rows is None:
            return None
        return WorkingMemory(self.rows, self.embedder, self.config.working, threading.RLock(),
                             user_id=user_id, session_id=session_id, calls=Calls())

    def search(self, query: str, *, user_id: str, k: int = 10, session_id: str | None = None) -> list[MemoryHit]:
        """Keyword-only recall (see the module's docstring); counts no access."""
        self._check_search(query, user_id, k)
        if session_id is not None:
            check_id(session_id, "session_id")
        hits = search_turns(store=self.store, index=self._index, embedder=self.embedder,
                            config=self.config.retrieval, query=query, user_id=user_id, k=k,
                            session_id=session_id, vector=_NO_QUERY_VECTOR)
        for h in hits:
            h.explanation["vectors"] = KEYWORD_ONLY
        return hits

    def search_sessions(self, query: str, *, user_id: str, k: int = 10, turns: int = 3) -> list[SessionHit]:
        """The user's sessions ranked by their best keyword-only turn; counts no access."""
        self._check_search(query, user_id, k)
        check_count(turns, "turns", minimum=1)
        found = search_sessions(store=self.store, index=self._index, embedder=self.embedder,
                                config=self.config.retrieval, query=query, user_id=user_id, k=k,
                                per_session=turns, vector=_NO_QUERY_VECTOR)
        for f in found:
            for h in f.hits:
                h.explanation["vectors"] = KEYWORD_ONLY
        return found

    def export_jsonl(self, path: str | os.PathLike[str], user_id: str | None = None) -> int:
        """:meth:`TieredMemory.export_jsonl` from one read transaction: a consistent snapshot
        while the holder writes."""
        target = check_path(path)
        check_export_target(self.path, target)
        with self.store.snapshot():
            return export_jsonl(self.store, target, user_id, self.rows, now=time.time(),
                                max_chars=self.config.max_content_chars,
                                max_metadata_bytes=self.config.max_metadata_bytes)

    @staticmethod
    def _check_search(query: str, user_id: str, k: int) -> None:
        check_id(user_id, "user_id")
        check_query(query)
        check_count(k, "k", minimum=1)

