"""Chroma clients and collections as the index opens them: settings with telemetry off, a
server's ``HttpClient`` (errors name the URL without its password; its URL's ``user:password@``
is sent as Chroma's basic auth, and refused beside Chroma's own credentials), the credentials a client
sends, which its errors mask (:func:`client_secrets`, :func:`chroma_failed`), the process-wide
client cache a damaged folder has to leave, the cosine collection every index uses and its
owner mark (:mod:`.ownership`), the copy that compacts a collection, and the HNSW segment
folders an embedded index leaves on disk."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Hashable

from ..errors import ConfigurationError, VectorIndexError, missing
from ..redaction import mask, masked_cause
from .ownership import OWNER_KEY
from .server_url import credential_headers, url_credentials, url_password

#: Chroma's client of basic auth (``chroma_client_auth_provider``)
BASIC_AUTH = "chromadb.auth.basic_authn.BasicAuthClientProvider"


#: the last settings built, under what they were built from (see client_settings)
_built: tuple[Hashable, Any] | None = None


def client_settings(**given: Any) -> Any:
    """Chroma's settings for every client we open: no telemetry (and ``given`` settings).

    Each call gets its own copy (``PersistentClient`` writes its folder into the settings it is
    given). Building them reads each of their fields from the environment and the working
    folder's ``.env`` (pydantic's settings): about a third of an embedded open, so the last ones
    built are copied while the environment, the ``.env`` file's contents and ``given`` are the
    same, and built again when any of them changed."""
    from chromadb.config import Settings

    global _built
    source = _settings_source(given)
    built = _built
    if source is None or built is None or built[0] != source:
        built = (source, Settings(anonymized_telemetry=False, **given))
        if source is not None:
            _built = built
    return built[1].model_copy(deep=True)


def _settings_source(given: dict[str, Any]) -> Hashable | None:
    """What Chroma's settings are read from: ``given``, the environment and ``.env``'s bytes;
    ``None`` when that cannot be told (a value that is not hashable, a ``.env`` not readable)."""
    try:
        dotenv = Path(".env")
        text = dotenv.read_bytes() if dotenv.exists() else None
        source = (tuple(sorted(given.items())), frozenset(os.environ.items()), text)
        hash(source)
    except (OSError, TypeError):
        return None
    return source


def settings_secrets(settings: Any) -> tuple[str, ...]:
    """The credentials a client of Chroma ``settings`` sends, each in the forms an error page
    may echo it in: ``chroma_client_auth_credentials`` as given and base64-encoded (its basic
    auth header), and the credential headers given to the client (``headers=``), whole and
    without their scheme (``Bearer``)."""
    found: list[str] = []
    credentials = getattr(settings, "chroma_client_auth_credentials", None)
    if isinstance(credentials, str) and credentials:
        found += [credentials, base64.b64encode(credentials.encode("utf-8")).decode("ascii")]
    headers = dict(getattr(settings, "chroma_server_headers", None) or {})
    transport = getattr(settings, "chroma_auth_token_transport_header", None)
    if transport in headers:  # (a header of any name may carry the token: the setting names it)
        headers[f"authorization ({transport})"] = headers[transport]
    return (*found, *credential_headers(headers))


def client_secrets(client: Any) -> tuple[str, ...]:
    """The credentials ``client`` sends (:func:`settings_secrets`); none for a client without
    Chroma's settings."""
    try:
        return settings_secrets(client.get_settings())
    except Exception:  # not Chroma's client: it may send anything, and says nothing of it
        return ()


def chroma_failed(what: str, error: BaseException, client: Any, hint: str = "") -> VectorIndexError:
    """The error of a call ``client`` failed (``what: the engine's words, hint``), with ``error`` as
    its cause; neither quotes a credential the client sends (:func:`client_secrets`,
    :mod:`..redaction`)."""
    secrets = client_secrets(client)
    failed = VectorIndexError(f"{what}: {mask(str(error), secrets)}{hint}")
    failed.__cause__ = masked_cause(error, secrets)  # as `from`: no context printed
    return failed


def forget_cached_client(path: str) -> None:
    """Drop Chroma's per-process cache of the client for ``path`` (it keeps a broken view of
    a folder that was damaged or replaced until the process restarts)."""
    try:
        from chromadb.api.shared_system_client import SharedSystemClient
    except ImportError:
        return
    cache = getattr(SharedSystemClient, "_identifier_to_system", None)
    if isinstance(cache, dict):
        for key in [k for k in cache if str(k) == str(path) or str(k).startswith(str(path))]:
            cache.pop(key, None)


def cosine_collection(client: Any, name: str, owner: str | None = None) -> Any:
    """``name`` in ``client``, created as a cosine HNSW collection if missing (marked as
    ``owner``'s then: see :mod:`.ownership`); we always pass our own embeddings (no Chroma
    embedding function)."""
    return client.get_or_create_collection(name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}},
                                           metadata={OWNER_KEY: owner} if owner else None)


def drop_collection(client: Any, name: str) -> None:
    """Delete collection ``name``; one already gone (a server restarted without its data, a
    collection deleted by hand) is what a drop wants, so it is no error."""
    from chromadb.errors import NotFoundError

    try:
        client.delete_collection(name)
    except NotFoundError:
        pass


