"""A message stored as a duplicate of another is recalled by meaning once that one is gone."""

from __future__ import annotations

import time
from typing import Callable

import pytest

from tiered_memory import TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

TEXT = "I adopted a greyhound called Pixel."
QUERY = "what dog breed do I own?"  # no word in common with TEXT: found by its vector only


def _fill(memory: TieredMemory, *, at: float | None = None) -> tuple[str, str, str]:
    first = memory.add("user", TEXT, user_id="u", session_id="s1", timestamp=at)
    memory.add_many([{"role": "user", "content": f"Weather note {n}: sunny and warm at the beach."} for n in range(30)],
                    user_id="u", session_id="w")
    again = memory.add("user", TEXT, user_id="u", session_id="s2")  # a duplicate of first: no vector
    later = memory.add("user", f"  {TEXT.upper()} ", user_id="u", session_id="s3")
    assert memory.index.ids("u") & {first, again, later} == {first}
    return first, again, later


@pytest.mark.parametrize("how", ["forget", "clear_session", "consolidate"])
def test_a_duplicate_is_indexed_again_when_its_original_goes(make_memory: Callable[..., TieredMemory],
                                                            how: str) -> None:
    memory = make_memory("dups")
    first, again, later = _fill(memory, at=time.time() - 90 * 86400)
    if how == "forget":
        memory.forget(first, user_id="u")
    elif how == "clear_session":
        memory.clear_session("s1", user_id="u")
    else:  # the original's session is old: consolidate archives its turns, out of search
        memory.end_session("s1", user_id="u")
        assert memory.consolidate("u").archived_messages == 1
    # the earlier of the two left takes the original's place; the other stays its duplicate
    assert memory.index.ids("u") & {first, again, later} == {again}
    assert memory.stats().duplicates == 1
    assert memory.search(QUERY, user_id="u", k=1)[0].id == again
    memory.forget(again, user_id="u")
    assert memory.search(QUERY, user_id="u", k=1)[0].id == later


def test_the_same_text_of_another_user_is_left_alone(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("dups-users")
    first, again, _ = _fill(memory)
    other = memory.add("user", TEXT, user_id="v", session_id="s1")
    memory.forget(first, user_id="u")
    assert memory.index.ids("v") == {other}
    assert [h.id for h in memory.search(QUERY, user_id="v")] == [other]
    assert again in memory.index.ids("u")
