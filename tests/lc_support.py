"""Shared helpers of the LangChain adapter tests (real LangChain callbacks, no mocks)."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage


class PromptRecorder(BaseCallbackHandler):
    """Records every prompt that reaches a model, through LangChain's own callbacks."""

    def __init__(self) -> None:
        self.prompts: list[list[BaseMessage]] = []

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]],
                            **kwargs: Any) -> None:
        self.prompts.extend(list(m) for m in messages)

    @property
    def last(self) -> list[BaseMessage]:
        assert self.prompts, "no model call was recorded"
        return self.prompts[-1]

    def last_text(self) -> str:
        return "\n".join(f"{m.type}: {m.text}" for m in self.last)


class _ResponsesHandler(BaseHTTPRequestHandler):
    """Answers OpenAI's Responses API (``POST /v1/responses``) with one text reply, recording each body."""

    protocol_version = "HTTP/1.1"
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append({"path": self.path, **body})
        n = len(type(self).bodies)
        out = json.dumps({
            "id": f"resp_{n}", "object": "response", "created_at": 0, "model": body.get("model", "m"),
            "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "output": [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": f"reply {n}", "annotations": []}]}],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def responses_api_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local stand-in for OpenAI's Responses API: its base URL and the request bodies it got."""
    bodies: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_ResponsesHandler,), {"bodies": bodies}))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
