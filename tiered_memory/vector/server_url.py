"""A vector server's URL and the collection a memory keeps on it, from one configuration
string (``vector_store=`` or ``TIERED_MEMORY_VECTOR_STORE``): ``http://host:8000?collection=app1``
for Chroma, ``qdrant+http://host:6333?collection=app1`` for Qdrant (pure).

Apps sharing a server need a collection each: ``rebuild_index()`` drops and refills the whole
collection, a full repair deletes the vectors its record store does not hold, and
``forget_user`` deletes a user id's vectors, whichever app wrote them. A collection records
the record store that owns it, and another store's is refused at open (:mod:`.ownership`).

Invariants: the query string never reaches the HTTP client (the URL handed on keeps scheme,
credentials, host, port and path); a collection name is checked against the engine's own
rules before anything is opened or written; an error shows no password, API key or query
value (:func:`.base.shown_url`) and no credential a Qdrant client sends (:func:`qdrant_secrets`, and
the tokens of its token provider: :func:`remember_qdrant_tokens`, which wraps it in the client);
a Qdrant server URL with a user part is refused, since qdrant-client never sends it
(:func:`check_qdrant_server`); a Chroma server URL's is read as basic auth (:func:`url_credentials`).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from ..errors import ConfigurationError
from ..redaction import RememberedTokens
from .base import shown_url

#: the collection of a memory whose configuration names none
DEFAULT_COLLECTION = "tiered_memory"

# Chroma 1.x (the server says: 3-512 characters from [a-zA-Z0-9._-], starting and ending with
# [a-zA-Z0-9], no "..", not an IPv4 address)
_CHROMA_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]{1,510}[a-zA-Z0-9]")
_IPV4 = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3}){3}")
# Qdrant (the server's rule, which qdrant-client's local mode copies): 1-255 characters, none
# of these, and not "." or ".." (the name is a folder on the server's disk)
_QDRANT_FORBIDDEN = '<>:"/\\|?*\0\x1f'
# a header whose value is a credential, by its name (``headers=`` of a client carries any header)
_CREDENTIAL_HEADER = re.compile("auth|token|key|secret|cookie|password|credential|session", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class ServerAddress:
    """Where a vector server is (``url``, with no query) and the memory's ``collection`` on it."""

    url: str
    collection: str


def collection_problem(name: str, engine: str) -> str | None:
    """Why ``engine`` ("chroma" or "qdrant") would refuse ``name`` as a collection, or ``None``."""
    if engine == "chroma":
        if not _CHROMA_NAME.fullmatch(name):
            return ("a Chroma collection name has 3-512 characters from a-z, A-Z, 0-9, '.', '_' and '-', "
                    "and starts and ends with a letter or digit")
        if ".." in name:
            return "a Chroma collection name holds no '..'"
        if _IPV4.fullmatch(name):
            return "a Chroma collection name is not an IPv4 address"
        return None
    if not 1 <= len(name) <= 255 or name in (".", ".."):
        return "a Qdrant collection name has 1-255 characters and is not '.' or '..'"
    bad = sorted({c for c in name if c in _QDRANT_FORBIDDEN})
    if bad:
        return f"a Qdrant collection name holds none of < > : \" / \\ | ? * NUL \\x1f (found {bad[0]!r})"
    return None


def check_collection(name: object, engine: str) -> str:
    """``name``, a collection name ``engine`` accepts.

    Raises:
        ConfigurationError: not a string, or a name the engine would refuse (the rule is named).
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"collection must be a str, got {type(name).__name__}")
    problem = collection_problem(name, engine)
    if problem is not None:
        shown = repr(name if len(name) <= 80 else name[:80] + "...")
        raise ConfigurationError(f"collection {shown} cannot be used: {problem}")
    return name


def check_qdrant_server(url: str | None, collection: object) -> None:
    """Refuse, before anything is opened, a ``collection`` Qdrant would refuse and a server ``url``
    with a user part (``user:password@``): qdrant-client reads only the URL's scheme, host, port
    and path, so a proxy's basic auth would refuse every call with no hint of why.

    Raises:
        ConfigurationError: either (the message names the API key setting, never the password).
    """
    check_collection(collection, "qdrant")
    try:
        named = url is not None and urlsplit(url).username is not None
    except ValueError:  # (the client says what it cannot read)
        return
    if named:
        raise ConfigurationError(
            f"the Qdrant server URL {shown_url(str(url))} has a user part (user:password@), which qdrant-client "
            "never sends: remove it and give the server's API key in QDRANT_API_KEY (api_key= of "
            "QdrantVectorIndex), or, for a proxy's basic auth, pass a client: QdrantVectorIndex(client="
            "QdrantClient(url=..., auth=httpx.BasicAuth(user, password)))")


def url_credentials(url: str, shown: str) -> str | None:
    """The ``user:password`` of ``url``'s user part, percent-decoded, as basic auth sends it (a
    missing password is empty, as httpx and requests send it); ``None`` when it has none. ``shown``
    is the URL as an error may show it.

    Raises:
        ConfigurationError: a user name holding a ':' (basic auth ends the name at the first one).
    """
    parts = urlsplit(url)
    if not parts.username and parts.password is None:  # (``http://@host`` names no one)
        return None
    user = unquote(parts.username or "")
    if ":" in user:
        raise ConfigurationError(f"the server URL {shown} cannot be used: its user name holds a ':' (%3A), "
                                 "where basic auth ends the name (the server would read another user)")
    return f"{user}:{unquote(parts.password or '')}"


def url_password(url: object) -> str | None:
    """The password of a server's URL, to mask wherever an error may quote it."""
    try:
        return urlsplit(url).password if isinstance(url, str) else None
    except ValueError:
        return None


