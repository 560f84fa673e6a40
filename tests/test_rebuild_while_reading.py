"""rebuild_index() while other threads search: reads wait for it, never fail or see half an index."""

from __future__ import annotations

import threading
from typing import Any

from tiered_memory import TieredMemory
from tiered_memory.aio import ReadWriteGate


def test_searches_during_rebuild_always_find_the_answer(memory: TieredMemory) -> None:
    memory.add_many([{"role": "user", "content": f"Filler turn {n} about the weather and the sea."}
                     for n in range(40)], session_id="s", user_id="u")
    answer = memory.add("user", "My locker code is 4471.", session_id="s", user_id="u")
    errors: list[BaseException] = []
    found: list[bool] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                hits = memory.search("what is my locker code?", user_id="u", k=3)
                found.append(answer in [h.id for h in hits])
                memory.build_context("locker code?", user_id="u", session_id="now")
            except BaseException as e:  # noqa: BLE001 - the test reports any failure
                errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(3):
        memory.rebuild_index()
    done.set()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert found and all(found)  # never a silent partial answer


def test_the_gate_makes_a_writer_wait_for_readers() -> None:
    gate = ReadWriteGate()
    order: list[str] = []
    reading = threading.Event()
    release = threading.Event()

    def reader() -> None:
        with gate.reading():
            order.append("read")
            reading.set()
            release.wait(10)
        order.append("read done")

    def writer() -> None:
        reading.wait(10)
        with gate.writing():
            order.append("write")

    threads: list[Any] = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    reading.wait(10)
    threads[1].join(0.3)
    assert order == ["read"]  # the writer waits while a reader holds the gate
    release.set()
    for t in threads:
        t.join(10)
    assert order.index("write") > order.index("read done")
