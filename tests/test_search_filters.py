"""search(filters=...) finds every match, wherever it ranks, and bad filters are typed errors."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest

from tiered_memory import InvalidInputError, TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _fill(memory: TieredMemory) -> None:
    # 60 turns about tea, one about the weather tagged "rare": the filter must still find it
    memory.add_many([{"role": "user", "content": f"I drink green tea number {n} every morning.",
                      "metadata": {"topic": "tea", "n": n, "flag": n % 2 == 0}} for n in range(60)],
                    session_id="s", user_id="u")
    memory.add("assistant", "It will rain tomorrow in Lisbon.", session_id="s2", user_id="u",
               metadata={"topic": "rare", "odd key.with dots": "yes", 'quote"key': "q"}, timestamp=1_700_000_000)
    memory.add("user", "Green tea for the other user.", session_id="s", user_id="v", metadata={"topic": "rare"})


@pytest.mark.parametrize("filters, expected", [
    ({"topic": "rare"}, ["It will rain tomorrow in Lisbon."]),
    ({"role": "assistant"}, ["It will rain tomorrow in Lisbon."]),
    ({"odd key.with dots": "yes"}, ["It will rain tomorrow in Lisbon."]),
    ({'quote"key': "q"}, ["It will rain tomorrow in Lisbon."]),
    ({"until": 1_700_000_001}, ["It will rain tomorrow in Lisbon."]),
    ({"topic": "nothing"}, []),
    ({"n": 7}, ["I drink green tea number 7 every morning."]),
])
def test_a_filtered_search_finds_matches_the_query_ranks_low(make_memory: Callable[..., TieredMemory],
                                                             filters: dict[str, Any], expected: list[str]) -> None:
    memory = make_memory("filters")
    _fill(memory)
    hits = memory.search("green tea in the morning", user_id="u", k=3, filters=filters)
    assert [h.text for h in hits] == expected


def test_bool_and_number_filters_match_as_in_python(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("filters-bool")
    _fill(memory)
    hits = memory.search("green tea", user_id="u", k=100, filters={"flag": True, "topic": "tea"})
    assert len(hits) == 30 and all(h.metadata["flag"] is True for h in hits)


@pytest.mark.parametrize("filters", [
    {"role": ["user"]}, {"role": "boss"}, {"since": math.nan}, {"until": math.inf}, {"since": "yesterday"},
    {"since": True}, {"topic": ["tea", "rare"]}, {"topic": {"$in": ["tea"]}}, {"n": math.nan}, {"": 1},
    {1: "x"}, ["topic"],
])
def test_a_filter_that_would_match_nothing_or_everything_silently_is_refused(
        make_memory: Callable[..., TieredMemory], filters: Any) -> None:
    memory = make_memory("filters-bad")
    memory.add("user", "hello", session_id="s", user_id="u")
    with pytest.raises(InvalidInputError):
        memory.search("hello", user_id="u", filters=filters)


@pytest.mark.parametrize("key", ["line\nbreak", "tab\there", "\x1f", "bell\x07"])
def test_a_metadata_key_json_escapes_is_matched(make_memory: Callable[..., TieredMemory], key: str) -> None:
    # JSON spells such a key with an escape (\n, \u001f): the store's SQL must not miss it
    memory = make_memory("filters-escaped-key")
    _fill(memory)
    memory.add("user", "Snow in the mountains.", session_id="s3", user_id="u", metadata={key: 1})
    hits = memory.search("green tea in the morning", user_id="u", k=3, filters={key: 1})
    assert [h.text for h in hits] == ["Snow in the mountains."]


def test_the_largest_k_and_turns_with_a_filter_find_the_sessions(make_memory: Callable[..., TieredMemory]) -> None:
    # each is at most MAX_COUNT, as checked; the pool a filtered session search asks the store
    # for must not grow past what a store takes as a number (k x turns x 4 passed 2**63)
    memory = make_memory("filters-largest")
    _fill(memory)
    found = memory.search_sessions("green tea", user_id="u", k=2**31 - 1, turns=2**31 - 1, filters={"topic": "rare"})
    assert [(s.session_id, [h.text for h in s.hits]) for s in found] == [("s2", ["It will rain tomorrow in Lisbon."])]
