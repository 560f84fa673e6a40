"""A fake tool-calling chat model for offline tests and examples.

LangChain's fake chat models do not implement ``bind_tools``, which
``create_agent`` needs. :class:`ScriptedToolModel` replays a script of
``AIMessage``\\ s (tool calls included) and accepts any tools.

Example:
    >>> from langchain_core.messages import AIMessage
    >>> model = ScriptedToolModel(responses=[AIMessage("hi")])
    >>> model.bind_tools([]).invoke("hello").text
    'hi'
"""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel

__all__ = ["ScriptedToolModel"]


class ScriptedToolModel(FakeMessagesListChatModel):
    """Replays ``responses`` in order (cycling); tools bound to it are ignored."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "ScriptedToolModel":
        return self
