"""The LLM protocol plumbing: JSON out of model text, retry, timeouts, typed errors, resolve_llm."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel

from tiered_memory.errors import ConfigurationError, LLMError, LLMOutputError
from tiered_memory.llm.adapters import resolve_llm
from tiered_memory.llm.base import complete_json, find_json_object, parse_output, strip_fences
from tiered_memory.testing import Delay, ScriptedLLM, chatty, empty, fenced, malformed, task_of, timeout


class Point(BaseModel):
    x: int
    tags: list[str] = []


@pytest.mark.parametrize("text, expected", [
    ('{"x": 1}', {"x": 1}),
    ('```json\n{"x": 2}\n```', {"x": 2}),
    ('```\n{"x": 3}\n```', {"x": 3}),
    ('Sure! Here it is: {"x": 4, "tags": ["a"]} Hope it helps.', {"x": 4, "tags": ["a"]}),
    ('prefix {not json} then {"x": 5}', {"x": 5}),
    ('{"outer": {"x": 6}}', {"outer": {"x": 6}}),
    ('text with a brace } and {"x": "}"}', {"x": "}"}),
    ('[1, 2] and then {"x": 7}', {"x": 7}),
])
def test_find_json_object(text: str, expected: dict[str, object]) -> None:
    assert find_json_object(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "no json here", '{"x": 1,', "[1, 2, 3]", malformed()])
def test_find_json_object_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        find_json_object(text)


DEEP = 5_000  # deeper than Python's recursion limit


@pytest.mark.parametrize("text", [
    '{"x": ' + "[" * DEEP,  # a model stuck repeating a bracket
    '{"x": 1, "junk": ' + "[" * DEEP + "]" * DEEP + "}",
    '{"a":' * DEEP,
    '{"x": 1, "junk": ' + "[" * 900 + "]" * 900 + "}",  # decodes, but too deep to clean and validate
])
def test_output_nested_past_the_recursion_limit_is_invalid_output(text: str) -> None:
    """Garbage is a ValueError (so the model is asked again, then the rules run), never a
    RecursionError that escapes end_session."""
    with pytest.raises(ValueError):
        parse_output(text, Point)


def test_model_output_is_made_storable_text_before_it_is_validated() -> None:
    from tiered_memory.layers.episodic import EpisodeSchema
    from tiered_memory.layers.llm_facts import ExtractedFacts

    # JSON may spell a NUL as an escape: it is gone after decoding too
    facts = parse_output('{"facts": [{"type": "fact", "text": "likes \\u0000tea"}]}', ExtractedFacts)
    assert facts.facts[0].text == "likes tea"
    for bad in ('{"facts": [{"type": "fact", "text": "   "}]}',
                '{"facts": [{"type": "fact", "text": "' + "x" * 5_001 + '"}]}'):
        with pytest.raises(ValueError, match="facts.0.text"):
            parse_output(bad, ExtractedFacts)  # a fact no user could add: the model is asked again
    with pytest.raises(ValueError, match="summary"):
        parse_output('{"summary": "' + "s" * 5_001 + '"}', EpisodeSchema)
    # a blank entry says nothing: dropped (a blank key fact would be promoted to a blank fact)
    episode = parse_output('{"summary": "ok", "key_facts": ["   ", "User likes tea"], "entities": [""]}',
                           EpisodeSchema)
    assert episode.key_facts == ["User likes tea"] and episode.entities == []


@pytest.mark.parametrize("blank", ["\x1c", "\x1e\x1f", " \x1d\t"])
def test_model_text_blank_by_pythons_rules_is_invalid_output(blank: str) -> None:
    """The separators U+001C-U+001F pass pydantic's (Rust) ``\\S`` but are whitespace to
    ``str.strip``: a summary or fact made of them is blank, as check_text says of input."""
    from tiered_memory.layers.episodic import EpisodeSchema
    from tiered_memory.layers.resolution import Judgement
    from tiered_memory.layers.llm_facts import ExtractedFacts

    cases: list[tuple[dict[str, object], type[BaseModel]]] = [
        ({"facts": [{"type": "fact", "text": blank}]}, ExtractedFacts),
        ({"summary": blank}, EpisodeSchema),
        ({"action": "update", "target": 1, "text": blank}, Judgement),
    ]
    for obj, schema in cases:
        with pytest.raises(ValueError, match="text|summary"):
            parse_output(fenced(obj), schema)


def test_strip_fences_leaves_plain_text() -> None:
    assert strip_fences("  plain  ") == "plain"
    assert strip_fences("before ```json\n{}\n``` after") == "{}"


def test_parse_output_reports_schema_errors() -> None:
    with pytest.raises(ValueError, match="x"):
        parse_output('{"x": "not a number"}', Point)
    assert parse_output(fenced({"x": "3"}), Point).x == 3  # lax coercion of numeric strings


async def test_complete_json_valid_first_try() -> None:
    llm = ScriptedLLM([chatty({"x": 1, "tags": ["t"]})])
    out = await complete_json(llm, [{"role": "user", "content": "go"}], Point)
    assert out == Point(x=1, tags=["t"])
    assert len(llm.calls) == 1 and llm.calls[0].json_mode is True


@pytest.mark.parametrize("bad", [malformed(), empty(), '{"x": [1, 2]}', '{"y": 1}', "I cannot do that."])
async def test_complete_json_retries_once_with_the_error(bad: str) -> None:
    llm = ScriptedLLM([bad, fenced({"x": 9})])
    out = await complete_json(llm, [{"role": "user", "content": "go"}], Point, max_tokens=50)
    assert out.x == 9
    assert len(llm.calls) == 2
    retry = llm.calls[1].messages
    assert retry[-2] == {"role": "assistant", "content": bad[:4000]}
    assert "invalid" in retry[-1]["content"] and '"x"' in retry[-1]["content"]  # schema shown
    assert llm.calls[1].max_tokens == 50


async def test_complete_json_gives_up_with_typed_error() -> None:
    llm = ScriptedLLM([malformed(), '{"x": "nope"}'])
    with pytest.raises(LLMOutputError, match="2 attempts"):
        await complete_json(llm, [{"role": "user", "content": "go"}], Point)
    assert len(llm.calls) == 2


async def test_complete_json_timeout_is_llm_error() -> None:
    llm = ScriptedLLM([timeout()])
    with pytest.raises(LLMError, match="within 0.05 s") as info:
        await complete_json(llm, [{"role": "user", "content": "go"}], Point, timeout=0.05)
    assert not isinstance(info.value, LLMOutputError)


async def test_complete_json_provider_exception_is_wrapped() -> None:
    llm = ScriptedLLM([ConnectionError("refused")])
    with pytest.raises(LLMError, match="ConnectionError: refused") as info:
        await complete_json(llm, [{"role": "user", "content": "go"}], Point)
    assert isinstance(info.value.__cause__, ConnectionError)


async def test_wrong_return_type_is_llm_error() -> None:
    llm = ScriptedLLM([lambda messages: 42])  # a broken adapter returning a non-string
    with pytest.raises(LLMError, match="int"):
        await complete_json(llm, [{"role": "user", "content": "go"}], Point)


async def test_delay_within_timeout_answers() -> None:
    llm = ScriptedLLM([Delay(0.01, then={"x": 2})])
    assert (await complete_json(llm, [], Point, timeout=5)).x == 2


async def test_scripted_llm_routes_by_task_and_records() -> None:
    llm = ScriptedLLM(["fallback"], by_task={"episode": ["ep"]}, default="done")
    sys_msg = {"role": "system", "content": "Task: episode\nDo it."}
    assert await llm.complete([sys_msg]) == "ep"
    assert await llm.complete([{"role": "user", "content": "x"}]) == "fallback"
    assert await llm.complete([]) == "done"
    assert llm.tasks() == ["episode", None, None]
    assert task_of([sys_msg]) == "episode"


async def test_scripted_llm_without_steps_fails_loudly() -> None:
    with pytest.raises(AssertionError, match="no step left"):
        await ScriptedLLM().complete([])


async def test_scripted_llm_does_not_mutate_messages() -> None:
    messages = [{"role": "user", "content": "hi"}]
    llm = ScriptedLLM(["ok"])
    await llm.complete(messages)
    llm.calls[0].messages[0]["content"] = "changed"
    assert messages == [{"role": "user", "content": "hi"}]


def test_resolve_llm_accepts_protocol_objects() -> None:
    llm = ScriptedLLM()
    assert resolve_llm(llm) is llm
    assert resolve_llm(None) is None


@pytest.mark.parametrize("obj", [object(), "gpt-4o", 42])
def test_resolve_llm_rejects_other_objects(obj: object) -> None:
    with pytest.raises(ConfigurationError, match="async def complete"):
        resolve_llm(obj)


def test_resolve_llm_rejects_sync_complete() -> None:
    class Sync:
        def complete(self, messages: list[dict[str, str]], *, json_mode: bool = False,
                     max_tokens: int | None = None) -> str:
            return "x"

    with pytest.raises(ConfigurationError):
        resolve_llm(Sync())


async def test_resolve_llm_wraps_a_langchain_chat_model() -> None:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from langchain_tiered_memory.llm import LangChainLLM

    model = FakeListChatModel(responses=['{"x": 5}'])
    llm = resolve_llm(model)
    assert isinstance(llm, LangChainLLM)
    assert (await complete_json(llm, [{"role": "user", "content": "go"}], Point)).x == 5


def test_resolve_llm_wraps_a_llamaindex_llm() -> None:
    from llama_index.core.llms import MockLLM

    llm = resolve_llm(MockLLM())
    assert llm is not None and hasattr(llm, "complete")
    assert type(llm).__module__.startswith("llamaindex_tiered_memory")


def test_core_modules_import_no_framework() -> None:
    code = ("import sys, tiered_memory, tiered_memory.llm, tiered_memory.layers, tiered_memory.testing, "
            "tiered_memory.layers.consolidation, tiered_memory.context.assembly\n"
            "bad = [m for m in sys.modules if m.startswith(('langchain', 'llama_index'))]\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_find_json_object_tries_the_first_openings_only() -> None:
    """Each failed try at a ``{`` may read to the end of the reply, so a long reply of stray
    braces (a model that ignores max_tokens) took time quadratic in its length, with the
    session's lock held: an object is looked for at the first MAX_OPENINGS openings."""
    from tiered_memory.llm.base import MAX_OPENINGS
    assert find_json_object("{a " * (MAX_OPENINGS - 1) + '{"x": 1}') == {"x": 1}
    with pytest.raises(ValueError, match="no JSON object"):
        find_json_object("{a " * MAX_OPENINGS + '{"x": 1}')


@pytest.mark.parametrize("text", [
    '{"facts": [{"type": "fact", "text": "User has a budget", "confidence": true, "sources": [1]}]}',
    '{"facts": [{"type": "fact", "text": "User has a budget", "confidence": 0.5, "sources": [true]}]}',
    '{"action": "invalidate", "target": true}',
])
def test_true_or_false_where_a_number_is_asked_for_is_invalid_output(text: str) -> None:
    """pydantic's lax mode reads JSON true as 1: a fact at confidence 1.0 citing turn 1, or a
    judgement invalidating existing fact 1, from an answer that gave no number at all. A numeric
    string ("3") is still taken (test_parse_output_reports_schema_errors)."""
    from tiered_memory.layers.llm_facts import ExtractedFacts
    from tiered_memory.layers.resolution import Judgement

    schema = Judgement if "action" in text else ExtractedFacts
    with pytest.raises(ValueError, match="true or false"):
        parse_output(text, schema)
    assert parse_output('{"action": "invalidate", "target": "1"}', Judgement).target == 1


def test_an_answers_invalid_entries_are_dropped_and_its_valid_ones_kept() -> None:
    """A ModelAnswer validates its lists entry by entry: one invalid fact or point made the whole
    answer invalid (asked again, then the rules), losing the valid ones. An invalid entry is now
    dropped (named in ``dropped``); a list of which none is valid, or that is no list, is dropped
    whole where the field is optional, and is an invalid answer where it is the answer itself."""
    from tiered_memory.layers.episodic import EpisodeSchema
    from tiered_memory.layers.llm_facts import ExtractedFacts

    good = {"type": "fact", "text": "User owns a red bicycle", "sources": [1]}
    answer = {"facts": [{"type": "opinion", "text": "x"}, good, "User rides", {**good, "confidence": True}]}
    facts = ExtractedFacts.model_validate(answer)
    assert [f.text for f in facts.facts] == ["User owns a red bicycle"] and len(answer["facts"]) == 4  # not mutated
    assert [d.split(":")[0] for d in facts.dropped] == ["facts.0.type", "facts.2", "facts.3.confidence"]
    assert parse_output('{"facts": []}', ExtractedFacts).dropped == []  # no facts: a valid answer
    for whole in ('{"facts": [{"type": "opinion", "text": "x"}]}', '{"facts": {"type": "fact"}}', '{"fact": []}'):
        with pytest.raises(ValueError, match="facts"):  # nothing valid, or no list: asked again
            parse_output(whole, ExtractedFacts)
    episode = parse_output('{"summary": "ok", "entities": ["Ana", {"name": "Bob"}], "decisions": null,'
                           ' "open_questions": [1, 2], "key_facts": ["User likes tea"]}', EpisodeSchema)
    assert (episode.entities, episode.decisions, episode.open_questions, episode.key_facts) == (
        ["Ana"], [], [], ["User likes tea"])
    assert [d.split(":")[0] for d in episode.dropped] == [
        "entities.1", "decisions", "open_questions.0", "open_questions.1"]
    with pytest.raises(ValueError, match="summary"):  # no summary: no episode, whatever its points
        parse_output('{"summary": " ", "entities": ["Ana"]}', EpisodeSchema)


async def test_a_model_raising_cancelled_error_of_its_own_is_an_llm_error() -> None:
    """A provider's client may let a CancelledError of its own out (a cancel scope of its own,
    a connection pool shut down) though nobody cancelled the call: it came out of complete_json
    bare, past the fallback, so end_session failed instead of using the rules. The caller's own
    cancellation still cancels."""
    import asyncio

    llm = ScriptedLLM([asyncio.CancelledError()])
    with pytest.raises(LLMError, match="CancelledError"):
        await complete_json(llm, [{"role": "user", "content": "go"}], Point, timeout=5.0)
    slow = ScriptedLLM([Delay(5.0, fenced({"x": 1}))])
    task = asyncio.ensure_future(complete_json(slow, [{"role": "user", "content": "go"}], Point, timeout=10.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
