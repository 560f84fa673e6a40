"""The small async LLM protocol of the core, and robust JSON out of model text.

Any object with ``async def complete(messages, *, json_mode=False, max_tokens=None)
-> str`` is an LLM here; :mod:`.adapters` turns framework models into one.

:func:`complete_json` is the one path every layer uses to get structured output:
strip code fences, find the JSON object in chatter, validate it against a pydantic
schema, retry once telling the model what was wrong, and otherwise raise
:class:`~tiered_memory.errors.LLMOutputError` so the caller can fall back to the
extractive (rule-based) path. A schema that is a :class:`ModelAnswer` keeps the valid entries
of its lists: an invalid entry is dropped (and logged, with their count), not the answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Annotated, Any, Protocol, TypeVar, get_args, get_origin, runtime_checkable

from pydantic import (BaseModel, BeforeValidator, ModelWrapValidatorHandler, PrivateAttr, TypeAdapter,
                      ValidationError, model_validator)

from ..errors import LLMError, LLMOutputError
from ..quoting import escape_special
from ..storable import clean_strings

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("tiered_memory")

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript)?[ \t]*\n?(.*?)```", re.DOTALL)


@runtime_checkable
class LLM(Protocol):
    """Messages (``{"role", "content"}`` dicts) in, text out."""

    async def complete(
        self, messages: list[dict[str, str]], *, json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> str: ...


def _no_flag(value: Any) -> Any:
    """A JSON ``true``/``false`` where a number is asked for is a wrong type: pydantic's lax mode
    reads it as 1 or 0 (a fact at confidence 1.0 citing turn 1, a judgement on existing fact 1)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {str(value).lower()} (true or false)")
    return value


#: a number a model returns in a schema (a confidence): ``0.5`` and ``"0.5"``, never ``true``
ModelNumber = Annotated[float, BeforeValidator(_no_flag)]
#: a whole number a model returns in a schema (a turn's, a fact's): ``3`` and ``"3"``, never ``true``
ModelCount = Annotated[int, BeforeValidator(_no_flag)]


def problems(error: ValidationError, at: str = "") -> str:
    """What ``error`` found, one ``location: message`` each, ``at`` the location it starts from."""
    return "; ".join(f"{'.'.join(str(p) for p in [at, *err['loc']] if p != '') or '<root>'}: {err['msg']}"
                     for err in error.errors())


_ENTRIES: dict[tuple[type, str], TypeAdapter[Any]] = {}  # a list field's entry type, validated alone


class ModelAnswer(BaseModel):
    """A model's JSON answer whose lists are validated entry by entry.

    An invalid entry (a fact of an unknown type, an entity that is an object) is dropped, its
    problem kept in :attr:`dropped` (which :func:`complete_json` logs, with their count), and
    the valid ones are kept: one bad entry does not discard the answer. A list field whose value
    is no list, or none of whose entries is valid, is dropped whole: an optional field then
    takes its default (an episode without decisions); a required one is the answer itself (a
    facts answer's ``facts``), so the answer is invalid, with its entries' own problems (the
    model is asked again, then the rules stand in). An empty list is valid. Anything else
    invalid (a blank summary) makes the answer invalid, as in any schema; an entry is one
    whole (a fact with a source that is no number is dropped, not kept without it).
    """

    _dropped: list[str] = PrivateAttr(default_factory=list)

    @property
    def dropped(self) -> list[str]:
        """What the answer had that is dropped, a problem each (``"facts.2.type: Input should be ..."``)."""
        return list(self._dropped)

    @model_validator(mode="wrap")
    @classmethod
    def _entrywise(cls, data: Any, handler: ModelWrapValidatorHandler[ModelAnswer]) -> ModelAnswer:
        dropped: list[str] = []
        if isinstance(data, dict):
            data = dict(data)  # the caller's is left as it is
            for name, spec in cls.model_fields.items():
                if name in data and get_origin(spec.annotation) is list:
                    dropped += cls._keep_valid(name, data)
        answer = handler(data)
        answer._dropped = dropped
        return answer

    @classmethod
    def _keep_valid(cls, name: str, data: dict[str, Any]) -> list[str]:
        """Leave in ``data[name]`` its valid entries; what is dropped, a problem each."""
        required, value = cls.model_fields[name].is_required(), data[name]
        if not isinstance(value, list):
            if required:
                return []  # the answer's shape is wrong: its validation says so
            del data[name]
            return [f"{name}: a list was expected, got {type(value).__name__}"]
        key = (cls, name)
        if key not in _ENTRIES:
            _ENTRIES[key] = TypeAdapter(get_args(cls.model_fields[name].annotation)[0])
        kept, dropped = [], []
        for n, entry in enumerate(value):
            try:
                _ENTRIES[key].validate_python(entry)
            except ValidationError as e:
                dropped.append(problems(e, f"{name}.{n}"))
            else:
                kept.append(entry)
        if not dropped or (required and not kept):
            return []  # all valid; or none, which its validation reports
        data[name] = kept
        return dropped


