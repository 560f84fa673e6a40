"""TieredMemoryStore's TTLs as LangGraph users set them: expiry, refresh on read, the sweeper."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import pytest

from hook_support import commits_during
from langchain_tiered_memory import TieredMemoryStore
from tiered_memory import InvalidInputError, TieredMemory, UsageError

pytestmark = pytest.mark.record_stores("sqlite", "postgres")


class Clock:
    """Time that moves only when the test says so (``TieredMemory(clock=)``)."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, minutes: float) -> None:
        self.t += minutes * 60


def test_ttl_expired_items_are_omitted_and_swept(make_memory: Any) -> None:
    clock = Clock()
    memory = make_memory(clock=clock)
    store = TieredMemoryStore(memory, fields=["text"], ttl={"default_ttl": 10, "refresh_on_read": False})
    store.put(("u1", "m"), "short", {"text": "a fleeting note"})
    store.put(("u1", "m"), "kept", {"text": "a lasting note"}, ttl=None)
    store.put(("u2", "gone"), "k", {"text": "x"})
    clock.advance(9.9)
    assert store.get(("u1", "m"), "short") is not None
    assert store.sweep_ttl() == 0
    clock.advance(0.2)
    assert store.get(("u1", "m"), "short") is None
    assert [h.key for h in store.search(("u1",), query="note")] == ["kept"]
    assert [h.key for h in store.search(("u1",))] == ["kept"]
    assert store.list_namespaces() == [("u1", "m")]
    vectors = memory.index.count()
    assert store.sweep_ttl() == 2 and store.sweep_ttl() == 0
    assert memory.item_store().count() == 1 and memory.index.count() == vectors - 2


def test_a_put_after_its_key_expired_makes_a_new_item(make_memory: Any) -> None:
    """Every read says an expired item is gone, swept or not: a later put of its key is a new
    item (created now), as after a sweep, and an overwrite of a live item keeps its created_at."""
    clock = Clock()
    store = TieredMemoryStore(make_memory(clock=clock), ttl={"default_ttl": 10})
    store.put(("u1", "m"), "k", {"v": 1})
    clock.advance(11)
    assert store.get(("u1", "m"), "k") is None  # expired, not swept
    store.put(("u1", "m"), "k", {"v": 2})
    again = store.get(("u1", "m"), "k")
    assert again is not None and again.value == {"v": 2}
    assert again.created_at == again.updated_at == datetime.fromtimestamp(clock.t, tz=timezone.utc)
    clock.advance(1)
    store.put(("u1", "m"), "k", {"v": 3})  # a live item overwritten: created_at kept
    assert store.get(("u1", "m"), "k").created_at == again.created_at  # type: ignore[union-attr]
    assert store.sweep_ttl() == 0 and store.memory.item_store().count() == 1  # the expired row is gone


def test_ttl_refresh_on_read_restarts_the_clock(make_memory: Any) -> None:
    clock = Clock()
    store = TieredMemoryStore(make_memory(clock=clock), ttl={"default_ttl": 10, "refresh_on_read": True})
    store.put(("u1", "m"), "read", {"a": 1})
    store.put(("u1", "m"), "unread", {"a": 2})
    store.put(("u1", "m"), "peeked", {"a": 3})
    clock.advance(6)
    assert store.get(("u1", "m"), "read") is not None  # refreshes
    assert store.get(("u1", "m"), "peeked", refresh_ttl=False) is not None  # does not
    clock.advance(6)  # 12 minutes after the writes, 6 after the refresh
    assert store.get(("u1", "m"), "read", refresh_ttl=False) is not None
    assert store.get(("u1", "m"), "unread") is None and store.get(("u1", "m"), "peeked") is None


def test_ttl_sweeper_thread_and_config_checks(memory: TieredMemory) -> None:
    store = TieredMemoryStore(memory, ttl={"default_ttl": 0.001, "sweep_interval_minutes": 0.005})
    store.put(("u1", "m"), "k", {"a": 1})
    thread = store.start_ttl_sweeper()
    assert store.start_ttl_sweeper() is thread
    deadline = time.time() + 10
    while memory.item_store().count() and time.time() < deadline:
        time.sleep(0.1)
    assert memory.item_store().count() == 0
    assert store.stop_ttl_sweeper(timeout=5) and not thread.is_alive()
    with pytest.raises(InvalidInputError, match="sweep interval"):
        TieredMemoryStore(memory).start_ttl_sweeper()
    with pytest.raises(InvalidInputError, match="ttl must be"):
        TieredMemoryStore(memory, ttl={"default_ttl": -1})
    with pytest.raises(InvalidInputError, match="unknown TTLConfig"):
        TieredMemoryStore(memory, ttl={"default": 5})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(InvalidInputError, match="ttl must be"):
        TieredMemoryStore(memory).put(("u1", "m"), "k", {"a": 1}, ttl=0)


def test_a_swept_item_leaves_no_vector_of_any_field(make_memory: Any) -> None:
    clock = Clock()
    memory = make_memory(clock=clock)
    store = TieredMemoryStore(memory, fields=["title", "body", "tags[*]"], ttl={"default_ttl": 5})
    store.put(("u1", "notes"), "trip", {"title": "Lisbon trip", "body": "Trams and tiles", "tags": ["travel", "pt"]})
    store.put(("u1", "notes"), "kept", {"title": "Kept"}, ttl=None)
    assert memory.index.count() == 5
    clock.advance(6)
    assert store.sweep_ttl() == 1
    assert sorted(memory.index.ids()) == [f"item:{memory.item_store().get(('u1', 'notes'), 'kept').id}"]  # type: ignore[union-attr]