def gone_hint(error: Exception) -> str:
    """What to do when ``error`` says the collection is gone from the engine; '' for any other."""
    from chromadb.errors import NotFoundError

    if not isinstance(error, NotFoundError):
        return ""
    return ("; the collection is gone from the Chroma engine (a server restarted without its data, or the "
            "collection deleted): call rebuild_index() to make it anew from the records")


def chroma_owner(client: Any, name: str) -> str | None:
    """The store id collection ``name`` is marked with (:mod:`.ownership`), read from the engine."""
    try:
        found = client.get_collection(name, embedding_function=None).metadata or {}
    except Exception as e:
        raise chroma_failed("Chroma read failed", e, client)
    return str(found[OWNER_KEY]) if found.get(OWNER_KEY) else None


def mark_chroma_owner(client: Any, collection: Any, store_id: str) -> None:
    """Mark ``collection`` (of ``client``) as ``store_id``'s, keeping its other metadata (Chroma
    replaces it whole)."""
    try:
        collection.modify(metadata={**dict(collection.metadata or {}), OWNER_KEY: store_id})
    except Exception as e:
        raise chroma_failed(f"Chroma could not mark the collection {collection.name!r}", e, client)


def compacted(client: Any, collection: Any, owner: str | None, batch: int) -> tuple[Any, int]:
    """``collection``'s live vectors copied, ``batch`` at a time, into a new collection that then
    takes its name (the old one is deleted); returns the new collection and the vectors kept."""
    name = collection.name
    scratch = f"{name[:500]}__compacting"  # within Chroma's 512 characters
    if scratch in {c.name for c in client.list_collections()}:
        client.delete_collection(scratch)
    fresh = cosine_collection(client, scratch, owner)  # new: any earlier scratch was deleted above
    kept, offset = 0, 0
    while True:
        part = collection.get(include=["embeddings", "metadatas"], limit=batch, offset=offset)
        if not part["ids"]:
            break
        fresh.add(ids=part["ids"], embeddings=part["embeddings"], metadatas=part["metadatas"])
        kept += len(part["ids"])
        offset += batch
    client.delete_collection(name)
    fresh.modify(name=name)
    return client.get_collection(name, embedding_function=None), kept


def server_client(url: str, shown: str) -> Any:
    """A client of the Chroma server at ``url`` (``scheme://host:port``, no query); ``shown``
    is the URL as an error may show it.

    Raises:
        ConfigurationError: the URL has a user part and Chroma's settings give credentials too.
        MissingDependencyError: chromadb is not installed (a server needs its client too).
        VectorIndexError: the server cannot be reached.
    """
    try:
        import chromadb
    except ImportError as e:
        raise missing("chromadb", "embedded") from e

    settings = client_settings()  # (with the CHROMA_CLIENT_AUTH_* variables, if set)
    credentials = url_credentials(url, shown)
    if credentials is not None:
        given = [f"CHROMA_CLIENT_AUTH_{name.upper()}" for name in ("provider", "credentials")
                 if getattr(settings, f"chroma_client_auth_{name}", None)]
        if given:  # (which one Chroma would send is a guess)
            raise ConfigurationError(
                f"the Chroma server URL {shown} has a user part (user:password@) and {' and '.join(given)} is "
                "set (Chroma's chroma_client_auth_* settings): give the credentials once, in the URL (sent as "
                "basic auth) or in Chroma's settings")
        settings = client_settings(chroma_client_auth_provider=BASIC_AUTH, chroma_client_auth_credentials=credentials)
    secrets = (*settings_secrets(settings), url_password(url))
    try:
        return chromadb.HttpClient(host=server_endpoint(url), ssl=url.startswith("https:"), settings=settings)
    except Exception as e:  # chromadb says ValueError("Could not connect to a Chroma server...")
        raise VectorIndexError(
            f"could not reach a Chroma server at {shown} ({mask(str(e), secrets)}); check the URL and that "
            "`chroma run` serves there") from masked_cause(e, secrets)


def server_endpoint(url: str) -> str:
    """What Chroma's client is given for the server at ``url`` (pure): its scheme, host, port and
    path (a server behind a proxy may sit under a prefix), without a user part. An ``http://``
    URL without a port is on 8000, where ``chroma run`` serves; an ``https://`` one on 443, since
    TLS is a proxy's in front of Chroma."""
    from urllib.parse import urlsplit, urlunsplit

    u = urlsplit(url)
    host = u.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host  # an IPv6 address
    port = u.port or (443 if u.scheme == "https" else 8000)
    return urlunsplit((u.scheme, f"{host}:{port}", u.path.rstrip("/"), "", ""))


def segment_folders(path: Path | None) -> list[Path]:
    """The HNSW segment folders of an embedded index at ``path`` (one per collection, named by
    its id); none for a server's index (``path`` None)."""
    if path is None or not path.is_dir():
        return []
    return [p for p in path.iterdir() if p.is_dir() and len(p.name) == 36 and p.name.count("-") == 4]
