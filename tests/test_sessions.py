"""TieredMemory.sessions: a user's sessions, in the order they started, scoped to the user."""

from __future__ import annotations

from typing import Callable

import pytest

from tiered_memory import InvalidInputError, SessionInfo, TieredMemory


async def test_sessions_are_listed_per_user_in_order_and_follow_deletes(
    make_memory: Callable[..., TieredMemory],
) -> None:
    m = make_memory()
    m.add_many([{"role": "user", "content": "first words", "timestamp": 1_700_000_000},
                {"role": "assistant", "content": "hello", "timestamp": 1_700_000_030}],
               session_id="monday", user_id="ana")
    m.add("user", "a second session", session_id="tuesday", user_id="ana", timestamp=1_700_090_000)
    m.add("user", "someone else", session_id="monday", user_id="ben", timestamp=1_700_000_000)
    assert m.sessions("ana") == [
        SessionInfo(session_id="monday", messages=2, first=1_700_000_000.0, last=1_700_000_030.0),
        SessionInfo(session_id="tuesday", messages=1, first=1_700_090_000.0, last=1_700_090_000.0)]
    assert [s.session_id for s in await m.asessions("ben")] == ["monday"]
    m.clear_session("monday", user_id="ana")
    assert [s.session_id for s in m.sessions("ana")] == ["tuesday"]
    assert m.sessions("nobody") == []
    with pytest.raises(InvalidInputError):
        m.sessions("")
