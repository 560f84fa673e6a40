"""Use any LangChain chat model as the LLM of :class:`~tiered_memory.TieredMemory`.

The core speaks a small async protocol (messages as ``{"role", "content"}`` dicts in,
text out). :class:`LangChainLLM` adapts a LangChain ``BaseChatModel`` to it, so
``ChatOpenAI`` works against OpenAI or any OpenAI-compatible server (Ollama, vLLM,
llama.cpp's server), and every other LangChain chat model works through ``invoke``; so does
a model wrapped the usual ways (``.with_retry()``, ``.bind(...)``, ``.bind_tools(...)``,
``.with_config(...)``), or any Runnable that takes messages and answers with an ``AIMessage``.

Example:
    >>> from langchain_openai import ChatOpenAI  # doctest: +SKIP
    >>> llm = LangChainLLM(ChatOpenAI(base_url="http://127.0.0.1:8080/v1",  # doctest: +SKIP
    ...                               api_key="not-needed", model="qwen"))
    >>> await llm.complete([{"role": "user", "content": "Say hi"}])  # doctest: +SKIP
    'Hi!'
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Mapping, Sequence

from tiered_memory.aio import in_daemon_thread
from tiered_memory.errors import InvalidInputError, LLMError, missing

try:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.output_parsers import BaseOutputParser
    from langchain_core.prompts import BasePromptTemplate
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.tools import BaseTool
    from langchain_core.runnables import Runnable
    from langchain_core.runnables.base import RunnableBindingBase
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise missing("langchain-core", "langchain") from e

__all__ = ["LangChainLLM", "adapt", "is_openai_chat_model", "to_langchain_messages"]


_ROLES: dict[str, type[BaseMessage]] = {
    "system": SystemMessage,
    "user": HumanMessage,
    "human": HumanMessage,
    "assistant": AIMessage,
    "ai": AIMessage,
}


def to_langchain_messages(messages: Sequence[Mapping[str, str]]) -> list[BaseMessage]:
    """Convert ``{"role", "content"}`` dicts to LangChain messages (inputs are not mutated).

    Raises:
        InvalidInputError: a message has an unknown role or no string content.
    """
    out: list[BaseMessage] = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        cls = _ROLES.get(str(role).lower()) if role is not None else None
        if cls is None:
            raise InvalidInputError(
                f"message {i} has role {role!r}; use one of {sorted(set(_ROLES))}")
        if not isinstance(content, str):
            raise InvalidInputError(f"message {i} content must be a string, got {type(content).__name__}")
        out.append(cls(content=content))
    return out


def is_openai_chat_model(model: object) -> bool:
    """True for ``ChatOpenAI`` and its siblings (``AzureChatOpenAI``...) from langchain-openai.

    Checked by class, without importing langchain-openai when it is not installed.
    """
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        return False
    return isinstance(model, BaseChatOpenAI)


def unwrap(model: object) -> tuple[object, dict[str, Any] | None]:
    """The runnable under ``model``'s bindings (``bind``, ``bind_tools``, ``with_retry``,
    ``with_config``), and the ``extra_body`` that reaches it: the outermost bound one, which
    replaces the model's own whole as in LangChain, else the model's (pure)."""
    bound: dict[str, Any] | None = None
    while isinstance(model, RunnableBindingBase):
        given = model.kwargs.get("extra_body")
        if bound is None and isinstance(given, Mapping):
            bound = dict(given)
        model = model.bound
    return model, bound if bound is not None else getattr(model, "extra_body", None)


def call_options(model: object, *, json_mode: bool, max_tokens: int | None) -> dict[str, Any]:
    """The per-call options to pass ``model`` (a pure decision; table-tested).

    For langchain-openai models: JSON mode is ``response_format={"type": "json_object"}``
    (the json_schema mode of ``with_structured_output`` fails on llama.cpp's server),
    and the token cap travels in ``extra_body`` as ``max_tokens`` because langchain-openai
    sends ``max_completion_tokens``, a name llama-cpp-python's server ignores. The model's own
    ``extra_body`` (or the one bound to it, :func:`unwrap`) is kept: a call's ``extra_body``
    replaces it whole. A wrapped model is read through its bindings.
    Other chat models get no options: their JSON support differs per provider, and
    the core parses JSON out of plain text anyway.
    """
    inner, extra_body = unwrap(model)
    if not is_openai_chat_model(inner):
        return {}
    options: dict[str, Any] = {}
    if json_mode:
        options["response_format"] = {"type": "json_object"}
    if max_tokens is not None:
        options["extra_body"] = {**(extra_body or {}), "max_tokens": max_tokens}
    return options


def message_text(message: object, model: str = "the model") -> str:
    """The text of a chat model's reply (string content or text content blocks); a plain string
    (a model piped into a ``StrOutputParser``) as it is.

    Raises:
        LLMError: the reply is neither (``with_structured_output``'s dict, a tool's result).
    """
    if isinstance(message, BaseMessage):
        return message.text
    if isinstance(message, str):
        return message
    raise LLMError(f"{model} answered with a {type(message).__name__}, not a message: pass a chat model, "
                   "or a Runnable that takes messages and returns an AIMessage")


# Runnables that take no messages or answer with no message: never a model, whatever wraps them
_NOT_MODELS = (BaseRetriever, BaseTool, BasePromptTemplate, BaseOutputParser)


class LangChainLLM:
    """Adapter from a LangChain chat model to the core's async LLM protocol.

    Args:
        model: any ``langchain_core.language_models.BaseChatModel``, bare or wrapped
            (``model.with_retry()``, ``model.bind(...)``), or another Runnable that takes a list
            of messages and returns an ``AIMessage``.

    Errors from the model (HTTP errors, timeouts, bad responses) are raised as
    :class:`~tiered_memory.errors.LLMError` with the original as ``__cause__``.
    The model is called through its sync ``invoke`` in a daemon thread, so the adapter
    works from any event loop, including a new one per call.
    """

    def __init__(self, model: Runnable[Any, Any]) -> None:
        if not isinstance(model, Runnable):
            raise InvalidInputError(f"LangChainLLM needs a LangChain BaseChatModel (or a Runnable wrapping one), "
                                    f"got {type(model).__name__}")
        inner = unwrap(model)[0]
        if isinstance(inner, _NOT_MODELS):
            # a mistake that would fail every call, which the layers answer by rules with a log line only
            raise InvalidInputError(f"LangChainLLM got a {type(inner).__name__}, not a chat model: pass the chat "
                                    "model (ChatOpenAI(...), init_chat_model(...)), bare or wrapped")
        self.model = model
        self.name = type(inner).__name__  # the model's, not RunnableRetry's

    def __repr__(self) -> str:
        return f"LangChainLLM({self.name})"

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> str:
        """Send ``messages`` to the model and return its reply as text."""
        lc_messages = to_langchain_messages(messages)
        options = call_options(self.model, json_mode=json_mode, max_tokens=max_tokens)
        try:
            # the sync invoke on a daemon thread, not ainvoke on the caller's loop: async clients
            # (langchain-openai shares one httpx.AsyncClient per base URL) keep connections bound to
            # the loop that opened them, and the core's sync methods run each call in a fresh
            # asyncio.run loop, so every other ainvoke failed with "Connection error"; a daemon
            # thread lets a caller's timeout return at once and never holds up interpreter exit
            # the options as call kwargs: a binding passes them on to the model, over its own
            reply = await in_daemon_thread(functools.partial(self.model.invoke, lc_messages, **options))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise LLMError(f"{self.name} failed: {type(e).__name__}: {e}") from e
        return message_text(reply, self.name)


def adapt(obj: Any) -> LangChainLLM | None:
    """The core's hook (``tiered_memory.llm.adapters.resolve_llm``, through this package's entry point):
    wrap a chat model or another Runnable (``model.with_retry()``), else None."""
    return LangChainLLM(obj) if isinstance(obj, Runnable) else None
