"""Fakes for testing code that uses tiered-memory, where the real thing cannot run.

:class:`ScriptedLLM` implements the core LLM protocol from a script: each call
takes the next step of the script (a reply, an exception to raise, a delay, or a
function of the messages), optionally per task, and every call is recorded.

Example:
    >>> import asyncio
    >>> llm = ScriptedLLM([fenced({"ok": True}), RuntimeError("provider down")])
    >>> asyncio.run(llm.complete([{"role": "user", "content": "hi"}]))
    '```json\\n{"ok": true}\\n```'
    >>> len(llm.calls)
    1
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

__all__ = [
    "CountingEmbedder", "Delay", "FailingVectorIndex", "HeldEmbedder", "LLMCall", "ScriptedLLM", "chatty", "empty",
    "fenced", "malformed", "task_of", "timeout",
]


@dataclass(frozen=True)
class Delay:
    """Sleep ``seconds``, then answer with ``then`` (a step of the script)."""

    seconds: float
    then: Any = ""


Step = Union[str, BaseException, Delay, Callable[[list[dict[str, str]]], Any], Mapping[str, Any]]


@dataclass(frozen=True)
class LLMCall:
    """One recorded call."""

    messages: list[dict[str, str]]
    json_mode: bool
    max_tokens: int | None
    task: str | None


_TASK = re.compile(r"^Task:\s*([\w-]+)", re.MULTILINE)


def task_of(messages: list[dict[str, str]]) -> str | None:
    """The ``Task: <name>`` line the core puts in its system prompts (``episode``, ``facts``, ``resolve``)."""
    for m in messages:
        if m.get("role") == "system":
            found = _TASK.search(m.get("content", ""))
            if found:
                return found.group(1)
    return None


def fenced(obj: Any) -> str:
    """``obj`` as JSON inside a Markdown code fence."""
    return "```json\n" + json.dumps(obj) + "\n```"


def chatty(obj: Any) -> str:
    """``obj`` as JSON surrounded by chatter."""
    return "Sure! Here is the JSON you asked for:\n" + json.dumps(obj) + "\nLet me know if you need more."


def malformed() -> str:
    """Broken JSON (unclosed object, trailing comma)."""
    return '{"summary": "half an answer", "entities": ["a",'


def empty() -> str:
    return ""


def timeout(seconds: float = 3600.0) -> Delay:
    """A step that never answers in time."""
    return Delay(seconds)


class ScriptedLLM:
    """A fake LLM that answers from a script and records its calls.

    Args:
        script: steps used in order by every call (when ``by_task`` has no entry).
        by_task: steps per task name (see :func:`task_of`), used before ``script``.
        default: the answer once a script runs out; ``None`` raises ``AssertionError``
            so a test notices an unexpected call.

    A step is a ``str`` (returned), a mapping (returned as JSON), an exception
    instance (raised), a :class:`Delay`, or a callable taking the messages and
    returning any of these.
    """

    def __init__(
        self, script: Iterable[Step] = (), *, by_task: Mapping[str, Iterable[Step]] | None = None,
        default: Step | None = None,
    ) -> None:
        self.script: list[Step] = list(script)
        self.by_task: dict[str, list[Step]] = {k: list(v) for k, v in (by_task or {}).items()}
        self.default = default
        self.calls: list[LLMCall] = []

    def __repr__(self) -> str:
        return f"ScriptedLLM({len(self.calls)} calls)"

    def tasks(self) -> list[str | None]:
        return [c.task for c in self.calls]

    def _next(self, task: str | None) -> Step:
        queue = self.by_task.get(task or "")
        if queue:
            return queue.pop(0)
        if self.script:
            return self.script.pop(0)
        if self.default is not None:
            return self.default
        raise AssertionError(f"ScriptedLLM has no step left for task {task!r}")

    async def _play(self, step: Any, messages: list[dict[str, str]]) -> str:
        if isinstance(step, Delay):
            await asyncio.sleep(step.seconds)
            return await self._play(step.then, messages)
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return await self._play(step(messages), messages)
        if isinstance(step, Mapping):
            return json.dumps(step)
        return step  # type: ignore[no-any-return]  # wrong types pass through on purpose

    async def complete(
        self, messages: list[dict[str, str]], *, json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> str:
        copied = [dict(m) for m in messages]
        task = task_of(copied)
        self.calls.append(LLMCall(messages=copied, json_mode=json_mode, max_tokens=max_tokens, task=task))
        return await self._play(self._next(task), copied)


class FailingVectorIndex:
    """Wraps a real vector index and makes chosen methods fail, to test what the core does
    when the vector engine breaks mid-write.

    Args:
        inner: the real index (for example ``ChromaVectorIndex``); every call is forwarded.
        fail_on: method names that fail (``"upsert"``, ``"query"``, ``"delete"``, ``"delete_user"``...).
        after: calls of those methods that succeed before the failures start.
        times: how many calls fail; ``None`` fails forever.
        error: the exception raised (a third-party engine may raise anything).

    ``failures`` counts the calls that failed. ``healthy()`` stops failing.
    """

    def __init__(self, inner: Any, *, fail_on: Iterable[str], after: int = 0, times: int | None = 1,
                 error: BaseException | None = None) -> None:
        self.inner = inner
        self.fail_on = set(fail_on)
        self.after = after
        self.times = times
        self.error = error if error is not None else RuntimeError("simulated vector engine failure")
        self.failures = 0
        self._seen = 0

    def healthy(self) -> None:
        self.fail_on = set()

    def _maybe_fail(self, name: str) -> None:
        if name == "upsert_behind":  # the background upsert's entry point fails as "upsert" does
            name = "upsert"
        if name not in self.fail_on:
            return
        self._seen += 1
        if self._seen > self.after and (self.times is None or self.failures < self.times):
            self.failures += 1
            raise self.error

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self._maybe_fail(name)
            return target(*args, **kwargs)

        return call


class HeldEmbedder:
    """Wraps a real embedder; while held, each embedding call sets ``entered`` and waits for
    :meth:`release`. A test can so act (close the memory, fork) while a call is inside the
    library, without sleeping.

    Args:
        inner: the real embedder; every call is forwarded.
        timeout: the longest a held call waits before it raises ``RuntimeError`` (so a test
            that never releases fails instead of hanging).
    """

    def __init__(self, inner: Any, *, timeout: float = 60.0) -> None:
        self.inner = inner
        self.timeout = timeout
        self.entered = threading.Event()
        self._released = threading.Event()
        self._released.set()

    def hold(self) -> None:
        """Hold the next embedding calls until :meth:`release`."""
        self.entered.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def _wait(self) -> None:
        if self._released.is_set():
            return
        self.entered.set()
        if not self._released.wait(self.timeout):
            raise RuntimeError(f"HeldEmbedder was not released within {self.timeout} s")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self._wait()
        vectors: list[list[float]] = self.inner.embed_documents(texts)
        return vectors

    def embed_query(self, text: str) -> list[float]:
        self._wait()
        vector: list[float] = self.inner.embed_query(text)
        return vector


class CountingEmbedder:
    """Wraps a real embedder and records what the library asks it to embed: the size of each
    ``embed_documents`` batch, its characters, and each query text. The vectors and the name
    are the inner embedder's, so a store opened with it is the store the inner one would make.

    Args:
        inner: the real embedder; every call is forwarded.

    Example:
        >>> from tiered_memory import StaticEmbedder
        >>> counting = CountingEmbedder(StaticEmbedder())
        >>> _ = counting.embed_documents(["a", "bc"]), counting.embed_query("c")
        >>> counting.batches, counting.characters, counting.queries
        ([2], [3], ['c'])
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = getattr(inner, "name", type(inner).__name__)
        self.batches: list[int] = []
        self.characters: list[int] = []
        self.queries: list[str] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(len(texts))
        self.characters.append(sum(map(len, texts)))
        vectors: list[list[float]] = self.inner.embed_documents(texts)
        return vectors

    def embed_query(self, text: str) -> list[float]:
        self.queries.append(text)
        vector: list[float] = self.inner.embed_query(text)
        return vector
