"""The demo behind ``tiered-memory demo``: load a bundled sample conversation into a
temporary folder, show what search and build_context return, and show that a
restart keeps everything. Runs offline with the bundled model; no API key.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import time
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Callable, Iterator

from .embedding import Embedder
from .memory import TieredMemory
from .types import MemoryHit

SAMPLE = "sample_conversation.json"
CONTEXT_BUDGET = 400


def load_sample() -> dict[str, Any]:
    """The bundled sample (two users, a few sessions each, and demo questions)."""
    text = resources.files("tiered_memory").joinpath("data", SAMPLE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def sample_sessions(sample: dict[str, Any]) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """``(user_id, session_id, messages)`` with timestamps one minute apart (pure)."""
    for user in sample["users"]:
        for session in user["sessions"]:
            start = datetime.fromisoformat(session["started"].replace("Z", "+00:00"))
            messages = [
                {"role": m["role"], "content": m["content"],
                 "timestamp": (start + timedelta(minutes=n)).timestamp()}
                for n, m in enumerate(session["messages"])
            ]
            yield user["user_id"], session["session_id"], messages


def load_into(memory: TieredMemory, sample: dict[str, Any]) -> int:
    """Store every sample session; returns how many messages were stored."""
    n = 0
    for user_id, session_id, messages in sample_sessions(sample):
        n += len(memory.add_many(messages, session_id=session_id, user_id=user_id))
    return n


def shorten(text: str, width: int = 88) -> str:
    return textwrap.shorten(" ".join(text.split()), width=width, placeholder=" ...")


def describe_hit(hit: MemoryHit) -> str:
    """``cos 0.52, keyword`` from a hit's explanation (whatever signals it carries)."""
    signals = hit.explanation.get("signals", {}) if isinstance(hit.explanation, dict) else {}
    parts = []
    vector = signals.get("vector")
    if isinstance(vector, dict) and isinstance(vector.get("value"), (int, float)):
        parts.append(f"cos {vector['value']:.2f}")
    if "keyword" in signals:
        parts.append("keyword match")
    return ", ".join(parts) or "recency only"


def run(out: Callable[[str], None] = print, *, embedder: Embedder | None = None) -> int:
    """Run the demo, writing lines with ``out``; returns a process exit code."""
    sample = load_sample()
    questions = sample["questions"]
    with tempfile.TemporaryDirectory(prefix="tiered-memory-demo-") as tmp:
        path = os.path.join(tmp, "memory")
        out(f"tiered-memory demo: a temporary store in {path}")
        out("(embedded default: SQLite + Chroma + the static embedder distilled from all-MiniLM-L6-v2; "
            "offline, no API key, no torch)")
        out("")
        t0 = time.perf_counter()
        with TieredMemory(path, embedder=embedder) as memory:
            stored = load_into(memory, sample)
            loaded_s = time.perf_counter() - t0
            stats = memory.stats()
            out(f"Loaded {stored} messages: {stats.users} users, {stats.sessions} sessions, "
                f"{stats.vectors} vectors ({loaded_s:.1f} s, model load included)")
            first_top: str | None = None
            for q in questions:
                user, session, query = q["user_id"], q["session_id"], q["query"]
                out("")
                out(f"[{user}] {query}")
                t = time.perf_counter()
                hits = memory.search(query, user_id=user, k=3)
                ms = (time.perf_counter() - t) * 1000
                if first_top is None and hits:
                    first_top = hits[0].id
                for rank, h in enumerate(hits, 1):
                    out(f"  {rank}. score {h.score:.4f} ({describe_hit(h)}; {memory.count_tokens(h.text)} tokens)"
                        f"  {h.session_id}")
                    out(f"     {h.role}: {shorten(h.text)}")
                ctx = memory.build_context(query, user_id=user, session_id=session,
                                           max_tokens=CONTEXT_BUDGET)
                kept = sum(len(s.items) for s in ctx.sections)
                out(f"  search took {ms:.0f} ms; build_context: {ctx.tokens} of {CONTEXT_BUDGET} tokens, "
                    f"{kept} memories kept, {len(ctx.dropped)} left out for the budget")
            leaks = [h for h in memory.search("Biscuit the beagle", user_id="sam", k=10)
                     if "Biscuit" in h.text]
            out("")
            out(f"Memory is per user: searching Sam's memory for 'Biscuit the beagle' finds "
                f"{len(leaks)} of Maria's messages about her dog.")
            q = questions[0]
            ctx = memory.build_context(q["query"], user_id=q["user_id"], session_id=q["session_id"],
                                       max_tokens=150)
            out("")
            out(f"What an LLM would be given for [{q['user_id']}] {q['query']!r} within 150 tokens "
                f"({ctx.tokens} used):")
            for line in ctx.to_text().splitlines():
                out("  | " + line)
            before = memory.stats()
        with TieredMemory(path, embedder=embedder) as reopened:
            after = reopened.stats()
            again = reopened.search(questions[0]["query"], user_id=questions[0]["user_id"], k=3)
            same = bool(again) and again[0].id == first_top
        out("")
        out(f"Restart: closed and reopened the folder: {before.messages} messages before, "
            f"{after.messages} after; {after.vectors} vectors; same top answer: {'yes' if same else 'no'}")
        ok = after.messages == before.messages == stored and same and not leaks
    out("Done. The temporary store was deleted.")
    return 0 if ok else 1
