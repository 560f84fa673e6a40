"""Opening a Qdrant server: the error of a failed open and the traceback logged with it quote no
password or API key, and a server of a version qdrant-client does not support is said once, at
open, in our log (not by a warning of qdrant-client's thread, which also warned after our error
that the server could not be reached)."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import threading
import traceback
import warnings
from importlib.metadata import version
from typing import Any, Callable, Iterator

import httpx
import pytest

from tiered_memory import ConfigurationError, VectorIndexError
from tiered_memory.vector.qdrant import QdrantVectorIndex

from http_support import QuietHandler, serving
from servers import free_port

PASSWORD = "pw-h1dden-9f3"
API_KEY = "qk-h1dden-api-7c1"
CLIENT = version("qdrant-client")


def _logged(error: BaseException) -> str:
    """What ``log.exception`` or an uncaught error prints: the error and every error chained below it."""
    return "".join(traceback.format_exception(error))


def _version_checks_done() -> None:
    """Wait for qdrant-client's own version check (a thread per client it opens), if one runs."""
    for thread in threading.enumerate():
        if "_check_compatibility" in thread.name:
            thread.join(2.0)


@pytest.mark.parametrize("open_", [lambda url: QdrantVectorIndex(url=url),
                                   lambda url: QdrantVectorIndex.from_url(url + "?collection=app1")])
def test_a_url_with_a_user_part_is_refused_before_anything_is_sent(open_: Callable[[str], object]) -> None:
    """qdrant-client reads a URL's scheme, host, port and path and never sends its ``user:password@``:
    behind a proxy asking for basic auth, every call was refused with no hint why. Refused now, naming
    the API key setting and never the password, before anything connects."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        listening.setblocking(False)
        port = listening.getsockname()[1]
        with pytest.raises(ConfigurationError, match=rf"the Qdrant server URL http://127.0.0.1:{port} has a user part "
                           r"\(user:password@\), which qdrant-client never sends: .*QDRANT_API_KEY") as info:
            open_(f"http://app:{PASSWORD}@127.0.0.1:{port}")
        with pytest.raises(BlockingIOError):
            listening.accept()  # nobody connected
    assert PASSWORD not in _logged(info.value)


def test_an_unreadable_url_keeps_its_password_out_of_the_logged_traceback() -> None:
    """A port out of range: urllib3's LocationParseError (qdrant-client reads the URL with it) quoted
    the whole URL, password included, in the cause chained below our message. Such a URL has a user
    part, so it is refused before qdrant-client reads it, with nothing chained."""
    with pytest.raises(ConfigurationError, match="<an unreadable URL> has a user part") as info:
        QdrantVectorIndex(url=f"http://app:{PASSWORD}@127.0.0.1:99999")
    assert PASSWORD not in _logged(info.value) and info.value.__cause__ is None


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
def test_an_api_key_read_with_its_newline_is_masked_and_the_newline_shown() -> None:
    """A key read from a file (a mounted secret) with its line end: h11 refuses the header, quoting
    its value as bytes (``b'key\\n'``), a form the mask did not know, so the key was in our message
    and in the chained errors. Masked now, in every form, with the newline left to see."""
    with socket.socket() as listening:  # connections wait in its backlog: the request is refused before sending
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(VectorIndexError) as info:
            QdrantVectorIndex(url=url, api_key=API_KEY + "\n")
    assert "Illegal header value b'***\\n'" in str(info.value)
    logged = _logged(info.value)
    assert API_KEY not in logged
    assert "LocalProtocolError: Illegal header value b'***\\n'" in logged


@pytest.fixture
def qdrant_stub() -> Iterator[Callable[[str], str]]:
    """``start(version)``: the URL of a server answering as Qdrant ``version`` whose collections all
    exist, and any other call with an error page that quotes the call's API key and Authorization."""
    with contextlib.ExitStack() as servers:

        def start(server_version: str) -> str:
            class Handler(QuietHandler):
                def do_GET(self) -> None:
                    status, body = 200, {"title": "qdrant - vector search engine", "version": server_version}
                    if self.path.endswith("/exists"):
                        body = {"result": {"exists": True}, "status": "ok", "time": 0.0}
                    elif self.path != "/":  # as a proxy may refuse a call: quoting the request's headers
                        status, body = 502, {"refused, with api-key": self.headers.get("api-key"),
                                             "authorization": self.headers.get("Authorization")}
                    self.reply_json(body, status)

                do_POST = do_PUT = do_GET

            return f"http://127.0.0.1:{servers.enter_context(serving(Handler))}"

        yield start