def test_the_sweeper_defaults_to_langgraphs_interval_and_outlives_a_failed_sweep(
        make_memory: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    from tiered_memory.testing import FailingVectorIndex
    from tiered_memory.vector.chroma import ChromaVectorIndex

    # a TTLConfig without sweep_interval_minutes sweeps every 5 minutes, as LangGraph's stores do
    idle = TieredMemoryStore(make_memory("idle"), ttl={"default_ttl": 60})
    assert idle.start_ttl_sweeper().is_alive() and idle.stop_ttl_sweeper(timeout=5)
    index = FailingVectorIndex(ChromaVectorIndex(str(tmp_path / "v")), fail_on=[], times=1)
    memory = make_memory("failing", vector_store=index)
    store = TieredMemoryStore(memory, ttl={"default_ttl": 0.001, "sweep_interval_minutes": 0.003})
    store.put(("u1", "m"), "first", {"a": 1})
    index.fail_on = {"delete"}  # the next vector delete, the first sweep's, fails
    thread = store.start_ttl_sweeper()
    deadline = time.time() + 10
    while index.failures == 0 and time.time() < deadline:
        time.sleep(0.05)
    assert index.failures == 1  # the first sweep failed...
    store.put(("u1", "m"), "second", {"a": 2})
    while memory.item_store().count() and time.time() < deadline:
        time.sleep(0.05)
    assert memory.item_store().count() == 0 and thread.is_alive()  # ...and the next ones still ran
    assert "TTL sweep" in caplog.text
    assert store.stop_ttl_sweeper(timeout=5)


def test_an_explicit_refresh_ttl_overrides_a_config_that_does_not_refresh_on_read(make_memory: Any) -> None:
    """LangGraph's TTLConfig: refresh_on_read is the default "which can be overridden per operation by
    explicitly setting refresh_ttl" (as PostgresStore does); refresh_ttl=True on a get or a search of a
    store configured with refresh_on_read=False restarts the clock of what it returns."""
    clock = Clock()
    store = TieredMemoryStore(make_memory(clock=clock), fields=["text"],
                              ttl={"default_ttl": 10, "refresh_on_read": False})
    for key in ("got", "found", "searched", "untouched"):
        store.put(("u1", "m"), key, {"text": f"note {key}"})
    clock.advance(6)
    assert store.get(("u1", "m"), "got", refresh_ttl=True) is not None
    assert [h.key for h in store.search(("u1",), filter={"text": "note found"}, refresh_ttl=True)] == ["found"]
    assert [h.key for h in store.search(("u1",), query="note searched", limit=1, refresh_ttl=True)] == ["searched"]
    assert store.get(("u1", "m"), "untouched") is not None  # the config's default: no refresh
    clock.advance(6)  # 12 minutes after the puts, 6 after the refreshes
    assert [k for k in ("got", "found", "searched", "untouched") if store.get(("u1", "m"), k)] == [
        "got", "found", "searched"]


@pytest.mark.timeout(120)  # the guard against a thread that waits out its hour
def test_the_sweeper_ends_when_the_memory_closes_not_at_its_next_interval(make_memory: Any) -> None:
    """The sweeper woke only at its next interval (LangGraph's default: 5 minutes) to find the
    memory closed, so a process that closed the memory kept the thread, the store and the
    closed memory until then; it now ends as close() begins. A sweeper started on a closed
    memory is refused as its other calls are."""
    memory = make_memory()
    store = TieredMemoryStore(memory, ttl={"default_ttl": 60, "sweep_interval_minutes": 60})
    thread = store.start_ttl_sweeper()
    memory.close()
    thread.join()
    assert not thread.is_alive()
    with pytest.raises(UsageError, match="closed"):
        TieredMemoryStore(memory, ttl={"default_ttl": 60}).start_ttl_sweeper()


@pytest.mark.record_stores("sqlite")
def test_a_refreshing_read_writes_only_for_items_that_expire(make_memory: Any) -> None:
    """A store configured with TTL opened a write transaction on every refreshing get and search,
    also when every item read was stored without a TTL (nothing to restart): a read took the
    write lock. Only items that expire are written, and theirs still restart."""
    clock = Clock()
    memory = make_memory(clock=clock)
    store = TieredMemoryStore(memory, fields=["text"], ttl={"default_ttl": 10, "refresh_on_read": True})
    store.put(("u1", "m"), "lasting", {"text": "a lasting note"}, ttl=None)
    store.put(("u1", "m"), "fleeting", {"text": "a fleeting note"})
    assert commits_during(memory, lambda: store.get(("u1", "m"), "lasting")) == 0
    assert commits_during(memory, lambda: store.search(("u1",), filter={"text": "a lasting note"})) == 0
    assert commits_during(memory, lambda: store.search(("u1",), query="lasting", limit=1)) == 0
    clock.advance(6)
    assert commits_during(memory, lambda: store.get(("u1", "m"), "fleeting")) == 1  # restarts its clock
    clock.advance(6)  # 12 minutes after the put, 6 after the refresh
    assert store.get(("u1", "m"), "fleeting", refresh_ttl=False) is not None
