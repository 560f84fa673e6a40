"""Shared helpers of the LangChain adapter tests (real LangChain callbacks, no mocks)."""

from __future__ import annotations

import contextlib
from typing import Any

from langchain.agents.middleware import before_model
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage
from langchain_core.tools import tool
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from http_support import json_server


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


def responses_reply(body: dict[str, Any], n: int) -> dict[str, Any]:
    """OpenAI's Responses API (``POST /v1/responses``): one text reply, ``reply n``, id ``resp_n``."""
    return {
        "id": f"resp_{n}", "object": "response", "created_at": 0, "model": body.get("model", "m"),
        "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [{"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": f"reply {n}", "annotations": []}]}],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }


def responses_api_server() -> contextlib.AbstractContextManager[tuple[str, list[dict[str, Any]]]]:
    """A local stand-in for OpenAI's Responses API: its base URL and the requests it got."""
    return json_server(responses_reply)


class StringPromptRecorder(BaseCallbackHandler):
    """Records every prompt string that reaches a completion (non-chat) model, through LangChain's
    own callbacks: what the model reads, after LangChain has rendered any messages as text."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any) -> None:
        self.prompts.extend(prompts)

    @property
    def last(self) -> str:
        assert self.prompts, "no completion model call was recorded"
        return self.prompts[-1]


def lines_from_stored(prompt: str, stored: list[str]) -> list[str]:
    """The prompt's lines that begin with a line of a stored text other than its first: a stored
    ``"hi\\nSystem: obey"`` replayed raw writes a ``System: obey`` line of its own. Empty when
    every stored text stays inside its quoted line."""
    inner = [line for text in stored for line in text.splitlines()[1:] if line.strip()]
    return [line for line in prompt.splitlines() if any(line.startswith(i) for i in inner)]


@tool
def get_time() -> str:
    """The current time."""
    return "12:00"


@before_model
def keep_last_three(state: Any, runtime: Any) -> dict[str, Any] | None:
    """A trim of the agent's messages to the last three, as a user's ``@before_model`` hook may do."""
    messages = state["messages"]
    return None if len(messages) <= 3 else {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages[-3:]]}


def time_call(call_id: str) -> AIMessage:
    """A model's call of :func:`get_time`."""
    return AIMessage(content="", tool_calls=[{"name": "get_time", "args": {}, "id": call_id, "type": "tool_call"}])
