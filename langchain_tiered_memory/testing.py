"""Fakes for offline tests and examples: a tool-calling chat model, and embeddings that fail.

LangChain's fake chat models do not implement ``bind_tools``, which
``create_agent`` needs. :class:`ScriptedToolModel` replays a script of
``AIMessage``\\ s (tool calls included) and accepts any tools.
:class:`FailingEmbeddings` is an embeddings provider that is down.

Example:
    >>> from langchain_core.messages import AIMessage
    >>> model = ScriptedToolModel(responses=[AIMessage("hi")])
    >>> model.bind_tools([]).invoke("hello").text
    'hi'
"""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.embeddings import Embeddings
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel

__all__ = ["FailingEmbeddings", "ScriptedToolModel"]


class ScriptedToolModel(FakeMessagesListChatModel):
    """Replays ``responses`` in order (cycling); tools bound to it are ignored."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "ScriptedToolModel":
        return self


class FailingEmbeddings(Embeddings):
    """LangChain ``Embeddings`` whose every call raises ``error``: a hosted provider that is down.

    Args:
        error: what each call raises (``RuntimeError("provider down")`` by default).
    """

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error if error is not None else RuntimeError("provider down")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise self.error

    def embed_query(self, text: str) -> list[float]:
        raise self.error
