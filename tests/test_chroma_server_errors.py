"""A Chroma server's errors quote no credential the client sends: an error page that echoes the
request's ``Authorization`` header (as a proxy's may) reached our message and the error chained
below it, which every logged traceback prints. The credentials are Chroma's own (``headers=`` of
a client passed in, ``chroma_client_auth_*`` settings, or the ``CHROMA_CLIENT_AUTH_*`` variables
that a URL's client reads too, or a URL's ``user:password@``, sent as basic auth:
tests/test_chroma_server_url.py); observed at a local HTTP stub."""

from __future__ import annotations

import base64
import json
import traceback
from typing import Any, Iterator

import chromadb
import pytest
from chromadb.config import Settings

from tiered_memory import ConfigurationError, VectorIndexError
from tiered_memory.vector.chroma import ChromaVectorIndex
from tiered_memory.vector.chroma_scope import SCOPED

from http_support import QuietHandler, serving

TOKEN = "ck-h1dden-tok-55"
TOKEN_PROVIDER = "chromadb.auth.token_authn.TokenAuthClientProvider"
BASIC_PROVIDER = "chromadb.auth.basic_authn.BasicAuthClientProvider"
_DB = {"id": "00000000-0000-0000-0000-000000000001", "name": "default_database", "tenant": "default_tenant"}


def _logged(error: BaseException) -> str:
    """What ``log.exception`` or an uncaught error prints: the error and every error chained below it."""
    return "".join(traceback.format_exception(error))


class Stub(QuietHandler):
    """A server that lets a client connect (identity, tenant, database), makes a collection (one
    already scoped: see :mod:`.chroma_scope`) when ``opens``, and refuses any other call with a page
    quoting its credentials."""

    opens = False

    def _answer(self) -> None:
        status, body = 200, _DB if "/databases/" in self.path else {"name": "default_tenant"}
        if self.path.endswith("/auth/identity"):
            body = {"user_id": "u", "tenant": "default_tenant", "databases": ["default_database"]}
        elif self.path.endswith("/collections") and self.command == "POST" and Stub.opens:
            name = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["name"]
            body = {"id": "00000000-0000-0000-0000-000000000002", "name": name, "metadata": {SCOPED: True},
                    "configuration_json": {}, "dimension": None, "tenant": "default_tenant",
                    "database": "default_database", "version": 0, "log_position": 0}
        elif "/collections" in self.path:
            status, body = 502, {"refused": [self.headers.get("Authorization"), self.headers.get("X-Chroma-Token")]}
        self.reply_json(body, status)

    do_GET = do_POST = do_PUT = do_DELETE = _answer


@pytest.fixture
def stub() -> Iterator[int]:
    """The port of a :class:`Stub` (refusing to make collections unless a test sets ``opens``)."""
    Stub.opens = False
    with serving(Stub) as port:
        yield port


def _client(port: int, **settings: Any) -> Any:
    headers = settings.pop("headers", None)
    return chromadb.HttpClient(host="127.0.0.1", port=port, headers=headers,
                               settings=Settings(anonymized_telemetry=False, **settings))


@pytest.mark.parametrize("kind", ["bearer header", "token setting", "basic setting"])
def test_an_open_refused_with_the_credentials_quoted_masks_them(stub: int, kind: str) -> None:
    client = {"bearer header": lambda: _client(stub, headers={"Authorization": f"Bearer {TOKEN}"}),
              "token setting": lambda: _client(stub, chroma_client_auth_provider=TOKEN_PROVIDER,
                                               chroma_client_auth_credentials=TOKEN),
              "basic setting": lambda: _client(stub, chroma_client_auth_provider=BASIC_PROVIDER,
                                               chroma_client_auth_credentials=f"admin:{TOKEN}")}[kind]()
    with pytest.raises(VectorIndexError, match=r"could not open Chroma collection 'tiered_memory': .*\*\*\*") as info:
        ChromaVectorIndex(client=client)
    logged = _logged(info.value)
    assert TOKEN not in logged and base64.b64encode(f"admin:{TOKEN}".encode()).decode() not in logged, logged
    assert "tiered_memory.redaction.MaskedError: builtins.Exception: {\"refused\"" in logged  # what failed, still said


def test_a_url_whose_client_reads_credentials_from_the_environment_masks_them(
        stub: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chroma's settings read ``CHROMA_CLIENT_AUTH_*``, so the client ``from_url`` builds sends them."""
    monkeypatch.setenv("CHROMA_CLIENT_AUTH_PROVIDER", TOKEN_PROVIDER)
    monkeypatch.setenv("CHROMA_CLIENT_AUTH_CREDENTIALS", TOKEN)
    with pytest.raises(VectorIndexError, match=r"\[\"Bearer \*\*\*\", null\]") as info:
        ChromaVectorIndex.from_url(f"http://127.0.0.1:{stub}?collection=app1")
    assert TOKEN not in _logged(info.value)


def test_a_url_whose_user_part_is_sent_masks_it(stub: int) -> None:
    """The URL's ``user:password@`` is sent as basic auth: the page quoting its header shows it masked."""
    with pytest.raises(VectorIndexError, match=r"\[\"Basic \*\*\*\", null\]") as info:
        ChromaVectorIndex.from_url(f"http://admin:{TOKEN}@127.0.0.1:{stub}?collection=app1")
    logged = _logged(info.value)
    assert TOKEN not in logged and base64.b64encode(f"admin:{TOKEN}".encode()).decode() not in logged, logged


def test_a_call_refused_after_the_open_masks_the_credentials(stub: int) -> None:
    Stub.opens = True
    index = ChromaVectorIndex(client=_client(stub, headers={"X-Chroma-Token": TOKEN}))
    with pytest.raises(VectorIndexError, match=r"Chroma count failed: .*\[null, \"\*\*\*\"\]") as info:
        index.count()
    with pytest.raises(VectorIndexError) as owner:
        index.owner()
    index.close()
    assert TOKEN not in _logged(info.value) + _logged(owner.value)


def test_an_unreadable_url_is_refused_without_its_password() -> None:
    """A port out of range (urllib3 quotes the whole URL when it fails on one) is refused before
    Chroma's client sees the URL, with nothing chained."""
    with pytest.raises(ConfigurationError, match="<an unreadable URL> cannot be read") as info:
        ChromaVectorIndex.from_url(f"http://app:{TOKEN}@127.0.0.1:99999")
    assert TOKEN not in _logged(info.value) and info.value.__cause__ is None
