"""Fake LlamaIndex LLMs for offline tests and examples.

LlamaIndex's ``MockLLM`` echoes its prompt, which a ``ReActAgent`` cannot parse.
:class:`ScriptedChatLLM` replays a script of replies (``"Thought: ...\\nAnswer: ..."``
for a ReAct agent) and records the messages of every call: exactly the prompt the
agent built from its ``Memory``. :class:`StuckLLM` is a local model that stopped
answering, until the test releases it.

Example:
    >>> from llama_index.core.llms import ChatMessage
    >>> llm = ScriptedChatLLM(responses=["Thought: I know.\\nAnswer: Miso"])
    >>> llm.chat([ChatMessage(role="user", content="cat?")]).message.content
    'Thought: I know.\\nAnswer: Miso'
    >>> llm.calls[0][0].content
    'cat?'
"""

from __future__ import annotations

import copy
import threading
from typing import Any, AsyncGenerator, Generator, List, Sequence

from llama_index.core.base.llms.types import (ChatMessage, ChatResponse, CompletionResponse, LLMMetadata,
                                              MessageRole)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.llms.mock import MockLLM

__all__ = ["ScriptedChatLLM", "StuckLLM"]


class ScriptedChatLLM(CustomLLM):
    """Replies with ``responses`` in order (cycling) and records each call's messages in ``calls``."""

    responses: List[str] = Field(min_length=1, description="Replies, used in order, cycling.")
    calls: List[List[ChatMessage]] = Field(default_factory=list, exclude=True,
                                           description="The messages of every chat call, copied.")

    @classmethod
    def class_name(cls) -> str:
        return "ScriptedChatLLM"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(is_chat_model=True, is_function_calling_model=False)

    def _reply(self, messages: Sequence[ChatMessage]) -> str:
        self.calls.append(copy.deepcopy(list(messages)))
        return self.responses[(len(self.calls) - 1) % len(self.responses)]

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=self._reply(messages)))

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Generator[ChatResponse, None, None]:
        text = self._reply(messages)
        yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=text)

    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> AsyncGenerator[ChatResponse, None]:
        text = self._reply(messages)

        async def gen() -> AsyncGenerator[ChatResponse, None]:
            yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=text)

        return gen()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self._reply([ChatMessage(role=MessageRole.USER, content=prompt)]))

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any
                        ) -> Generator[CompletionResponse, None, None]:
        text = self.complete(prompt).text
        yield CompletionResponse(text=text, delta=text)


class StuckLLM(MockLLM):
    """A ``MockLLM`` whose sync ``complete`` (which ``CustomLLM.achat`` runs on the event loop)
    hangs until :meth:`release`, or ``wait_s`` seconds: a local model that stopped answering.
    ``answered`` is set once it did answer (``MockLLM``'s echo of the prompt); each instance
    has events of its own, so a model released late cannot answer into another test.
    """

    wait_s: float = Field(default=30.0, description="The longest a call hangs unreleased.")
    _released: threading.Event = PrivateAttr(default_factory=threading.Event)
    _answered: threading.Event = PrivateAttr(default_factory=threading.Event)

    @classmethod
    def class_name(cls) -> str:
        return "StuckLLM"

    @property
    def answered(self) -> threading.Event:
        return self._answered

    def release(self) -> None:
        self._released.set()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self._released.wait(self.wait_s)
        try:
            answer: CompletionResponse = super().complete(prompt, formatted=formatted, **kwargs)
            return answer
        finally:
            self._answered.set()
