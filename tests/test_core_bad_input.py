"""Bad input is rejected with a typed error before anything is written; inputs are never mutated."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from tiered_memory import (
    ConfigurationError,
    ContentTooLargeError,
    InvalidInputError,
    MemoryConfig,
    Message,
    TieredMemory,
    TieredMemoryError,
    UsageError,
)
from tiered_memory.config import (BudgetConfig, EpisodeConfig, LLMConfig, RetrievalConfig, WorkingConfig,
                                  config_problems)
from tiered_memory.validation import check_id, normalize_message, to_epoch

OK = {"role": "user", "content": "fine"}


def _nested(levels: int) -> dict:
    """``levels`` dicts, each inside the one before."""
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("message, fragment", [
    ({"role": "user", "content": ""}, "non-whitespace"),
    ({"role": "user", "content": "  \n\t "}, "non-whitespace"),
    ({"role": "user", "content": None}, "must be a str"),
    ({"role": "user", "content": 42}, "must be a str"),
    ({"role": "user", "content": b"bytes"}, "must be a str"),
    ({"role": "user", "content": "nul \x00 inside"}, "NUL"),
    ({"role": "user", "content": "lone \ud800 surrogate"}, "surrogate"),
    ({"role": "robot", "content": "hi"}, "role must be one of"),
    ({"role": None, "content": "hi"}, "role must be one of"),
    ({"content": "no role"}, "needs 'role' and 'content'"),
    ({"role": "user", "content": "x", "colour": "red"}, "unknown message fields"),
    ({"role": "user", "content": "x", "metadata": {"when": datetime(2024, 1, 1)}}, "JSON-serialisable"),
    ({"role": "user", "content": "x", "metadata": {"f": math.nan}}, "JSON-serialisable"),
    ({"role": "user", "content": "x", "metadata": {1: "int key"}}, "keys must be strings"),
    ({"role": "user", "content": "x", "metadata": ["not", "a", "mapping"]}, "must be a mapping"),
    ({"role": "user", "content": "x", "timestamp": "last tuesday"}, "ISO 8601"),
    ({"role": "user", "content": "x", "timestamp": True}, "not bool"),
    ({"role": "user", "content": "x", "timestamp": math.inf}, "finite"),
    ({"role": "user", "content": "x", "timestamp": 10**400}, "outside 1900"),  # float() overflows
    pytest.param({"role": "user", "content": "x", "timestamp": 10**5000}, "an int of 16610 bits",
                 id="timestamp-too-long-to-print"),
    ({"role": "user", "content": "x", "metadata": {"d": _nested(100)}}, "more than 100 levels"),
    ({"role": "user", "content": "x", "metadata": {"d": _nested(5_000)}}, "more than 100 levels"),
    ({"role": "user", "content": "x", "metadata": {"tag": "a\x00b"}}, "string with NUL"),  # jsonb cannot hold it
    ({"role": "user", "content": "x", "metadata": {"k\x00": 1}}, "key holding NUL"),
    ({"role": "user", "content": "x", "metadata": {"l": [{"deep": "\x00"}]}}, "string with NUL"),
    ({"role": "user", "content": "x", "id": "fact:0f3a"}, "starts with 'fact:'"),
    ({"role": "user", "content": "x", "id": "ep:42"}, "starts with 'ep:'"),
    ({"role": "user", "content": "x", "id": "item:k"}, "starts with 'item:'"),
    ("just a string", "dict or Message"),
])
def test_normalize_message_rejects(message, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        normalize_message(message, max_chars=1000, max_metadata_bytes=1000, now=0.0)


@pytest.mark.parametrize("value, fragment", [
    ("", "non-empty"), ("   ", "non-empty"), (None, "must be a str"), (7, "must be a str"),
    ("x" * 257, "limit is 256"), ("tab\there", "control characters"),
])
def test_check_id_rejects(value, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        check_id(value, "user_id")


@pytest.mark.parametrize("value", ["../../etc/passwd", "o'brien; DROP TABLE messages", "用户-1", "a/b\\c"])
def test_check_id_accepts_any_printable_text(value):
    assert check_id(value, "user_id") == value


@pytest.mark.parametrize("value, expected", [
    (None, 5.0),
    (1_700_000_000, 1_700_000_000.0),
    ("2024-01-01T00:00:00Z", 1_704_067_200.0),
    ("2024-01-01T01:00:00+01:00", 1_704_067_200.0),
    (datetime(2024, 1, 1), 1_704_067_200.0),  # naive = UTC
    (datetime(2024, 1, 1, tzinfo=timezone.utc), 1_704_067_200.0),
])
def test_to_epoch(value, expected):
    assert to_epoch(value, 5.0) == expected


def test_a_bad_message_in_a_batch_writes_nothing_and_says_which(memory):
    batch = [OK, OK, {"role": "user", "content": ""}, OK]
    with pytest.raises(InvalidInputError, match="message 2"):
        memory.add_many(batch, session_id="s", user_id="u")
    assert memory.stats().messages == 0 and memory.stats().vectors == 0


@pytest.mark.parametrize("kwargs, fragment", [
    ({"session_id": "", "user_id": "u"}, "session_id"),
    ({"session_id": "s", "user_id": ""}, "user_id"),
    ({"session_id": "s", "user_id": None}, "user_id"),
])
def test_missing_ids_are_rejected(memory, kwargs, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        memory.add("user", "hello", **kwargs)
    assert memory.stats().messages == 0


def test_oversize_content_uses_the_configured_limit(make_memory):
    memory = make_memory(config=MemoryConfig(max_content_chars=50))
    with pytest.raises(ContentTooLargeError, match="limit is 50") as info:
        memory.add("user", "x" * 51, session_id="s", user_id="u")
    assert isinstance(info.value, InvalidInputError)
    memory.add("user", "x" * 50, session_id="s", user_id="u")
    assert memory.stats().messages == 1


def test_oversize_metadata_is_rejected(make_memory):
    memory = make_memory(config=MemoryConfig(max_metadata_bytes=100))
    with pytest.raises(InvalidInputError, match="limit is 100"):
        memory.add("user", "x", session_id="s", user_id="u", metadata={"blob": "y" * 200})
    assert memory.stats().messages == 0


def test_a_facts_metadata_is_held_to_the_limit_as_stored(make_memory, tmp_path):
    """update_fact checked only the metadata it was given, then merged it into the fact's: two
    updates of 600 bytes each stored 1,200 under a limit of 1,000, and export_jsonl then left the
    fact out (import_jsonl would refuse it). The merged metadata is checked now; nothing is
    written when it is over, and what is stored exports and imports whole."""
    memory = make_memory(config=MemoryConfig(max_metadata_bytes=1000))
    fact = memory.add_fact("User likes tea", user_id="u", metadata={"a": "x" * 600})
    with pytest.raises(InvalidInputError, match="limit is 1,000"):
        memory.update_fact(fact.id, user_id="u", metadata={"b": "y" * 600})
    assert memory.facts("u") == [fact] and [c.action for c in memory.fact_history("u")] == ["add"]
    fact = memory.update_fact(fact.id, user_id="u", metadata={"a": "z" * 600})  # replaces a key: within
    assert memory.export_jsonl(tmp_path / "e.jsonl", user_id="u") == 1
    again = make_memory("again", config=MemoryConfig(max_metadata_bytes=1000))
    assert again.import_jsonl(tmp_path / "e.jsonl").facts_imported == 1
    assert [f.metadata for f in again.facts("u")] == [fact.metadata]


def test_add_fact_holds_its_metadata_to_the_limit_with_the_keys_it_adds(make_memory, tmp_path):
    """add_fact checked the caller's metadata, then stored it with its own "method" and
    "resolution": metadata a few bytes under the limit was stored over it, and export_jsonl
    left the fact out. The metadata as stored is checked now, and the error names those keys."""
    memory = make_memory(config=MemoryConfig(max_metadata_bytes=1000))
    with pytest.raises(InvalidInputError, match="'method'.*limit is 1,000"):
        memory.add_fact("User likes tea", user_id="u", metadata={"a": "x" * 985})
    assert memory.facts("u") == []
    memory.add_fact("User likes tea", user_id="u", metadata={"a": "x" * 940})
    assert memory.export_jsonl(tmp_path / "e.jsonl", user_id="u") == 1


@pytest.mark.parametrize("query, k, fragment", [
    ("", 5, "non-empty"), ("   ", 5, "non-empty"), (None, 5, "non-empty"),
    ("ok", 0, "k must be an int >= 1"), ("ok", -1, "k must be an int >= 1"), ("ok", "3", "k must be an int >= 1"),
])
def test_bad_search_arguments(memory, query, k, fragment):
    with pytest.raises(InvalidInputError, match=fragment):
        memory.search(query, user_id="u", k=k)


def test_unknown_vector_store_is_a_configuration_error(tmp_path, embedder):
    from tiered_memory import TieredMemory

    with pytest.raises(ConfigurationError, match="vector_store"):
        TieredMemory(tmp_path / "m", embedder=embedder, vector_store="faiss")
    # nothing is left locked: the folder opens afterwards
    TieredMemory(tmp_path / "m", embedder=embedder).close()


def test_caller_inputs_are_never_mutated(memory):
    meta = {"tags": ["a", "b"], "nested": {"k": [1, 2]}}
    msgs = [{"role": "user", "content": "one", "metadata": meta},
            Message(role="assistant", content="two", metadata=meta, timestamp="2024-05-01T00:00:00Z")]
    snapshot = copy.deepcopy(msgs)
    memory.add_many(msgs, session_id="s", user_id="u")
    assert msgs == snapshot
    stored = memory.get_messages("s", user_id="u")
    stored[0].metadata["tags"].append("changed after the fact")
    meta["nested"]["k"].append(3)
    assert memory.get_messages("s", user_id="u")[0].metadata == {"tags": ["a", "b"], "nested": {"k": [1, 2]}}


def test_every_error_is_a_tiered_memory_error_and_usage_errors_are_value_errors():
    assert issubclass(InvalidInputError, UsageError)
    assert issubclass(UsageError, ValueError)
    assert issubclass(UsageError, TieredMemoryError)


def test_metadata_as_deep_as_allowed_is_read_back_from_a_deep_call_stack(memory):
    # a value stored from a shallow stack must not fail a read made from a deep one (a web
    # framework, a callback): the depth limit, not the recursion limit, decides what is stored
    memory.add("user", "deep", session_id="s", user_id="u", metadata={"d": _nested(99)})

    def read(depth: int) -> list:
        return memory.get_messages("s", user_id="u") if depth == 0 else read(depth - 1)

    assert [m.content for m in read(600)] == ["deep"]


@pytest.mark.parametrize("message_id", ["slack:C1:123", "a:fact:b", "episode:1"])
def test_a_message_id_may_hold_a_colon_after_its_first_letters(memory, message_id):
    assert memory.add_many([{**OK, "id": message_id}], session_id="s", user_id="u") == [message_id]
    assert memory.search("fine", user_id="u")[0].id == message_id


@pytest.mark.parametrize("key, value", [("since", 10**400), ("until", -10**400),
                                        pytest.param("since", 10**5000, id="too-long-to-print")])
def test_a_filter_time_too_large_for_a_float_is_bad_input(memory, key, value):
    for search in (memory.search, memory.search_sessions):
        with pytest.raises(InvalidInputError, match="finite epoch seconds"):
            search("x", user_id="u", filters={key: value})


def test_a_filter_integer_past_64_bits_says_how_to_filter_on_it(memory):
    """Metadata may hold such an int (JSON has no limit), but no store can compare it in a filter."""
    memory.add("user", "a big number", user_id="u", session_id="s", metadata={"n": 2**70})
    with pytest.raises(InvalidInputError, match="as a string"):
        memory.search("x", user_id="u", filters={"n": 2**70})
    assert memory.get_messages("s", user_id="u")[0].metadata == {"n": 2**70}


def test_a_filter_key_with_nul_is_bad_input(memory):
    with pytest.raises(InvalidInputError, match="no NUL"):
        memory.search("x", user_id="u", filters={"a\x00": 1})


@pytest.mark.parametrize("change, fragment", [
    (lambda c: replace(c, working=WorkingConfig(capacity=0)), "working.capacity must be finite and at least 1"),
    # the share of importance lost per hour: 2.0 was taken as 1.0 (every item worthless after a second)
    (lambda c: replace(c, working=WorkingConfig(decay_per_hour=2.0)), "working.decay_per_hour must be at most 1"),
    (lambda c: replace(c, budget=BudgetConfig(fact_relevance=math.nan)), "budget.fact_relevance"),
    (lambda c: replace(c, budget=BudgetConfig(shares={"turns": -1.0})), "budget.shares['turns']"),
    (lambda c: replace(c, budget=BudgetConfig(max_tokens=0)), "budget.max_tokens"),
    (lambda c: replace(c, llm=LLMConfig(strict="no")), "llm.strict must be True or False"),  # truthy
    (lambda c: replace(c, write_chunk=2.5), "write_chunk must be an int"),
    (lambda c: replace(c, retrieval=RetrievalConfig(candidates=2**40)), "at most 2,147,483,647"),  # no store takes it
    (lambda c: replace(c, dedup_threshold="0.9"), "dedup_threshold must be a number"),
    (lambda c: replace(c, access_flush_seconds=-1.0), "access_flush_seconds"),
    (lambda c: replace(c, episodes=EpisodeConfig(compress_after_turns=0)), "episodes.compress_after_turns"),
    (lambda c: "not a config", "config must be a MemoryConfig"),
    # a share under a name no section has was ignored: the section meant got none
    (lambda c: replace(c, budget=BudgetConfig(shares={"sesion": 0.5, "turns": 1.0})),
     "budget.shares has no section 'sesion'"),
    # a nested config of another kind, or None, failed with an AttributeError
    (lambda c: replace(c, budget=RetrievalConfig()), "budget must be a BudgetConfig, got RetrievalConfig"),
    (lambda c: replace(c, buffer=None), "buffer must be a BufferConfig, got NoneType"),
])
def test_a_bad_config_fails_before_any_io(change, fragment, tmp_path):
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        TieredMemory(tmp_path / "m", config=change(MemoryConfig()))
    assert not (tmp_path / "m").exists()


def test_every_default_and_a_signed_weight_table_pass():
    assert config_problems(MemoryConfig()) == []
    signed = replace(MemoryConfig(), retrieval=RetrievalConfig(fusion_weights={"similarity": 1.0, "length": -0.2}))
    assert config_problems(signed) == []  # a learned table may weigh a signal below zero
    assert config_problems(replace(MemoryConfig(), episodes=EpisodeConfig(compress_after_turns=None))) == []
    from tiered_memory.config import BUDGET_SECTIONS
    from tiered_memory.context.assembly import TITLES

    assert set(BUDGET_SECTIONS) == set(TITLES)  # every section a share may name, and only those


@pytest.mark.parametrize("path", [123, None, b"/tmp/export.jsonl", "dump\x00.jsonl", "dump\ud800.jsonl"])
def test_export_and_import_refuse_a_path_no_file_can_have(memory, path):
    memory.add("user", "a turn to export", user_id="u1", session_id="s1")
    with pytest.raises(InvalidInputError, match="path"):
        memory.export_jsonl(path)
    with pytest.raises(InvalidInputError, match="path"):
        memory.import_jsonl(path)
    assert memory.stats().messages == 1


@pytest.mark.parametrize("name, match", [("mem\x00", "NUL"), ("mem\ud800", "file name")])
def test_a_memory_path_no_folder_can_have_is_a_configuration_error(tmp_path, embedder, name, match):
    with pytest.raises(ConfigurationError, match=match):
        TieredMemory(str(tmp_path / name), embedder=embedder)


def test_a_progress_that_is_not_a_function_is_refused_before_anything_is_written(make_memory, tmp_path):
    source = make_memory("source")
    source.add("user", "I live in Lisbon", user_id="u1", session_id="s1")
    source.add_fact("I like green tea", user_id="u1")
    dump = tmp_path / "dump.jsonl"
    source.export_jsonl(dump)
    memory = make_memory("target")
    with pytest.raises(InvalidInputError, match="progress"):
        memory.add_many([{"role": "user", "content": "a turn"}], user_id="u1", session_id="s1", progress=3)
    with pytest.raises(InvalidInputError, match="progress"):
        memory.import_jsonl(dump, progress="bar")
    assert memory.stats().messages == 0 and memory.facts("u1") == []  # not half an import
    memory.add("user", "an old turn", user_id="u1", session_id="old", timestamp=1_000_000_000)
    with pytest.raises(InvalidInputError, match="progress"):
        memory.consolidate("u1", progress=3)
    assert memory.episodes("u1") == []  # the consolidation did not start


@pytest.mark.parametrize("timeout", ["10", float("nan"), -1, True])
def test_flush_refuses_a_timeout_that_is_not_seconds(memory, timeout):
    with pytest.raises(InvalidInputError, match="timeout"):
        memory.flush(timeout=timeout)


def test_a_progress_that_cannot_take_its_arguments_is_refused_before_anything_is_written(make_memory, tmp_path):
    """A function of the wrong shape passed the check (it is callable) and failed with a bare
    TypeError at its first call, after the first commit: consolidate's after ending a session
    (it is called with the step, done and total), add_many's after the first chunk (with a count)."""
    memory = make_memory()
    memory.add("user", "an old turn", user_id="u1", session_id="old", timestamp=1_000_000_000)
    with pytest.raises(InvalidInputError, match="progress .*3 arguments"):
        memory.consolidate("u1", progress=lambda done: None)
    assert memory.episodes("u1") == []  # the consolidation did not start
    with pytest.raises(InvalidInputError, match="progress .*1 argument"):
        memory.add_many([{"role": "user", "content": "a turn"}], user_id="u1", session_id="s1",
                        progress=lambda step, done, total: None)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InvalidInputError, match="progress .*1 argument"):
        memory.import_jsonl(tmp_path / "empty.jsonl", progress=lambda: None)
    assert memory.get_messages("s1", user_id="u1") == []
    calls: list[tuple[object, ...]] = []  # any function that can take them is fine: defaults, *args, a builtin
    memory.consolidate("u1", progress=lambda *args: calls.append(args))
    memory.add_many([{"role": "user", "content": "a turn"}], user_id="u1", session_id="s1", progress=print)
    assert calls and all(len(c) == 3 for c in calls)
