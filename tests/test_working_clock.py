"""Working memory keeps the memory's time: ``TieredMemory(clock=)`` dates an item when it is
remembered and judges its decay in ``items()``, in eviction, in ``build_context`` and in
consolidate's prune, so all of them agree on how old an item is (a clock moved on in a test,
a replay or a simulation, as the store items' TTL already follows it)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import ConfigurationError, MemoryConfig, TieredMemory
from tiered_memory.config import WorkingConfig

DAY = 86_400.0
START = 1_700_000_000.0  # November 2023: far from the system clock, so its use shows


class Clock:
    """Time that moves only when the test says so."""

    def __init__(self, t: float = START) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_items_context_and_consolidate_agree_on_an_items_age_by_the_memorys_clock(
        make_memory: Callable[..., TieredMemory]) -> None:
    clock = Clock()
    memory = make_memory(clock=clock)
    wm = memory.working_memory("s1", user_id="u1")
    item = wm.remember("the user is debugging the payment webhook", importance=0.5)
    assert item.created_at == START
    assert [i.created_at for i in wm.items()] == [START]
    assert wm.items()[0].score == 0.5  # fresh: no time has passed on the memory's clock

    clock.t += 30 * DAY
    score = wm.items()[0].score
    assert score is not None and score < 1e-6  # 720 hours at 5% an hour
    context = memory.build_context("payment webhook", user_id="u1", session_id="s1")
    assert f"wm:{item.id}" in {d.id for d in context.dropped}  # faded, as items() says
    report = memory.consolidate("u1")
    assert report.details["prune"] == [item.id]
    assert wm.items() == []
    assert [(e.action, e.at) for e in memory.audit_log("u1", layer="working")] == [("prune", clock.t)]


def test_a_fresh_item_is_kept_by_all_three_when_the_clock_is_far_ahead(
        make_memory: Callable[..., TieredMemory]) -> None:
    clock = Clock(START + 3650 * DAY)  # ten years on: what the system clock calls the future
    memory = make_memory(clock=clock)
    wm = memory.working_memory("s1", user_id="u1")
    item = wm.remember("the user is debugging the payment webhook", importance=0.5)
    clock.t += 60.0
    assert wm.items()[0].score == pytest.approx(0.5, rel=1e-3)
    context = memory.build_context("payment webhook", user_id="u1", session_id="s1")
    assert f"wm:{item.id}" not in {d.id for d in context.dropped}
    assert memory.consolidate("u1").details["prune"] == []
    assert [i.id for i in wm.items()] == [item.id]


def test_eviction_judges_decay_by_the_memorys_clock(make_memory: Callable[..., TieredMemory]) -> None:
    clock = Clock()
    memory = make_memory(clock=clock, config=MemoryConfig(working=WorkingConfig(capacity=1)))
    wm = memory.working_memory("s1", user_id="u1")
    old = wm.remember("an important note from last month", importance=0.9)
    clock.t += 30 * DAY  # on the memory's clock it has faded under any fresh note
    new = wm.remember("a middling note from now", importance=0.2)
    assert [i.id for i in wm.items()] == [new.id]
    assert [(e.item_id, e.action, e.at) for e in memory.audit_log("u1", layer="working")] == [
        (old.id, "evict", clock.t)]


def test_the_scratchpad_is_dated_by_the_memorys_clock(make_memory: Callable[..., TieredMemory],
                                                       tmp_path: Path) -> None:
    clock = Clock()
    memory = make_memory(clock=clock)
    memory.working_memory("s1", user_id="u1").scratchpad["step"] = 2
    memory.export_jsonl(tmp_path / "out.jsonl", user_id="u1")
    pads = [json.loads(line)["scratchpad"] for line in (tmp_path / "out.jsonl").read_text().splitlines()
            if json.loads(line)["type"] == "scratchpad"]
    assert [(p["data"], p["updated_at"]) for p in pads] == [({"step": 2}, START)]


@pytest.mark.parametrize("clock, says", [
    (lambda: datetime.now(), "returned a datetime"),  # clock=datetime.now, not time.time
    (lambda: START * 1000, "milliseconds"),  # JavaScript's Date.now()
    (lambda: float("nan"), "returned nan"),
    (lambda: "2024-01-01", "returned a str"),
])
def test_a_clock_that_gives_no_epoch_seconds_is_a_configuration_error_and_writes_nothing(
        make_memory: Callable[..., TieredMemory], clock: Callable[[], object], says: str) -> None:
    """The memory's clock was trusted: clock=datetime.now stored a datetime as the scratchpad's
    updated_at (read back as 0.0 with a warning) and failed remember with a bare TypeError; a clock
    in milliseconds dated items and the pad 1,000 times too late, which export then rewrote; NaN
    was a StoreError of a NOT NULL column. Each is a ConfigurationError naming the clock now, and
    nothing is written."""
    memory = make_memory(clock=clock)
    wm = memory.working_memory("s1", user_id="u1")
    for write in (lambda: wm.remember("a note"), lambda: wm.scratchpad.__setitem__("step", 2)):
        with pytest.raises(ConfigurationError, match=f"clock.*{says}"):
            write()
    memory.close()
    again = make_memory()  # the same folder, on the system clock
    assert again.working_memory("s1", user_id="u1").items() == []
    assert again.working_memory("s1", user_id="u1").scratchpad.to_dict() == {}


def test_a_clock_of_numpys_numbers_is_accepted() -> None:
    """A simulation's clock may return numpy's numbers: they are seconds as well."""
    import numpy as np

    from tiered_memory.parts import clock_seconds

    assert clock_seconds(np.int64(START)) == clock_seconds(np.float64(START)) == clock_seconds(int(START)) == START
