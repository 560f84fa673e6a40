"""Local HTTP stubs for the tests: a JSON endpoint for the adapter tests (the real provider
clients, LangChain's ``ChatOpenAI`` and LlamaIndex's ``OpenAILike``, send their requests over HTTP
to it, and the test reads what reached the wire), and the pieces every stub server is made of
(:class:`QuietHandler`, which answers JSON, and :func:`serving`), which the vector servers' error
tests use too. Framework-free, so the LangChain and the LlamaIndex tests share it."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

# the answer to the n-th request (from 1), given its JSON body
Respond = Callable[[dict[str, Any], int], dict[str, Any]]


class QuietHandler(BaseHTTPRequestHandler):
    """A stub's request handler: answers with :meth:`reply_json` and logs nothing."""

    def reply_json(self, body: Any, status: int = 200) -> None:
        """Answers the request with ``body`` as JSON, with ``status``."""
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serves ``handler`` on a free local port, which it yields; shut down and closed after (its
    thread polls every 0.05 s, so the shutdown takes no longer)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def json_server(respond: Respond, *, delay: float = 0.0) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Serves ``POST``s with ``respond``'s JSON; yields the base URL (``.../v1``) and the requests.

    Each request is recorded as its body plus its ``"path"``, when it is answered: ``delay``
    seconds after it arrived, so a client that gave up before then left no record.
    """
    requests: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like uvicorn under llama.cpp's server

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay)
            with lock:
                requests.append({"path": self.path, **body})
                n = len(requests)
            self.reply_json(respond(body, n))

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}/v1", requests


def chat_completion(text: str = '{"ok": true}') -> Respond:
    """Answers OpenAI's Chat Completions API (``POST /v1/chat/completions``) with ``text``."""

    def respond(body: dict[str, Any], n: int) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    return respond