def strip_fences(text: str) -> str:
    """The body of the first fenced code block, or ``text`` itself when there is none."""
    found = _FENCE.search(text)
    return found.group(1).strip() if found else text.strip()


MAX_OPENINGS = 64  # the ``{`` find_json_object tries an object at, of the fenced body and of the whole


def find_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (fenced or surrounded by chatter) that starts at one of its
    first :data:`MAX_OPENINGS` ``{``.

    Raises:
        ValueError: no JSON object could be decoded (the message says why).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the model returned empty output")
    body = strip_fences(text)
    decoder = json.JSONDecoder()
    last_error = "no '{' found"
    for candidate in (body, text):
        # the first MAX_OPENINGS: each failed try may read to the end, so all of a long reply's
        # stray braces took time quadratic in its length (a model that ignores max_tokens)
        for start in [m.start() for m, _ in zip(re.finditer(r"\{", candidate), range(MAX_OPENINGS))]:
            try:
                obj, _ = decoder.raw_decode(candidate[start:])
            except json.JSONDecodeError as e:
                last_error = str(e)
                continue
            except RecursionError:  # "[[[[..." nested past Python's limit: garbage, not an answer
                last_error = "JSON nested too deeply"
                continue
            if isinstance(obj, dict):
                return obj
    raise ValueError(f"no JSON object in the output ({last_error})")


def parse_output(text: str, schema: type[M]) -> M:
    """Find the JSON object in ``text`` and validate it against ``schema``.

    Raises:
        ValueError: no JSON object, or it does not match the schema (message says how).
    """
    try:
        obj = clean_strings(find_json_object(text))
        return schema.model_validate(obj)
    except RecursionError as e:  # decoded, but too deep to walk: garbage like any other
        raise ValueError("the JSON is nested too deeply") from e
    except ValidationError as e:
        raise ValueError(f"the JSON does not match the schema: {problems(e)}") from e


def schema_hint(schema: type[BaseModel]) -> str:
    """A compact JSON schema to show the model."""
    return json.dumps(schema.model_json_schema(), separators=(",", ":"))


async def call_llm(
    llm: LLM, messages: list[dict[str, str]], *, json_mode: bool, max_tokens: int | None,
    timeout: float | None,
) -> str:
    """One call with a timeout; every failure becomes :class:`LLMError`."""
    try:
        text = await asyncio.wait_for(
            llm.complete(messages, json_mode=json_mode, max_tokens=max_tokens), timeout)
    except asyncio.TimeoutError as e:
        raise LLMError(f"the LLM did not answer within {timeout} s; raise LLMConfig.timeout_s "
                       "or use a faster model") from e
    except asyncio.CancelledError as e:
        # the model's own (a provider client's cancel scope), not a cancellation of this call: a
        # failure like any other, which the rules then stand in for; before Python 3.11 a task
        # cannot tell the two apart, and the cancellation is passed on
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)
        if cancelling is None or cancelling():
            raise
        raise LLMError(f"the LLM failed: {type(e).__name__} raised by the model, which nothing cancelled") from e
    except LLMError:
        raise
    except Exception as e:
        raise LLMError(f"the LLM failed: {type(e).__name__}: {e}") from e
    if not isinstance(text, str):
        raise LLMError(f"the LLM returned {type(text).__name__}, not text")
    return text


MAX_LOGGED_CHARS = 1_000  # of the problems of the entries an answer had dropped


async def complete_json(
    llm: LLM, messages: list[dict[str, str]], schema: type[M], *, max_tokens: int | None = None,
    timeout: float | None = 60.0, retries: int = 1,
) -> M:
    """Ask for JSON matching ``schema``; on invalid output retry ``retries`` times with the error.

    Raises:
        LLMError: the model raised or timed out.
        LLMOutputError: the output never validated.
    """
    convo = list(messages)
    error = ""
    for _ in range(retries + 1):
        text = await call_llm(llm, convo, json_mode=True, max_tokens=max_tokens, timeout=timeout)
        try:
            answer = parse_output(text, schema)
            if isinstance(answer, ModelAnswer) and answer.dropped:
                log.warning("the LLM's %s answer had %d invalid entries, dropped (the valid ones are kept): %s",
                            schema.__name__, len(answer.dropped), "; ".join(answer.dropped)[:MAX_LOGGED_CHARS])
            return answer
        except ValueError as e:
            error = str(e)
            # the output is untrusted (it may copy the conversation): shown again, it is inert
            convo = [*convo, {"role": "assistant", "content": escape_special(text[:4000])},
                     {"role": "user", "content": (
                         f"That output was invalid: {error}. Reply again with only one JSON "
                         f"object matching this schema: {schema_hint(schema)}")}]
    raise LLMOutputError(f"the LLM output did not validate after {retries + 1} attempts: {error}")
