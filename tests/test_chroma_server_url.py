"""Where a Chroma server URL sends the client: its scheme, host, port and path as written (a
server behind a TLS proxy at ``https://host`` is on 443, one under a path prefix is asked
there), and never its user part or query. Observed at a local HTTP server that records what
it is asked (and answers nothing a client could take for Chroma)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from tiered_memory import VectorIndexError
from tiered_memory.vector.chroma import ChromaVectorIndex


class Recorder(BaseHTTPRequestHandler):
    asked: list[str] = []

    def _answer(self) -> None:
        Recorder.asked.append(f"{self.command} {self.path} {self.headers.get('Authorization', '')}".strip())
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_CONNECT = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    Recorder.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_path_prefix_in_the_url_is_where_the_client_asks(recorder: str) -> None:
    with pytest.raises(VectorIndexError):
        ChromaVectorIndex.from_url(f"http://app:pw-s3cret@{recorder}/chroma?collection=app1")
    assert Recorder.asked and all(a.startswith("GET /chroma/api/") for a in Recorder.asked), Recorder.asked
    assert not any("Authorization" in a or "s3cret" in a for a in Recorder.asked)


def test_https_without_a_port_is_port_443(recorder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://{recorder}")  # the proxy is asked to CONNECT host:port
    with pytest.raises(VectorIndexError):
        ChromaVectorIndex.from_url("https://chroma.example.com")
    assert Recorder.asked and all(a == "CONNECT chroma.example.com:443" for a in Recorder.asked), Recorder.asked
