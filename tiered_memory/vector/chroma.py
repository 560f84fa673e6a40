"""ChromaDB vector index: embedded ``PersistentClient`` or a server's ``HttpClient``."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import missing
from .base import (CHUNK_SEPARATOR, Sessions, VectorItem, dimension_hint, refuse_bad_queries, refuse_bad_vectors,
                   shown_url)
from .chroma_client import (chroma_failed, chroma_owner, client_settings, compacted, cosine_collection, drop_collection,
                            forget_cached_client, gone_hint, mark_chroma_owner, segment_folders, server_client)
from .chroma_scope import (SCOPED as SCOPED, best_owned, owned, scope_collection, scope_of, scopes_of, user_filter,
                           user_vectors)
from .exact import ExactScan, Held
from .server_url import DEFAULT_COLLECTION as COLLECTION
from .server_url import check_collection, server_address
from .write_behind import WriteBehind

log = logging.getLogger("tiered_memory")

SESSION_SCAN_MAX = 50_000  # hits read at most to find a session's best k on the engine
# an id-scoped query of up to this many ids is ranked exactly (see query): reading 64 vectors
# costs what a query among them does (1.4 ms each, embedded, 3,000 vectors); 3,000 cost 96 ms
# against 1.8 ms, so a user's whole id list (search's scope) still goes to the engine
EXACT_AMONG_MAX = 64


def _hits(res: Any) -> list[list[tuple[str, float]]]:
    """Chroma's query result as (id, cosine similarity) lists, best first."""
    return [[(i, 1.0 - float(d)) for i, d in zip(ids, dists)]
            for ids, dists in zip(res["ids"], res["distances"] or [])]


