"""Qdrant vector index: local on-disk mode (``path``) or a server (``url``)."""

from __future__ import annotations

import logging
import threading
import uuid
import weakref
from importlib.metadata import version
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import VectorIndexError, missing
from ..redaction import mask, masked_cause
from .base import VectorItem, dimension_hint, refuse_bad_queries, refuse_bad_vectors, shown_url
from .exact import ExactScan, Held
from .ownership import OWNER_KEY, refusal
from .server_url import DEFAULT_COLLECTION as COLLECTION
from .server_url import check_qdrant_server, qdrant_secrets, remember_qdrant_tokens, server_address

log = logging.getLogger("tiered_memory")
_NS = uuid.UUID("6f1c9d1e-5a53-4e0b-9a6e-3c1f2b7d8e90")


def point_id(memory_id: str) -> str:
    """Qdrant accepts only UUIDs or integers; derive a stable UUID from our id."""
    return str(uuid.uuid5(_NS, memory_id))


def _is_local(client: Any) -> bool:
    """Whether ``client`` runs Qdrant's engine in this process (``path=`` or ``":memory:"``),
    read from the options it was made with (the client's public ``init_options``)."""
    options = getattr(client, "init_options", None) or {}
    return options.get("path") is not None or options.get("location") == ":memory:"


def _version_mismatch(client: Any, where: str) -> None:
    """Log a server version qdrant-client does not support (majors equal, minors 1 apart at most),
    asked once the server answered, in place of the client's own check: that one warns from a
    thread at any later moment (also of a server the open has already failed to reach)."""
    try:
        ours, theirs = version("qdrant-client"), str(client.info().version)
        apart = [abs(int(a) - int(b)) for a, b in zip(ours.split(".")[:2], theirs.split(".")[:2], strict=True)]
    except Exception:  # best effort: a version not read is no reason to fail an open
        return
    if apart[0] > 0 or apart[1] > 1:
        log.warning("the Qdrant server at %s runs version %s, which qdrant-client %s does not support (their major "
                    "versions must match, their minor ones differ by 1 at most): calls may fail. Install the "
                    "qdrant-client release of the server's version, or upgrade the server", where, theirs, ours)


_ENGINE_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


