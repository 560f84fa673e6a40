"""Caller-chosen message ids make a retried add_many store its batch once, on every record store."""

from __future__ import annotations

from typing import Callable

import pytest

from tiered_memory import InvalidInputError, Message, TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

BATCH = [{"id": "m-1", "role": "user", "content": "I moved to Porto."},
         {"id": "m-2", "role": "assistant", "content": "Porto is lovely."}]


def test_retrying_the_same_batch_stores_it_once(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("idem")
    assert memory.add_many(BATCH, session_id="s", user_id="u") == ["m-1", "m-2"]
    assert memory.add_many(BATCH, session_id="s", user_id="u") == ["m-1", "m-2"]  # the retry
    assert [m.id for m in memory.get_messages("s", user_id="u")] == ["m-1", "m-2"]
    assert memory.stats().messages == 2 and memory.stats().vectors == 2
    # a retry that overlaps a stored prefix stores only the rest
    more = [*BATCH, Message(id="m-3", role="user", content="And I got a cat.")]
    assert memory.add_many(more, session_id="s", user_id="u") == ["m-1", "m-2", "m-3"]
    assert [m.id for m in memory.get_messages("s", user_id="u")] == ["m-1", "m-2", "m-3"]
    assert [h.id for h in memory.search("cat", user_id="u", k=1)] == ["m-3"]


@pytest.mark.parametrize("batch, fragment", [
    ([{"id": "m-1", "role": "user", "content": "Something else entirely."}], "different message"),
    ([{"id": "x", "role": "user", "content": "a"}, {"id": "x", "role": "user", "content": "b"}], "same id"),
    ([{"id": "", "role": "user", "content": "a"}], "message id"),
    ([{"id": 7, "role": "user", "content": "a"}], "message id"),
])
def test_conflicting_ids_are_refused_and_nothing_is_written(make_memory: Callable[..., TieredMemory],
                                                            batch: list[dict[str, object]], fragment: str) -> None:
    memory = make_memory("idem-bad")
    memory.add_many(BATCH, session_id="s", user_id="u")
    with pytest.raises(InvalidInputError, match=fragment):
        memory.add_many(batch, session_id="s", user_id="u")
    assert [m.id for m in memory.get_messages("s", user_id="u")] == ["m-1", "m-2"]


def test_an_id_another_user_holds_is_refused_without_touching_theirs(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory("idem-users")
    memory.add_many(BATCH, session_id="s", user_id="alice")
    with pytest.raises(InvalidInputError, match="already in use"):
        memory.add_many(BATCH, session_id="s", user_id="mallory")
    assert memory.get_messages("s", user_id="mallory") == []
    assert [m.content for m in memory.get_messages("s", user_id="alice")] == ["I moved to Porto.", "Porto is lovely."]


def test_a_retry_after_consolidate_archived_the_batch_stores_nothing_again(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A turn ``consolidate`` moved to the archive is still stored: the retry of its batch skips
    it (it is not stored live a second time), and its id keeps the same rules as a live one's."""
    memory = make_memory("idem-archived")
    old = [{**m, "timestamp": 1_700_000_000.0 + n} for n, m in enumerate(BATCH)]
    memory.add_many(old, session_id="s", user_id="u")
    assert memory.consolidate("u").archived_messages == 2 and memory.get_messages("s", user_id="u") == []
    assert memory.add_many(old, session_id="s", user_id="u") == ["m-1", "m-2"]  # the retry
    assert memory.get_messages("s", user_id="u") == [] and memory.search("Porto", user_id="u") == []
    assert memory.stats().messages == 0
    with pytest.raises(InvalidInputError, match="different message"):
        memory.add_many([{"id": "m-1", "role": "user", "content": "Something else entirely."}],
                        session_id="s", user_id="u")
    with pytest.raises(InvalidInputError, match="already in use"):
        memory.add_many(old, session_id="s", user_id="mallory")
    assert memory.get_messages("s", user_id="mallory") == [] and memory.stats().messages == 0
