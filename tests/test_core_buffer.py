"""The per-session buffer keeps whole user->assistant turns, newest first; evicted turns stay searchable."""

from __future__ import annotations

import pytest

from tiered_memory import BufferConfig, MemoryConfig
from tiered_memory.layers.buffer import group_turns, newest_within, select_buffer
from tiered_memory.types import StoredMessage


def msgs(spec: str) -> list[StoredMessage]:
    """'u a u a' -> messages with ids m0.. and one token per content word."""
    roles = {"u": "user", "a": "assistant", "t": "tool", "s": "system"}
    return [StoredMessage(id=f"m{i}", user_id="u", session_id="s", role=roles[r], content=f"w{i}",
                          timestamp=float(i)) for i, r in enumerate(spec.split())]


def one_token(text: str) -> int:
    return 1


@pytest.mark.parametrize("spec, turns", [
    ("u a u a", [["m0", "m1"], ["m2", "m3"]]),
    ("a u a", [["m0"], ["m1", "m2"]]),  # a greeting before the first user message
    ("u a t a u", [["m0", "m1", "m2", "m3"], ["m4"]]),
    ("u u a", [["m0"], ["m1", "m2"]]),
    ("", []),
])
def test_group_turns(spec, turns):
    assert [[m.id for m in t] for t in group_turns(msgs(spec))] == turns


@pytest.mark.parametrize("spec, max_messages, max_tokens, kept", [
    ("u a u a u a", 4, 100, ["m2", "m3", "m4", "m5"]),
    ("u a u a u a", 5, 100, ["m2", "m3", "m4", "m5"]),  # never half a turn
    ("u a u a u a", 6, 100, ["m0", "m1", "m2", "m3", "m4", "m5"]),
    ("u a u a u a", 100, 3, ["m4", "m5"]),  # token limit
    ("u a u a u a", 100, 4, ["m2", "m3", "m4", "m5"]),  # a limit is reached, not passed: both turns fit
    ("u a t a", 2, 100, ["m0", "m1", "m2", "m3"]),  # the newest turn is kept even when over
    ("u a u a t a", 3, 100, ["m2", "m3", "m4", "m5"]),
    ("", 4, 100, []),
])
def test_select_buffer_evicts_whole_turns_from_the_front(spec, max_messages, max_tokens, kept):
    messages = msgs(spec)
    got, evicted = select_buffer(messages, max_messages=max_messages, max_tokens=max_tokens, count=one_token)
    assert [m.id for m in got] == kept
    assert [m.id for m in evicted] + [m.id for m in got] == [m.id for m in messages]


@pytest.mark.parametrize("spec, room, whole, kept", [
    ("u a u a u a", 4, 10, ["m2", "m3", "m4", "m5"]),
    ("u a u a u a", 3, 10, ["m4", "m5"]),  # whole turns, oldest first out: never an answer alone
    ("u a t a", 2, 10, ["m0", "m1", "m2", "m3"]),  # the newest turn over room, within the whole budget
    ("u a u a t a", 3, 3, ["m3", "m4", "m5"]),  # over the whole budget too: its newest messages that fit
    ("u a", 0, 0, ["m1"]),  # at least its last one, for the caller to cut
    ("a u a", 2, 10, ["m1", "m2"]),
    ("", 4, 10, []),
])
def test_newest_within_keeps_whole_turns(spec, room, whole, kept):
    messages = msgs(spec)
    got, left = newest_within(messages, lambda m: 1, room=room, whole=whole)
    assert [m.id for m in got] == kept
    assert [m.id for m in left] + [m.id for m in got] == [m.id for m in messages]


def test_facade_buffer_and_eviction(make_memory):
    memory = make_memory(config=MemoryConfig(buffer=BufferConfig(max_messages=4, max_tokens=10_000)))
    turns = [("My passport number ends in 7781.", "Got it."),
             ("I am flying to Oslo next week.", "Have a nice trip."),
             ("The hotel is near the opera house.", "Sounds great."),
             ("I need a rain jacket.", "Oslo is rainy in autumn.")]
    ids = []
    for user, assistant in turns:
        ids += memory.add_many([{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
                               session_id="trip", user_id="u")
    buffer = memory.get_buffer("trip", user_id="u")
    assert [m.id for m in buffer] == ids[4:]
    assert buffer[0].role == "user"
    # the evicted first turn is still in long-term memory
    hit = memory.search("what are the last digits of my passport?", user_id="u", k=1)[0]
    assert hit.id == ids[0]
    ctx = memory.build_context("passport digits", user_id="u", session_id="trip")
    assert [i.id for i in ctx.recent] == ids[4:]
    assert ids[0] in {i.id for s in ctx.sections for i in s.items}


def test_facade_buffer_respects_the_token_limit(make_memory):
    memory = make_memory(config=MemoryConfig(buffer=BufferConfig(max_messages=100, max_tokens=30)))
    long_turn = [{"role": "user", "content": "word " * 25}, {"role": "assistant", "content": "ok"}]
    short_turn = [{"role": "user", "content": "short question"}, {"role": "assistant", "content": "short answer"}]
    memory.add_many(long_turn, session_id="s", user_id="u")
    ids = memory.add_many(short_turn, session_id="s", user_id="u")
    assert [m.id for m in memory.get_buffer("s", user_id="u")] == ids


def test_the_newest_turn_is_whole_however_many_messages_it_holds(make_memory):
    """An agent's turn (a question, many tool results, the answer) can hold more messages than
    the buffer fetches at first: the buffer still starts at the turn's user message."""
    memory = make_memory(config=MemoryConfig(buffer=BufferConfig(max_messages=3, max_tokens=10_000)))
    memory.add_many([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
                    session_id="s", user_id="u")
    turn = [{"role": "user", "content": "Find my flights to Oslo."},
            *({"role": "tool", "content": f"flight search result {n}"} for n in range(7)),
            {"role": "assistant", "content": "You fly on Monday at 9."}]
    ids = memory.add_many(turn, session_id="s", user_id="u")
    assert [m.id for m in memory.get_buffer("s", user_id="u")] == ids
    ctx = memory.build_context("flights", user_id="u", session_id="s", max_tokens=10_000)
    assert [i.id for i in ctx.recent] == ids
