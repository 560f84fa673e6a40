"""Working memory and the item store have typed async twins, and validate their input."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tiered_memory import ContentTooLargeError, InvalidInputError, TieredMemory
from tiered_memory.layers.items import ItemWrite


async def test_working_memory_twins(memory: TieredMemory) -> None:
    wm = memory.working_memory("s", user_id="u")
    item = await wm.aremember("user is choosing a laptop", importance=0.8, type="goal")
    assert [i.id for i in await wm.aitems("laptop")] == [item.id]
    assert await wm.aforget(item.id) is True
    await wm.aremember("note", type="note")
    assert await wm.aclear() == 1 and await wm.aitems() == []


async def test_item_store_twins(memory: TieredMemory) -> None:
    items = memory.item_store()
    await items.awrite_many([ItemWrite(user_id="u", namespace=("u", "prefs"), key="tea",
                                       value={"kind": "green"}, text="likes green tea")])
    got = await items.aget(("u", "prefs"), "tea")
    assert got is not None and got.value == {"kind": "green"}
    assert (await items.acount("u")) == 1
    assert (await items.anamespaces()) == [("u", "prefs")]


@pytest.mark.parametrize("call", [
    lambda wm: wm.items(k=-1), lambda wm: wm.items(k=True), lambda wm: wm.items(query=5),
    lambda wm: wm.items(query="caf\udce9"),  # a lone surrogate (a non-UTF-8 argv byte)
    lambda wm: wm.remember("x", importance=True), lambda wm: wm.remember("x", importance=math.nan),
    lambda wm: wm.remember("x", metadata={1: "a"}), lambda wm: wm.remember("x", metadata={"a": {2: "b"}}),
    lambda wm: wm.remember("x", metadata={"s": {1, 2}}), lambda wm: wm.remember("x", metadata=["a"]),
])
def test_working_memory_input_is_validated(memory: TieredMemory, call: Any) -> None:
    wm = memory.working_memory("s", user_id="u")
    kept = wm.remember("user is choosing a laptop")
    with pytest.raises(InvalidInputError):
        call(wm)
    assert [i.id for i in wm.items()] == [kept.id]


def test_a_huge_working_item_is_refused(memory: TieredMemory) -> None:
    with pytest.raises(ContentTooLargeError):
        memory.working_memory("s", user_id="u").remember("x" * 10_000_000)


@pytest.mark.parametrize("key, value", [(1, "a"), ("", "a"), ("k", {1: "a"}), ("k", {1, 2}), ("k", math.nan)])
def test_scratchpad_keys_and_values_are_checked(memory: TieredMemory, key: Any, value: Any) -> None:
    pad = memory.working_memory("s", user_id="u").scratchpad
    with pytest.raises(InvalidInputError):
        pad[key] = value
    assert pad.to_dict() == {}


@pytest.mark.parametrize("call, error", [
    (lambda m: m.add_fact("x" * 10_000_000, user_id="u"), ContentTooLargeError),
    (lambda m: m.add_fact("User likes tea", user_id="u", metadata={"s": {1}}), InvalidInputError),
    (lambda m: m.add_fact("User likes tea", user_id="u", metadata=["a"]), InvalidInputError),
    (lambda m: m.add_fact("User likes tea", user_id="u", confidence=True), InvalidInputError),
    (lambda m: m.add_fact("User likes tea", user_id="u", confidence=math.nan), InvalidInputError),
])
def test_add_fact_input_is_validated(memory: TieredMemory, call: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        call(memory)
    assert memory.facts("u") == []


@pytest.mark.parametrize("changes", [{"colour": "blue"}, {"confidence": "high"}, {"confidence": 2},
                                     {"metadata": {"a": {1: 2}}}, {"text": ""}])
def test_update_fact_input_is_validated(memory: TieredMemory, changes: dict[str, Any]) -> None:
    fact = memory.add_fact("User likes tea", user_id="u")
    with pytest.raises(InvalidInputError):
        memory.update_fact(fact.id, user_id="u", **changes)
    assert memory.facts("u")[0].text == "User likes tea"
