"""What ``WorkingMemory.remember`` returns when the session's capacity evicts the new item at once."""

from __future__ import annotations

import json
from pathlib import Path

from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.config import WorkingConfig

T = 1_800_000_000.0


def test_an_item_evicted_as_it_is_remembered_says_so(tmp_path: Path) -> None:
    """A session at capacity evicts the least important item, a new one too (with its evict
    entry in the audit log): remember returned it as though it were kept, an item whose id
    ``forget`` does not find. The item it returns says it was evicted; a kept one says not, and
    neither an export nor a listing carries the flag (it is no part of the stored item)."""
    config = MemoryConfig(working=WorkingConfig(capacity=1))
    with TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), config=config) as memory:
        wm = memory.working_memory("s", user_id="u")
        kept = wm.remember("User is debugging the payment webhook", importance=0.9, now=T)
        dropped = wm.remember("User said hello", importance=0.1, now=T)
        assert (kept.evicted, dropped.evicted) == (False, True)
        assert [i.id for i in wm.items(now=T)] == [kept.id] and not wm.items(now=T)[0].evicted
        assert not wm.forget(dropped.id)
        assert [(e.action, e.details["text"]) for e in memory.audit_log("u", layer="working")] == [
            ("evict", "User said hello")]
        # a newer, more important item evicts the one held: the new one is kept, and says so
        newer = wm.remember("User wants the fix deployed today", importance=0.95, now=T)
        assert not newer.evicted and [i.id for i in wm.items(now=T)] == [newer.id]
        memory.export_jsonl(tmp_path / "dump.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "dump.jsonl").read_text().splitlines()]
    [line] = [x for x in lines if x["type"] == "working"]
    assert "evicted" not in line["working"] and line["working"]["id"] == newer.id