@pytest.mark.parametrize("server_version, said", [("0.9.1", True), (CLIENT, False)])
def test_an_unsupported_server_version_is_logged_at_open(
        qdrant_stub: Callable[[str], str], caplog: pytest.LogCaptureFixture, server_version: str, said: bool) -> None:
    """qdrant-client checked the version in a thread of its own and warned (a UserWarning, at any
    later moment: under pytest's warnings-as-errors, in whichever test ran then). The index asks it
    once the server has answered and logs a mismatch, naming both versions and the fix."""
    url = qdrant_stub(server_version)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING, "tiered_memory"):
        warnings.simplefilter("always")
        QdrantVectorIndex(url=url).close()
        _version_checks_done()
    assert [str(w.message) for w in caught] == []
    mismatch = [r.getMessage() for r in caplog.records if "does not support" in r.getMessage()]
    assert mismatch == ([f"the Qdrant server at {url} runs version 0.9.1, which qdrant-client {CLIENT} does not "
                         "support (their major versions must match, their minor ones differ by 1 at most): calls "
                         "may fail. Install the qdrant-client release of the server's version, or upgrade the "
                         "server"] if said else [])


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
def test_a_call_that_fails_keeps_the_api_key_out_of_the_logged_traceback(qdrant_stub: Callable[[str], str]) -> None:
    """A failed call's error masked the key in our message; qdrant-client's UnexpectedResponse,
    chained below it, quoted the error page that held it."""
    index = QdrantVectorIndex(url=qdrant_stub(CLIENT), api_key=API_KEY)
    refused = r'(?s)Qdrant count failed at .*502.*"refused, with api-key": "\*\*\*"'
    with pytest.raises(VectorIndexError, match=refused) as info:
        index.count()
    index.close()
    logged = _logged(info.value)
    assert API_KEY not in logged
    assert "UnexpectedResponse: Unexpected Response: 502" in logged


@pytest.mark.parametrize("credential", ["basic auth", "authorization header"])
def test_a_client_passed_in_keeps_its_credentials_out_of_the_logged_traceback(
        qdrant_stub: Callable[[str], str], credential: str) -> None:
    """The refusal of a URL's user part says to pass a client made with ``auth=httpx.BasicAuth``: its
    header (or one given as ``headers=``), quoted by a failed call's error page, was unmasked."""
    from qdrant_client import QdrantClient

    basic = "Basic " + base64.b64encode(f"app:{PASSWORD}".encode()).decode()
    given: dict[str, Any] = ({"auth": httpx.BasicAuth("app", PASSWORD)} if credential == "basic auth"
                             else {"headers": {"Authorization": f"Bearer {API_KEY}"}})
    client = QdrantClient(url=qdrant_stub(CLIENT), check_compatibility=False, **given)
    index = QdrantVectorIndex(client=client)
    with pytest.raises(VectorIndexError, match=r'"authorization": "\*\*\*"') as info:
        index.count()
    client.close()
    logged = _logged(info.value)
    assert PASSWORD not in logged and API_KEY not in logged and basic.split()[1] not in logged, logged


@pytest.mark.filterwarnings("ignore:Auth token provider is used with an insecure connection")
def test_the_tokens_of_a_clients_token_provider_are_masked(qdrant_stub: Callable[[str], str]) -> None:
    """qdrant-client's ``auth_token_provider=`` is called before each request for a fresh bearer
    token, which no setting holds: a failed call's error page quoted it unmasked. Each token it
    returns is remembered to mask now, and it is called once a request still (each open's and count's)."""
    from qdrant_client import QdrantClient

    calls: list[str] = []

    def provider() -> str:
        calls.append(f"{API_KEY}-{len(calls) + 1}")
        return calls[-1]

    client = QdrantClient(url=qdrant_stub(CLIENT), check_compatibility=False, auth_token_provider=provider)
    errors = []
    for collection in ("app1", "app2"):  # a second index on the client: its tokens masked, not wrapped twice
        with pytest.raises(VectorIndexError, match=r'"authorization": "Bearer \*\*\*"') as info:
            QdrantVectorIndex(client=client, collection=collection).count()
        errors.append(_logged(info.value))
    client.close()
    assert all(API_KEY not in logged for logged in errors), errors
    assert len(calls) == 4, calls


def test_an_unreachable_server_is_said_once_by_the_error() -> None:
    """qdrant-client's version check warned "Failed to obtain server version" after the open had
    failed with our error saying the server cannot be reached (pyproject had to ignore it: it failed
    whichever test ran next)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(VectorIndexError, match="could not open the Qdrant server"):
            QdrantVectorIndex(url=f"http://127.0.0.1:{free_port()}")
        _version_checks_done()
    assert [str(w.message) for w in caught] == []
