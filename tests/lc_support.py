"""Shared helpers of the LangChain adapter tests (real LangChain callbacks, no mocks)."""

from __future__ import annotations

from typing import Any

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
