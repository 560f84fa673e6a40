"""Any LlamaIndex LLM as the core's async LLM protocol.

The core asks for ``await llm.complete(messages, json_mode=..., max_tokens=...)``
with plain ``{"role", "content"}`` dicts; :class:`LlamaIndexLLM` converts them to
``ChatMessage`` and calls the LLM's ``achat``. JSON mode uses the LLM's own option
where it has one (``response_format`` on the OpenAI family, including
``OpenAILike``; a ``json_mode`` field, as on ``Ollama``); elsewhere the core's
prompt and its output validation do the work. An LLM whose ``achat`` is ``CustomLLM``'s
(which only runs its sync ``chat``) is called through ``chat`` on a daemon thread instead,
so ``LLMConfig.timeout_s`` ends a slow call and the library's event loop is never blocked.
"""

from __future__ import annotations

import functools
from typing import Any

from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.llms.custom import CustomLLM

from tiered_memory.aio import in_daemon_thread
from tiered_memory.errors import ConfigurationError, LLMError

_ROLES = {
    "system": MessageRole.SYSTEM,
    "user": MessageRole.USER,
    "assistant": MessageRole.ASSISTANT,
    "tool": MessageRole.TOOL,
}


def _is_openai_family(llm: BaseLLM) -> bool:
    return any(c.__name__ == "OpenAI" and c.__module__.startswith("llama_index.llms.openai")
               for c in type(llm).__mro__)


def sync_backed(llm: BaseLLM) -> bool:
    """Whether ``llm.achat`` is ``CustomLLM``'s, which runs the sync ``chat`` on the event loop
    (``MockLLM``, ``HuggingFaceLLM``, ``LlamaCPP``, most custom models): awaited there, a slow
    model blocks the library's loop and no timeout can end the wait."""
    defined_by = next((c for c in type(llm).__mro__ if "achat" in vars(c)), None)
    return defined_by is CustomLLM  # (its decorator makes a new function at each attribute access)


def to_chat_messages(messages: list[dict[str, str]]) -> list[ChatMessage]:
    """``{"role", "content"}`` dicts as LlamaIndex ``ChatMessage`` objects (new objects)."""
    out = []
    for n, m in enumerate(messages):
        role = m.get("role", "user")
        if role not in _ROLES:
            raise ConfigurationError(f"message {n}: unknown role {role!r}")
        out.append(ChatMessage(role=_ROLES[role], content=str(m.get("content", ""))))
    return out


class LlamaIndexLLM:
    """Wrap a LlamaIndex LLM (``OpenAI``, ``OpenAILike``, ``Ollama``, ``MockLLM``...)
    so :class:`~tiered_memory.TieredMemory` can use it for episodes and facts.

    ``TieredMemory(llm=<a LlamaIndex LLM>)`` wraps it automatically; build one
    yourself to reuse it elsewhere.

    Args:
        llm: any ``llama_index.core.llms.LLM``.

    Example:
        >>> from llama_index.core.llms import MockLLM
        >>> import asyncio
        >>> asyncio.run(LlamaIndexLLM(MockLLM()).complete([{"role": "user", "content": "hi"}]))
        'user: hi\\nassistant: '
    """

    def __init__(self, llm: BaseLLM) -> None:
        if not isinstance(llm, BaseLLM):
            raise ConfigurationError(
                f"LlamaIndexLLM wraps a llama_index LLM, got {type(llm).__name__}")
        self.llm = llm

    @property
    def name(self) -> str:
        model = getattr(self.llm, "model", None) or getattr(self.llm, "model_name", None)
        return f"llamaindex:{self.llm.class_name()}" + (f":{model}" if model else "")

    def _configured(self, *, json_mode: bool, max_tokens: int | None) -> tuple[BaseLLM, dict[str, Any]]:
        """The LLM to call (a copy when a per-call option must be a field) and call kwargs."""
        fields = type(self.llm).model_fields
        update: dict[str, Any] = {}
        kwargs: dict[str, Any] = {}
        if max_tokens is not None and "max_tokens" in fields:
            update["max_tokens"] = max_tokens
        if json_mode:
            if _is_openai_family(self.llm):
                kwargs["response_format"] = {"type": "json_object"}
            elif "json_mode" in fields:
                update["json_mode"] = True
        llm = self.llm.model_copy(update=update) if update else self.llm
        return llm, kwargs

    async def complete(
        self, messages: list[dict[str, str]], *, json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> str:
        """Chat with the wrapped LLM; returns the reply text.

        Raises:
            LLMError: the LLM raised (the cause is kept).
        """
        chat = to_chat_messages(messages)
        llm, kwargs = self._configured(json_mode=json_mode, max_tokens=max_tokens)
        try:
            response: ChatResponse
            if sync_backed(llm):  # its sync chat on a thread of its own, so a timeout can end the wait
                response = await in_daemon_thread(functools.partial(llm.chat, chat, **kwargs))
            else:
                response = await llm.achat(chat, **kwargs)
        except Exception as e:
            raise LLMError(f"{self.name} failed: {type(e).__name__}: {e}") from e
        return response.message.content or ""


def adapt(obj: Any) -> LlamaIndexLLM | None:
    """The core's hook (``tiered_memory.llm.adapters.resolve_llm``, through this package's entry point): wrap a LlamaIndex LLM, else None."""
    return LlamaIndexLLM(obj) if isinstance(obj, BaseLLM) else None
