"""Message ids the library chooses: time-ordered (UUIDv7 layout), unique, increasing."""

from __future__ import annotations

import threading
import uuid

from tiered_memory import ids
from tiered_memory.ids import new_id


def test_ids_are_uuid7_hex_and_increase_within_one_millisecond_and_across_threads():
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(new_id() for _ in range(20_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every) == 80_000
    assert all(out == sorted(out) for out in made)  # each thread sees them increase
    parsed = uuid.UUID(every[0])
    assert len(every[0]) == 32 and parsed.version == 7 and parsed.variant == uuid.RFC_4122


def test_a_clock_that_steps_back_does_not_make_an_id_go_back(monkeypatch):
    first = new_id()
    monkeypatch.setattr(ids, "_clock", lambda: 1_000_000_000 * 1_000_000)  # 1970, far back
    later = [new_id() for _ in range(5000)]  # past the counter's 4,096 per millisecond too
    assert later == sorted(later) and first < later[0]
