"""Where a Chroma server URL sends the client: its scheme, host, port and path as written (a
server behind a TLS proxy at ``https://host`` is on 443, one under a path prefix is asked
there), never its query, and its user part as basic auth (Chroma's ``BasicAuthClientProvider``,
as ``CHROMA_CLIENT_AUTH_*`` would set it). Observed at a local HTTP server that records what
it is asked (and answers nothing a client could take for Chroma)."""

from __future__ import annotations

import base64
import traceback
from typing import Iterator

import pytest

from tiered_memory import ConfigurationError, VectorIndexError
from tiered_memory.vector.chroma import ChromaVectorIndex
from tiered_memory.vector.server_url import url_credentials

from http_support import QuietHandler, serving

PASSWORD = "pw@s3cret"  # (a traceback shows the source lines, so the tests name it, never write it)
IN_URL = "pw%40s3cret"


class Recorder(QuietHandler):
    asked: list[str] = []

    def _answer(self) -> None:
        Recorder.asked.append(f"{self.command} {self.path} {self.headers.get('Authorization', '')}".strip())
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_CONNECT = _answer


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.asked = []
    with serving(Recorder) as port:
        yield f"127.0.0.1:{port}"


def _logged(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


def test_a_path_prefix_in_the_url_is_where_the_client_asks(recorder: str) -> None:
    with pytest.raises(VectorIndexError):
        ChromaVectorIndex.from_url(f"http://{recorder}/chroma?collection=app1")
    assert Recorder.asked and all(a.startswith("GET /chroma/api/") for a in Recorder.asked), Recorder.asked


def test_a_user_part_in_the_url_is_sent_as_basic_auth(recorder: str) -> None:
    """A URL's ``user:password@`` was dropped without a word: a server (or a proxy) asking for basic
    auth refused every call with no hint why. It is sent now, percent-decoded, the way Chroma sends
    ``chroma_client_auth_credentials`` with its ``BasicAuthClientProvider``; no error shows it."""
    with pytest.raises(VectorIndexError) as info:
        ChromaVectorIndex.from_url(f"http://app:{IN_URL}@{recorder}/chroma?collection=app1")
    basic = "Basic " + base64.b64encode(f"app:{PASSWORD}".encode()).decode()
    assert Recorder.asked and all(a.endswith(basic) for a in Recorder.asked), Recorder.asked
    logged = _logged(info.value)
    assert "s3cret" not in logged and basic.split()[1] not in logged, logged


@pytest.mark.parametrize("url, sent", [
    ("http://host:8000", None), ("http://@host", None),
    ("http://app@host", "app:"), ("http://:tok@host", ":tok"),  # as httpx and requests send them
    ("http://a%20b:p%3Aw%40x@host", "a b:p:w@x"),  # (a ':' in the password is the password's)
])
def test_the_credentials_of_a_url_are_its_user_part_decoded(url: str, sent: str | None) -> None:
    assert url_credentials(url, "shown") == sent


@pytest.mark.parametrize("given", ["CHROMA_CLIENT_AUTH_PROVIDER", "CHROMA_CLIENT_AUTH_CREDENTIALS"])
def test_a_user_part_and_chromas_own_credentials_are_refused_together(
        recorder: str, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    """Two credentials for one server: which one Chroma would send is a guess. Refused before
    anything is sent, naming both settings and never the password."""
    monkeypatch.setenv(given, "chromadb.auth.token_authn.TokenAuthClientProvider"
                       if given.endswith("PROVIDER") else "tok-elsewhere")
    with pytest.raises(ConfigurationError, match=r"has a user part \(user:password@\) and "
                       rf"{given} is set .*give the credentials once") as info:
        ChromaVectorIndex.from_url(f"http://app:{IN_URL}@{recorder}?collection=app1")
    assert Recorder.asked == [] and "s3cret" not in _logged(info.value)


def test_a_user_name_holding_a_colon_is_refused(recorder: str) -> None:
    """Basic auth splits ``user:password`` at its first colon, so a user name holding one
    (``%3A`` in the URL) would log in as another user."""
    with pytest.raises(ConfigurationError, match="user name holds a ':'") as info:
        ChromaVectorIndex.from_url(f"http://ap%3Ap:{IN_URL}@{recorder}")
    assert Recorder.asked == [] and "s3cret" not in _logged(info.value)


def test_https_without_a_port_is_port_443(recorder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://{recorder}")  # the proxy is asked to CONNECT host:port
    with pytest.raises(VectorIndexError):
        ChromaVectorIndex.from_url("https://chroma.example.com")
    assert Recorder.asked and all(a == "CONNECT chroma.example.com:443" for a in Recorder.asked), Recorder.asked