def qdrant_secrets(client: Any, url: str | None = None, api_key: str | None = None) -> tuple[str | None, ...]:
    """What a Qdrant client sends to authenticate, to mask wherever an error may quote it: the
    password of ``url`` and of the client's URL, ``api_key`` and the client's, its credential
    headers (``headers=``) whole and without their scheme (``Bearer``), and the header an
    ``auth=httpx.BasicAuth(...)`` sends, whole and without ``Basic`` (read from the client's
    public ``init_options``)."""
    options = getattr(client, "init_options", None) or {}
    found = [url_password(url), api_key, url_password(options.get("url")), options.get("api_key")]
    headers = dict(options.get("headers") or {})
    try:
        from httpx import BasicAuth, Request

        auth = options.get("auth")
        if isinstance(auth, BasicAuth):  # (its flow only sets the header: no I/O)
            sent = next(auth.auth_flow(Request("GET", "http://localhost")))
            headers["auth= of the client"] = sent.headers["Authorization"]
    except Exception:  # (no httpx, or an auth of another kind)
        pass
    return (*found, *credential_headers(headers))


def remember_qdrant_tokens(client: Any) -> RememberedTokens | None:
    """The tokens the ``auth_token_provider=`` of Qdrant ``client`` returns from now on, to mask:
    the provider is wrapped in place, in the client's REST auth and where its gRPC channels read it
    (one made before keeps the bare provider), and calls it once a request as before; a client
    another index wrapped keeps its wrapper. ``None`` without a provider, with an async one (which
    a sync client cannot call), or when qdrant-client keeps it elsewhere (tests/test_qdrant_server.py
    says so on an upgrade)."""
    options: dict[str, Any] = getattr(client, "init_options", None) or {}
    provider: Callable[[], Any] | None = options.get("auth_token_provider")
    if provider is None or inspect.iscoroutinefunction(provider):
        return None
    remote = getattr(client, "_client", None)  # (qdrant-client 1.x: QdrantRemote, and its httpx auth)
    bearer = (getattr(remote, "_rest_args", None) or {}).get("auth")
    current = getattr(bearer, "auth_token_provider", None)
    if isinstance(current, RememberedTokens):
        return current
    if bearer is None or current is not provider:
        return None
    wrapped = RememberedTokens(options["auth_token_provider"])
    bearer.auth_token_provider = wrapped
    if remote is not None and getattr(remote, "_auth_token_provider", None) is provider:
        remote._auth_token_provider = wrapped
    return wrapped


def credential_headers(headers: object) -> list[str]:
    """The values of the credential headers in ``headers`` (by name: ``Authorization``, ``api-key``,
    ``X-Chroma-Token``, ...), each whole and without its scheme (``Bearer``, ``Basic``)."""
    items = headers.items() if isinstance(headers, dict) else ()
    sent = [str(value) for name, value in items if _CREDENTIAL_HEADER.search(str(name))]
    return [*sent, *(part for value in sent for part in value.split(None, 1)[1:])]


def server_address(url: str, engine: str, collection: str | None = None) -> ServerAddress:
    """The server and collection that ``url`` (``scheme://host:port[?collection=NAME]``) and
    ``collection`` name together; the default collection when neither names one.

    Raises:
        ConfigurationError: an unreadable URL, a query parameter other than one ``collection``,
            a collection the engine would refuse, or two different collections named.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigurationError(f"the vector server URL {shown_url(url)} cannot be read: "
                                 "write it as scheme://host:port?collection=NAME") from None
    if set(query) - {"collection"} or len(query.get("collection", ())) > 1 or parts.fragment:
        # (the other parameters are not named: one could be a key pasted in the wrong place)
        raise ConfigurationError(
            f"the vector server URL {shown_url(url)} takes one query parameter, ?collection=NAME, and no "
            "other (a Qdrant API key goes in QDRANT_API_KEY)")
    named = [check_collection(n, engine) for n in query.get("collection", [])]
    if collection is not None:
        check_collection(collection, engine)
        if named and named[0] != collection:
            raise ConfigurationError(f"the URL names collection {named[0]!r} and collection= names "
                                     f"{collection!r}: name it once")
        named = [collection]
    return ServerAddress(url=urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")),
                         collection=named[0] if named else DEFAULT_COLLECTION)