class _OneAtATime:
    """The client of Qdrant's local mode, one call at a time: its in-process engine is not
    thread-safe (a query while an upsert grows the collection fails, or reads half a write).
    The lock is the client's, so indexes of several collections on one client share it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        with _GUARD:
            self._lock = _ENGINE_LOCKS.setdefault(client, threading.Lock())

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)
        return call


class QdrantVectorIndex:
    """Args: ``path`` for local mode, or ``url`` (and ``api_key``) for a server.

    On a server, ``user_id`` has a keyword payload index flagged ``is_tenant``, so each
    user's points are stored together and a query filtered on the user reads only them.
    Local mode ignores payload indexes; it is one process's folder, so, like the embedded
    Chroma, it holds users in memory for exact scans (``exact_rows``; see :mod:`.exact`).
    ``collection``: give each app on a shared server its own (``rebuild_index`` drops and
    refills the whole collection). A ``client`` passed in is the caller's: ``close`` leaves it open.
    """

    def __init__(
        self, path: str | None = None, *, url: str | None = None, api_key: str | None = None,
        collection: str = COLLECTION, client: Any = None, exact_rows: int = 200_000,
    ) -> None:
        check_qdrant_server(url, collection)
        try:
            from qdrant_client import QdrantClient, models
        except ImportError as e:
            raise missing("qdrant-client", "qdrant") from e
        self.models = models
        fix = "; check the URL, the API key and that the server runs" if url else ""
        self._tokens = remember_qdrant_tokens(client) or ()  # (a token provider's, before the first call)
        try:
            self.client = client or (QdrantClient(url=url, api_key=api_key, check_compatibility=False) if url
                                     else QdrantClient(path=str(path)))
            self._local = _is_local(self.client)
            if self._local:
                self.client = _OneAtATime(self.client)
            self._ready = self.client.collection_exists(collection)  # (a server is first reached here)
        except Exception as e:
            where = f"the Qdrant server at {shown_url(url)}" if url else f"Qdrant at {path}"
            secrets = (*qdrant_secrets(client, url, api_key), *self._tokens)
            failed = VectorIndexError(f"could not open {where} ({mask(str(e), secrets)}){fix}")
            raise failed from masked_cause(e, secrets)
        if url and client is None:
            _version_mismatch(self.client, shown_url(url))
        self.name = collection
        self._secrets = qdrant_secrets(self.client)
        self._where = f"{self.location()[1]}, collection {collection!r}"  # which of several servers failed
        self._owner: str | None = None  # the record store's id, once claimed (see .ownership)
        self._owns_client = client is None
        local = client is None and not url
        self._exact = ExactScan(self._user_vectors, exact_rows) if local and exact_rows > 0 else None

    @classmethod
    def from_url(cls, url: str, *, api_key: str | None = None, collection: str | None = None) -> "QdrantVectorIndex":
        """``http(s)://host:6333`` of a Qdrant server; ``?collection=NAME`` (or ``collection=``)
        chooses the collection, else ``tiered_memory``.

        Raises:
            ConfigurationError: a bad URL query or collection name (nothing was opened).
            VectorIndexError: the server cannot be reached.
        """
        where = server_address(url, "qdrant", collection)
        return cls(url=where.url, api_key=api_key, collection=where.collection)

    def _user_vectors(self, user_id: str, limit: int) -> Held | None:
        """Every vector of the user with its layer and session; ``None`` beyond ``limit``."""
        ids: list[str] = []
        vectors: list[Any] = []
        layers: list[str] = []
        sessions: list[str] = []
        if self._exists():
            offset = None
            while True:
                points, offset = self.client.scroll(
                    self.name, scroll_filter=self._filter(user_id), limit=2000, offset=offset,
                    with_payload=["memory_id", "layer", "session_id"], with_vectors=True)
                for p in points:
                    payload = p.payload or {}
                    ids.append(payload["memory_id"])
                    vectors.append(p.vector)
                    layers.append(str(payload.get("layer", "turn")))
                    sessions.append(str(payload.get("session_id", "")))
                if len(ids) > limit:
                    return None
                if offset is None:
                    break
        matrix = np.asarray(vectors, dtype=np.float32) if vectors else np.zeros((0, 1), dtype=np.float32)
        return ids, matrix, layers, sessions

    def scans_exactly(self, user_id: str, *, wait: bool = False) -> bool:
        """Whether a query of ``user_id`` is an exact scan of the user's vectors held in memory."""
        return self._exact is not None and self._exact.ready(user_id, wait=wait)

    def held_rows(self, user_id: str) -> int:
        """How many vectors of ``user_id`` the exact scan holds (0 when it holds none)."""
        return 0 if self._exact is None else self._exact.held_rows(user_id)

    def query_held(self, vector: np.ndarray, *, user_id: str, ks: Mapping[str, int],
                   session_id: str | None = None) -> dict[str, list[tuple[str, float]]] | None:
        """The best ``ks[layer]`` of each layer from one scan of the user's held vectors, or
        ``None`` when they are not held (:meth:`.exact.ExactScan.query_layers`)."""
        return None if self._exact is None else self._exact.query_layers(user_id, vector, ks, session_id)

    def location(self) -> tuple[str, str, str]:
        """Where the vectors are (:mod:`.identity`): the local folder, or the server."""
        options = getattr(self.client, "init_options", None) or {}
        if options.get("path") is not None:
            return "qdrant", str(Path(str(options["path"])).resolve()), self.name
        where = options.get("url") or options.get("location") or f"{options.get('host')}:{options.get('port')}"
        return "qdrant", shown_url(str(where)) if "://" in str(where) else str(where), self.name

    # ---- the owner mark (.ownership): the collection's metadata ----
    def collection_name(self) -> str:
        return self.name

    def owner(self) -> str | None:
        try:
            self._ready = self.client.collection_exists(self.name)
            found = self.client.get_collection(self.name).config.metadata if self._ready else None
        except Exception as e:
            raise self._failed("read", e)
        return str(found[OWNER_KEY]) if found and found.get(OWNER_KEY) else None

    def mark_owner(self, store_id: str, *, written: bool = False) -> None:
        """Mark the collection as ``store_id``'s; one not made yet is marked when the first
        write makes it (so is one made anew after :meth:`reset`)."""
        self._owner = store_id
        if self._ready and not written:
            try:
                self.client.update_collection(self.name, metadata={OWNER_KEY: store_id})  # (merged)
            except Exception as e:  # a server without collection metadata: no mark, the unmarked rule
                log.warning("Qdrant could not mark the collection %r as this record store's (%s, at %s)", self.name,
                            mask(str(e), (*self._secrets, *self._tokens)), self._where)

    def first_ids(self, n: int) -> list[str]:
        if not self._exists():
            return []
        try:
            points, _ = self.client.scroll(self.name, limit=n, with_payload=["memory_id"], with_vectors=False)
        except Exception as e:
            raise self._failed("read", e)
        return [str((p.payload or {}).get("memory_id", "")) for p in points]

    def _exists(self) -> bool:
        """Whether the collection exists. Until it does, the engine is asked on each call:
        the first write of any worker of the app makes it, and an index opened before then
        (a fresh deployment's other workers) would otherwise search and delete nothing. One
        made meanwhile by another app is refused, as :meth:`_ensure` refuses it."""
        if not self._ready and self.owner() not in (None, self._owner):  # (owner() asks whether it exists)
            self._ready = False
            raise VectorIndexError(refusal("foreign", self.name))
        return self._ready

    def _ensure(self, dim: int) -> None:
        if not self._ready:
            m = self.models
            try:
                self.client.create_collection(
                    self.name, vectors_config=m.VectorParams(size=dim, distance=m.Distance.COSINE),
                    metadata={OWNER_KEY: self._owner} if self._owner else None)
            except Exception:
                # made meanwhile, by another worker of this store, or by another app
                if not self.client.collection_exists(self.name):
                    raise
                if self.owner() not in (None, self._owner):
                    raise VectorIndexError(refusal("foreign", self.name)) from None
                return
            # the local engine ignores payload indexes (and qdrant-client warns the user who asks)
            for field in () if self._local else ("user_id", "layer", "session_id"):
                schema = (m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, is_tenant=True)
                          if field == "user_id" else m.PayloadSchemaType.KEYWORD)
                try:
                    self.client.create_payload_index(self.name, field, field_schema=schema)
                except Exception:
                    pass  # best effort: an index only speeds up the filters
            self._ready = True

    def _filter(self, user_id: str | None, layers: Sequence[str] | None = None, session_id: str | None = None,
                among: Sequence[str] | None = None) -> Any:
        m = self.models
        must: list[Any] = []
        if among is not None:
            must.append(m.HasIdCondition(has_id=[point_id(i) for i in among]))
        if user_id is not None:
            must.append(m.FieldCondition(key="user_id", match=m.MatchValue(value=user_id)))
        if layers:
            must.append(m.FieldCondition(key="layer", match=m.MatchAny(any=list(layers))))
        if session_id is not None:
            must.append(m.FieldCondition(key="session_id", match=m.MatchValue(value=session_id)))
        return m.Filter(must=must) if must else None

    def upsert(self, items: list[VectorItem]) -> None:
        if not items:
            return
        refuse_bad_vectors(items)
        try:
            self._ensure(len(items[0].vector))
            m = self.models
            for start in range(0, len(items), 1000):
                self.client.upsert(self.name, points=[
                    m.PointStruct(
                        id=point_id(i.id), vector=[float(x) for x in i.vector],
                        payload={"memory_id": i.id, "user_id": i.user_id, "layer": i.layer,
                                 "session_id": i.session_id, "timestamp": float(i.timestamp)},
                    )
                    for i in items[start : start + 1000]
                ])
            if self._exact is not None:
                self._exact.add_items(items)
        except VectorIndexError:
            raise
        except Exception as e:
            hint = dimension_hint(e, self.name, len(items[0].vector), self._width)
            raise self._failed("upsert", e, hint)

    def _width(self) -> int | None:
        size = getattr(self.client.get_collection(self.name).config.params.vectors, "size", None)
        return size if isinstance(size, int) else None

    def query(
        self, vectors: np.ndarray, *, user_id: str, k: int,
        layers: Sequence[str] | None = None, session_id: str | None = None,
        among: Sequence[str] | None = None,
    ) -> list[list[tuple[str, float]]]:
        refuse_bad_queries(vectors)
        if (among is not None and not among) or k <= 0 or not self._exists():
            return [[] for _ in range(len(vectors))]
        if self._exact is not None and self._exact.ready(user_id):
            found = self._exact.query(user_id, np.asarray(vectors, dtype=np.float32), k, among, layers, session_id)
            if found is not None:
                return found
        flt = self._filter(user_id, layers, session_id, among)
        try:
            out = []
            for v in vectors:
                res = self.client.query_points(
                    self.name, query=[float(x) for x in v], query_filter=flt, limit=k, with_payload=["memory_id"]
                )
                out.append([((p.payload or {})["memory_id"], float(p.score)) for p in res.points])
            return out
        except Exception as e:
            raise self._failed("query", e)

    def delete(self, ids: list[str]) -> None:
        if self._exact is not None:
            self._exact.delete(ids)
        if ids and self._exists():
            try:
                self.client.delete(self.name, points_selector=self.models.PointIdsList(
                    points=[point_id(i) for i in ids]))
            except Exception as e:
                raise self._failed("delete", e)
            if self._exact is not None:  # again: a query meanwhile loaded them from the engine
                self._exact.delete(ids)

    def delete_user(self, user_id: str) -> None:
        if self._exact is not None:
            self._exact.drop(user_id)
        if self._exists():
            try:
                self.client.delete(self.name, points_selector=self.models.FilterSelector(
                    filter=self._filter(user_id)))
            except Exception as e:
                raise self._failed("delete", e)
            if self._exact is not None:  # again: a query meanwhile loaded the user from the engine
                self._exact.drop(user_id)

    def ids(self, user_id: str | None = None) -> set[str]:
        if not self._exists():
            return set()
        out: set[str] = set()
        offset = None
        try:
            while True:
                points, offset = self.client.scroll(
                    self.name, scroll_filter=self._filter(user_id), limit=2000, offset=offset,
                    with_payload=["memory_id"], with_vectors=False,
                )
                out.update((p.payload or {})["memory_id"] for p in points)
                if offset is None:
                    return out
        except Exception as e:
            raise self._failed("read", e)

    def count(self, user_id: str | None = None) -> int:
        if not self._exists():
            return 0
        try:
            return int(self.client.count(self.name, count_filter=self._filter(user_id), exact=True).count)
        except Exception as e:
            raise self._failed("count", e)

    def reset(self) -> None:
        if self._exact is not None:
            self._exact.drop()
        if self._ready:
            try:
                self.client.delete_collection(self.name)
            except Exception as e:
                raise self._failed("reset", e, "; run rebuild_index() again")
            self._ready = False

    def _failed(self, what: str, error: Exception, hint: str = "") -> VectorIndexError:
        """The error of a call the engine failed, naming where, with ``error`` as its cause; neither
        quotes the password, the API key or a token the client's provider gave (:mod:`..redaction`)."""
        secrets = (*self._secrets, *self._tokens)  # (the tokens as they are now)
        failed = VectorIndexError(f"Qdrant {what} failed at {self._where}: {mask(str(error), secrets)}{hint}")
        failed.__cause__ = masked_cause(error, secrets)  # as `from`: no context printed
        return failed

    def close(self) -> None:
        if self._exact is not None:
            self._exact.drop()
        if not self._owns_client:  # another index (another app's collection) may use it still
            return
        try:
            self.client.close()
        except Exception:
            pass
