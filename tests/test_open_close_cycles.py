"""Opening and closing a memory again and again in one process does not grow its memory."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

from tiered_memory import StaticEmbedder, TieredMemory

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")]
CYCLES = 300
BOUND_MB = 10.0  # ~35 KB per open/close cycle; measured: well under 1 MB for 300 cycles


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_open_close_cycles_stay_within_a_bound(tmp_path: Path) -> None:
    embedder = StaticEmbedder()
    with TieredMemory(tmp_path, embedder=embedder) as memory:
        memory.add("user", "hello there", session_id="s", user_id="u")
        memory.add_fact("User says hello", user_id="u")
    for _ in range(50):  # warm up: caches, the tokenizer, Chroma's first client
        with TieredMemory(tmp_path, embedder=embedder) as memory:
            memory.build_context("hello", user_id="u", session_id="s")
    gc.collect()
    before = rss_mb()
    for _ in range(CYCLES):
        with TieredMemory(tmp_path, embedder=embedder) as memory:
            assert memory.search("hello", user_id="u")
            memory.build_context("hello", user_id="u", session_id="s")
    gc.collect()
    assert rss_mb() - before < BOUND_MB
