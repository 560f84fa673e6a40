"""User isolation on the paths the state machine of ``test_isolation.py`` does not reach:
message ids reused across users (ids may be chosen by the caller), the background writes
of access counts, the keyword index's per-user tags, and the adapters' choice of user."""

from __future__ import annotations

import pytest

from tiered_memory import TieredMemory

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


def _access_counts(memory: TieredMemory, message_id: str) -> list[tuple[str, int]]:
    mark = "?" if memory.store.__class__.__name__.startswith("SQLite") else "%s"
    return [(r[0], int(r[1])) for r in memory.store.query(  # type: ignore[attr-defined]
        f"SELECT user_id, access_count FROM messages WHERE id = {mark}", (message_id,))]


def test_an_access_noted_for_one_user_never_counts_on_another_users_message_with_the_same_id(
        memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": "I keep bees on the roof", "id": "m1"}],
                    session_id="s", user_id="ana")
    assert [h.id for h in memory.search("bees on the roof", user_id="ana")] == ["m1"]  # noted, written later
    memory.forget("m1", user_id="ana")
    # the id is free again, and another user's app chooses it for its own message
    memory.add_many([{"role": "user", "content": "Bo keeps bees in the garden", "id": "m1"}],
                    session_id="s", user_id="bo")
    memory.flush()  # the noted access is written now
    assert _access_counts(memory, "m1") == [("bo", 0)]