class ChromaVectorIndex:
    """Cosine HNSW collection; we always pass our own embeddings (no Chroma embedding function).

    Args:
        path: folder of an embedded ``PersistentClient``.
        client: an existing Chroma client (for example ``chromadb.HttpClient(host, port)``).
        collection: collection name: give each app on a shared server its own (``rebuild_index``
            drops and refills the whole collection).
        exact_rows: turn vectors held in memory for exact per-user scans (embedded only:
            this process is then the one writer; 0 turns it off). See :mod:`.exact`.
    """

    def __init__(self, path: str | None = None, *, client: Any = None, collection: str = COLLECTION,
                 exact_rows: int = 200_000) -> None:
        check_collection(collection, "chroma")
        try:
            import chromadb
        except ImportError as e:
            raise missing("chromadb", "embedded") from e
        try:
            self._owns_client = client is None
            self._path = Path(path) if client is None and path is not None else None
            if client is None:
                if path is None:
                    raise ValueError("ChromaVectorIndex needs a path or a client")
                client = chromadb.PersistentClient(path=str(path), settings=client_settings())
            self.client = client
            self.collection = cosine_collection(client, collection)
            scope_collection(self.collection)
        except Exception as e:
            raise chroma_failed(f"could not open Chroma collection {collection!r}", e, client)
        # a server may have other writers, so only an embedded index holds users in memory,
        # and only then may its turn upserts be written behind (see .write_behind)
        self._name = collection
        self._at = ""  # where, in an error: a server's address (from_url), nothing for a folder
        self._owner: str | None = None  # the record store's id, once claimed (see .ownership)
        self._sessions: Sessions | None = None  # see use_sessions
        self._stale = False  # a failed write asked for a new client (see _renew_client)
        self._renewing = threading.Lock()
        self._exact = ExactScan(self._user_vectors, exact_rows) if self._owns_client and exact_rows > 0 else None
        self._behind = WriteBehind(self._write) if self._exact is not None else None

    def use_sessions(self, sessions: Sessions) -> None:
        """Where each message's session comes from (the record store's ``message_sessions``),
        before the first write: the vectors then carry none. Without it (an index used on its
        own), each vector keeps its session in a second metadata key."""
        self._sessions = sessions

    def _settle(self) -> None:
        """Before any read or write of the engine itself: let queued upserts reach it."""
        if self._behind is not None:
            self._behind.wait()
        self._fresh()

    def _user_vectors(self, user_id: str, limit: int) -> Held | None:
        """Every vector of the user with its layer and session, read in pages; ``None`` beyond ``limit``."""
        self._settle()
        known = self._sessions(user_id, None) if self._sessions is not None else None
        return user_vectors(self.collection, user_id, limit, known)

    def scans_exactly(self, user_id: str, *, wait: bool = False) -> bool:
        """Whether a query of ``user_id`` is an exact scan of the user's vectors held in memory;
        ``wait`` for the user's vectors to be read first."""
        return self._exact is not None and self._exact.ready(user_id, wait=wait)

    def held_rows(self, user_id: str) -> int:
        """How many vectors of ``user_id`` the exact scan holds (0 when it holds none)."""
        return 0 if self._exact is None else self._exact.held_rows(user_id)

    def query_held(self, vector: np.ndarray, *, user_id: str, ks: Mapping[str, int],
                   session_id: str | None = None) -> dict[str, list[tuple[str, float]]] | None:
        """The best ``ks[layer]`` of each layer from one scan of the user's held vectors, or
        ``None`` when they are not held (:meth:`.exact.ExactScan.query_layers`)."""
        return None if self._exact is None else self._exact.query_layers(user_id, vector, ks, session_id)

    @classmethod
    def from_url(cls, url: str, *, collection: str | None = None) -> "ChromaVectorIndex":
        """``http://host:port`` of a Chroma server (``chroma run``); ``?collection=NAME`` (or
        ``collection=``) chooses the collection, else ``tiered_memory``.

        Raises:
            ConfigurationError: a bad URL query or collection name (nothing was opened).
            MissingDependencyError: chromadb is not installed.
            VectorIndexError: the server cannot be reached.
        """
        where = server_address(url, "chroma", collection)
        client = server_client(where.url, shown_url(url))
        index = cls(client=client, collection=where.collection)
        index._at = f" (the Chroma server at {shown_url(where.url)})"
        return index

    def upsert(self, items: list[VectorItem]) -> None:
        refuse_bad_vectors(items)
        self._settle()
        self._write(items)
        if self._exact is not None:
            self._exact.add_items(items)

    def upsert_behind(self, items: list[VectorItem]) -> None:
        """Like :meth:`upsert`, written by a background thread when this index is embedded;
        :meth:`settle_behind` reports what failed."""
        refuse_bad_vectors(items)
        if self._behind is None or self._exact is None:
            self.upsert(items)
            return
        # queued first: a load of the user that starts after this reads the engine only once
        # the queue is written (it settles first), and one already loading replays the add
        self._behind.submit(items)
        self._exact.add_items(items)

    def settle_behind(self, *, wait: bool) -> tuple[list[str], Exception | None]:
        """The ids a background write failed to write since the last call, and the error
        (``wait``: first let what is queued reach the engine)."""
        if self._behind is None:
            return [], None
        if wait:
            self._behind.wait()
        return self._behind.take_lost()

    def _write(self, items: list[VectorItem]) -> None:
        self._fresh()
        try:
            for start in range(0, len(items), 2000):
                part = items[start : start + 2000]
                self.collection.upsert(
                    ids=[i.id for i in part],
                    embeddings=np.asarray([i.vector for i in part], dtype=np.float32),
                    metadatas=self._metadatas(part),
                )
        except Exception as e:
            hint = (dimension_hint(e, self._name, len(items[0].vector), self._width) if items else "") or gone_hint(e)
            self._renew_client()
            raise chroma_failed(f"Chroma upsert failed{self._at}", e, self.client, hint)

    def _width(self) -> int | None:
        got = self.collection.get(limit=1, include=["embeddings"])
        return len(got["embeddings"][0]) if len(got["ids"]) else None

    def _metadatas(self, items: list[VectorItem]) -> list[dict[str, Any]]:
        """One key a vector (each is a row Chroma writes: see :func:`scope_of`); a second, the
        session, only while no record store tells sessions (an index used on its own)."""
        if self._sessions is not None:
            return [{"user_id": scope_of(i.user_id, i.layer)} for i in items]
        return [{"user_id": scope_of(i.user_id, i.layer), "session_id": i.session_id} for i in items]

    def _renew_client(self) -> None:
        """After a failed write to an embedded index, the next call opens a new client of
        the folder. Chroma's own can be left unable to answer: after a "database or disk is
        full" error its next upsert waited forever, holding the GIL (about a quarter of the
        runs of the full-disk test). The old client is dropped, never closed (closing can wait
        the same way); what the failed write lost, the repair writes again."""
        if self._owns_client and self._path is not None:
            self._stale = True

    def _fresh(self) -> None:
        """Open the new client that :meth:`_renew_client` asked for (before any use)."""
        if not self._stale:
            return
        import chromadb

        with self._renewing:  # the writer thread and a reader may both get here
            if not self._stale or self._path is None:  # (a path always: only an embedded index renews)
                return
            forget_cached_client(str(self._path))
            try:
                client = chromadb.PersistentClient(path=str(self._path), settings=client_settings())
                collection = cosine_collection(client, self._name)
            except Exception as e:
                forget_cached_client(str(self._path))  # a half-made client is not kept either
                raise chroma_failed(f"could not reopen the Chroma index{self._at} after a failed write", e, client)
            self.client, self.collection, self._stale = client, collection, False

    def query(
        self, vectors: np.ndarray, *, user_id: str, k: int,
        layers: Sequence[str] | None = None, session_id: str | None = None,
        among: Sequence[str] | None = None,
    ) -> list[list[tuple[str, float]]]:
        if len(vectors) == 0:
            return []
        refuse_bad_queries(vectors)
        if k <= 0:  # (Chroma refuses n_results=0)
            return [[] for _ in range(len(vectors))]
        if self._exact is not None and self._exact.ready(user_id):
            found = self._exact.query(user_id, np.asarray(vectors, dtype=np.float32), k, among, layers, session_id)
            if found is not None:
                return found
        self._settle()
        if among is not None:
            if not among:
                return [[] for _ in range(len(vectors))]
            # Chroma's metadata filter costs ~4x the search itself; a list of ids does not. The ids
            # only narrow the search: a vector whose metadata is not the user's (and layers') is
            # left out, as the other indexes' filters leave it out
            scopes = scopes_of(user_id, layers)
            if len(among) > EXACT_AMONG_MAX:
                try:
                    res = self.collection.query(
                        query_embeddings=np.asarray(vectors, dtype=np.float32), n_results=min(k, len(among)),
                        ids=list(among), include=["distances", "metadatas"])
                    return [[row[n] for n in owned({"metadatas": metas}, scopes)]
                            for row, metas in zip(_hits(res), res["metadatas"] or [])]
                except Exception as e:  # e.g. an id the index lacks until repair
                    log.debug("%s; scanning them exactly", chroma_failed("Chroma query by ids failed", e, self.client))
            try:  # few ids, exactly: HNSW can leave a vector unreachable (one beside many identical
                # ones) and miss it even when it is the only id asked for
                return best_owned(self.collection, among, scopes, vectors, k)
            except Exception as e:
                raise chroma_failed(f"Chroma read failed{self._at}", e, self.client, gone_hint(e))
        where = user_filter(user_id, layers)
        if session_id is not None and self._sessions is None:  # the session is in the metadata
            where = {"$and": [where, {"session_id": session_id}]}
        sessions = self._sessions if session_id is not None else None  # the record store's: read on
        n = k if sessions is None else 4 * k
        while True:
            try:
                res = self.collection.query(
                    query_embeddings=np.asarray(vectors, dtype=np.float32), n_results=n,
                    where=where, include=["distances"],
                )
            except Exception as e:
                raise chroma_failed(f"Chroma query failed{self._at}", e, self.client, gone_hint(e))
            hits = _hits(res)
            if sessions is None:
                return hits
            # the user's best hits, then those of the session (asked of the store for these hits only)
            known = sessions(user_id, [i.split(CHUNK_SEPARATOR)[0] for row in hits for i, _ in row])
            mine = [[(i, d) for i, d in row if known.get(i.split(CHUNK_SEPARATOR)[0]) == session_id][:k]
                    for row in hits]
            if all(len(m) == k or len(row) < n for m, row in zip(mine, hits)) or n >= SESSION_SCAN_MAX:
                return mine
            n *= 4

    def delete(self, ids: list[str]) -> None:
        if ids:
            self._settle()
            if self._exact is not None:  # before the engine: a half-done delete never leaves a held vector
                self._exact.delete(ids)
            try:
                for start in range(0, len(ids), 2000):
                    self.collection.delete(ids=ids[start : start + 2000])
            except Exception as e:
                raise chroma_failed(f"Chroma delete failed{self._at}", e, self.client, gone_hint(e))
            if self._exact is not None:  # and after: a load that read the engine meanwhile holds them
                self._exact.delete(ids)

    def delete_user(self, user_id: str) -> None:
        self._settle()
        if self._exact is not None:
            self._exact.drop(user_id)
        try:
            self.collection.delete(where=user_filter(user_id))
        except Exception as e:
            raise chroma_failed(f"Chroma delete failed{self._at}", e, self.client, gone_hint(e))
        if self._exact is not None:  # again: a query meanwhile loaded the user from the engine
            self._exact.drop(user_id)

    def location(self) -> tuple[str, str, str]:
        """Where the vectors are (:mod:`.identity`): the folder, or the server's host and port."""
        if self._path is not None:
            return "chroma", str(self._path.resolve()), self._name
        settings = self.client.get_settings()
        if getattr(settings, "is_persistent", False) and getattr(settings, "persist_directory", None):
            return "chroma", str(Path(settings.persist_directory).resolve()), self._name
        return "chroma", f"{settings.chroma_server_host}:{settings.chroma_server_http_port}", self._name

    # ---- the owner mark (.ownership) ----
    def collection_name(self) -> str:
        return self._name

    def owner(self) -> str | None:
        return chroma_owner(self.client, self._name)

    def mark_owner(self, store_id: str, *, written: bool = False) -> None:
        self._owner = store_id  # reset and compact make the collection anew with the mark
        if not written:
            mark_chroma_owner(self.client, self.collection, store_id)

    def first_ids(self, n: int) -> list[str]:
        self._settle()
        return self._id_page(None, n, 0)

    def ids(self, user_id: str | None = None) -> set[str]:
        out: set[str] = set()
        offset = 0
        self._settle()
        while True:
            page = self._id_page(user_id, 5000, offset)
            out.update(page)
            if len(page) < 5000:
                return out
            offset += 5000

    def _id_page(self, user_id: str | None, limit: int, offset: int) -> list[str]:
        try:
            return list(self.collection.get(where=user_filter(user_id) if user_id is not None else None,
                                            include=[], limit=limit, offset=offset)["ids"])
        except Exception as e:
            raise chroma_failed(f"Chroma read failed{self._at}", e, self.client, gone_hint(e))

    def count(self, user_id: str | None = None) -> int:
        if user_id is None:
            self._settle()
            try:
                return int(self.collection.count())
            except Exception as e:
                raise chroma_failed(f"Chroma count failed{self._at}", e, self.client, gone_hint(e))
        return len(self.ids(user_id))

    def reset(self) -> None:
        self._settle()
        if self._behind is not None:
            self._behind.take_lost()  # the rebuild that resets re-embeds every row anyway
        if self._exact is not None:
            self._exact.drop()
        try:
            name = self._name
            drop_collection(self.client, name)
            self.collection = cosine_collection(self.client, name, self._owner)
            scope_collection(self.collection)
        except Exception as e:
            raise chroma_failed(f"Chroma reset failed{self._at}", e, self.client, "; run rebuild_index() again")

    def compact(self, batch: int = 2000) -> int:
        """Copy the live vectors into a new collection and drop the old one, reclaiming the
        space HNSW keeps for deleted vectors (it marks them, never frees them); returns the
        vectors kept. An interruption leaves the old collection (or, at worst, an index the
        start-up repair refills from the records)."""
        self._settle()
        old_segments = segment_folders(self._path)
        try:
            self.collection, kept = compacted(self.client, self.collection, self._owner, batch)
            scope_collection(self.collection)  # (the copies are scoped already: this only marks the collection)
        except Exception as e:
            raise chroma_failed(f"Chroma compaction failed{self._at}", e, self.client, "; the next open repairs it")
        for folder in old_segments:  # Chroma leaves a deleted collection's HNSW files behind
            shutil.rmtree(folder, ignore_errors=True)
        return kept

    def close(self) -> None:
        # Release the client we created: Chroma caches one System per path per process,
        # and a cached System keeps a stale HNSW view, so reopening the folder after
        # another process wrote to it failed with "Error finding id".
        behind = getattr(self, "_behind", None)
        if behind is not None:
            behind.close()  # what is queued reaches the engine first
        self.collection = None
        exact = getattr(self, "_exact", None)
        if exact is not None:
            exact.drop()
        if getattr(self, "_stale", False) and self._path is not None:
            forget_cached_client(str(self._path))  # a client left unable to answer is dropped, not closed
            self._owns_client = False
        if getattr(self, "_owns_client", False) and hasattr(self.client, "close"):
            try:
                self.client.close()
            except Exception as e:  # closing must not mask the caller's own error
                raise chroma_failed("could not close Chroma client", e, self.client)
            self._owns_client = False
