"""The kill harness of ``tests/test_crash_points.py``.

A test builds a memory, closes it (everything in it is acknowledged), then runs the
scenarios file as a child process (:func:`run_child`) that reopens the folder, arms one
kill point and starts the operation. A kill point (:func:`kill_at`) wraps one method of one
object of the child's memory: the child SIGKILLs itself on that method's ``nth`` call
(``before`` or ``after`` it runs), so every kill lands at the same place on every run. The
parent then reopens the folder (in this process and in another one) and checks it with
:func:`verify`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.layers.item_rules import text_parts, vector_id
from tiered_memory.recall.chunking import chunk_id, chunk_spans

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "test_crash_points.py"  # the child runs it: its steps register themselves
DAY = 86400.0
TURNS = ["My sister Ana moved to Porto in March.", "I am allergic to penicillin.",
         "The band rehearses every Thursday night.", "Our cat is called Miso."]


# ---------------------------------------------------------------------------
# child side: reopen, arm one kill point, run the operation
# ---------------------------------------------------------------------------
def kill_at(owner: Any, name: str, nth: int = 1, *, after: bool = False) -> None:
    """SIGKILL this process at the ``nth`` call of ``owner.name`` (before it runs, or after)."""
    original = getattr(owner, name)
    calls = [0]

    def hooked(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        out = original(*args, **kwargs)
        if calls[0] == nth and after:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, hooked)


class Hooked:
    """A proxy of ``inner`` (a Chroma collection or client, which take no new attributes)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


AT_OPEN: dict[str, Callable[[Path], None]] = {}
CHILD_STEPS: dict[str, Callable[[TieredMemory], None]] = {}


def step(fn: Callable[[TieredMemory], None]) -> Callable[[TieredMemory], None]:
    CHILD_STEPS[fn.__name__] = fn
    return fn


def child(scenario: str, folder: str) -> None:
    if scenario in AT_OPEN:  # the kill point is in the open itself
        AT_OPEN[scenario](Path(folder))
    else:
        CHILD_STEPS[scenario](open_memory(Path(folder)))
    raise SystemExit(f"scenario {scenario} ran to its end: the kill point was never reached")


def open_memory(folder: Path, **kwargs: Any) -> TieredMemory:
    kwargs.setdefault("config", MemoryConfig(write_chunk=50))
    return TieredMemory(folder, embedder=StaticEmbedder(), **kwargs)


def run_child(scenario: str, folder: Path, *, script: Path = SCENARIOS, **extra_env: str) -> None:
    """Run ``script`` (a test file whose steps registered themselves) as the child of ``scenario``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    proc = subprocess.run([sys.executable, str(script), scenario, str(folder)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (
        f"the child was to be killed in {scenario}, but it exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")


# ---------------------------------------------------------------------------
# parent side: what a reopened memory must hold
# ---------------------------------------------------------------------------
def expected_vectors(memory: TieredMemory) -> set[str]:
    """The vector ids the records call for: each kept turn and its chunks, each valid fact,
    each episode's key points, each item's text parts."""
    rows = memory._rows
    want = set(memory.store.indexed_ids())
    for m in memory.store.iter_messages():
        if m.id in want:
            want |= {chunk_id(m.id, n) for n, _ in enumerate(chunk_spans(m.content))}
    want |= {f"fact:{i}" for i in rows.valid_fact_ids()}
    want |= rows.point_ids()
    want |= {vector_id(i.id, n) for i in rows.items_with_text() for n, _ in enumerate(text_parts(i.text or ""))}
    return want


def add_old_session(memory: TieredMemory, user: str) -> None:
    """A session of :data:`TURNS` 100 days old, ended: what ``consolidate`` archives."""
    old = time.time() - 100 * DAY
    memory.add_many([{"role": "user", "content": t, "timestamp": old + n} for n, t in enumerate(TURNS)],
                    session_id="old", user_id=user)
    memory.end_session("old", user_id=user)


def snapshot(memory: TieredMemory, users: list[str]) -> dict[str, Any]:
    """What is stored now, to compare after the kill."""
    return {
        "turns": {m.id: (m.user_id, m.content) for m in memory.store.iter_messages()},
        "facts": {u: sorted(f.text for f in memory.facts(u)) for u in users},
        "episodes": {u: sorted(e.id for e in memory.episodes(u)) for u in users},
        "items": {(tuple(h.item.namespace), h.item.key): h.item.text
                  for h in memory.item_store().search((), limit=1000)},
    }


def vector_of(memory: TieredMemory, vector_id: str) -> Any:
    import numpy as np

    got = memory.index.collection.get(ids=[vector_id], include=["embeddings"])  # type: ignore[attr-defined]
    v = np.asarray(got["embeddings"][0], dtype=np.float32)
    return v / np.linalg.norm(v)


def found_by_meaning(hits: list[Any], wanted: str) -> bool:
    return any(h.id == wanted and "vector" in h.explanation["signals"] for h in hits)


def verify(folder: Path, tmp: Path, *, turns: dict[str, tuple[str, str]] | None = None,
           facts: dict[str, list[str]] | None = None, items: dict[Any, Any] | None = None,
           archived: frozenset[str] = frozenset(), gone_users: tuple[str, ...] = ()) -> dict[str, Any]:
    """Reopen ``folder`` and check it (see the module docstring); returns its stats."""
    with open_memory(folder) as memory:
        stored = {m.id: m for m in memory.store.iter_messages()}
        originals = dict(memory.store.conn.execute(  # type: ignore[attr-defined]
            "SELECT id, duplicate_of FROM messages WHERE duplicate_of IS NOT NULL").fetchall())
        for mid, (user, text) in (turns or {}).items():
            if mid in archived:
                assert mid not in stored and memory._rows.archived_by_ids(user, [mid]), f"archived turn {mid} lost"
                continue
            assert mid in stored and stored[mid].content == text, f"acknowledged turn {mid} lost"
            hits = memory.search(text, user_id=user, k=5)
            assert found_by_meaning(hits, mid) or found_by_meaning(hits, originals.get(mid, "")), (
                f"turn {mid} is not found by meaning after the reopen")
        for user, texts in (facts or {}).items():
            assert sorted(f.text for f in memory.facts(user)) == texts, f"facts of {user} changed"
            for text in texts:
                hit = memory.search_facts(text, user_id=user, k=1)[0]
                assert hit.fact.text == text and "vector" in hit.explanation["signals"]
                assert vector_of(memory, f"fact:{hit.fact.id}") @ memory.embedder.embed_query(text) > 0.99, (
                    f"the vector of fact {text!r} is not its text's")
        for (ns, key), text in (items or {}).items():  # acknowledged (text None: either, the put was cut)
            got = memory.item_store().get(ns, key)
            assert got is not None and text in (None, got.text), f"item {ns}/{key} lost"
        for hit in memory.item_store().search((), limit=1000):  # every stored item by its own text
            ns, key, text = hit.item.namespace, hit.item.key, hit.item.text
            if text:
                hits = memory.item_store().search(ns, query=text, user_id=hit.item.user_id, limit=1)
                assert hits and hits[0].item.key == key and hits[0].score is not None and hits[0].score > 0.9, (
                    f"item {key} is not found by meaning after the reopen")
        for user in gone_users:
            assert memory.store.counts()["messages"] == 0 or not memory.sessions(user)
            assert memory.facts(user, include_invalid=True) == [] and memory.episodes(user) == []
            assert memory.audit_log(user) == [] and memory._rows.archive_owners(list(turns or {})) == {}
            assert memory.index.ids(user) == set(), "vectors of a forgotten user survived"
        have = memory.index.ids()
        want = expected_vectors(memory)
        assert not want - have, f"{len(want - have)} vectors missing after the reopen: {sorted(want - have)[:5]}"
        assert not have - want, f"{len(have - want)} orphan vectors after the reopen: {sorted(have - want)[:5]}"
        stats = memory.stats()
        assert stats.indexed == stats.messages and stats.vectors == len(have)
        lines = memory.export_jsonl(tmp / "dump.jsonl")
    again = TieredMemory(tmp / "copy", embedder=StaticEmbedder())
    try:
        report = again.import_jsonl(tmp / "dump.jsonl")
        assert not report.invalid and again.export_jsonl(tmp / "dump2.jsonl") == lines
        assert again.stats().messages == stats.messages and again.stats().vectors == stats.vectors
    finally:
        again.close()
    other = subprocess.run(
        [sys.executable, "-c", "import sys, tests.crash_support as t; m = t.open_memory(t.Path(sys.argv[1])); "
         "s = m.stats(); m.close(); print(s.messages, s.vectors)", str(folder)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr
    assert other.stdout.split() == [str(stats.messages), str(stats.vectors)]  # another process agrees
    return {"messages": stats.messages, "vectors": stats.vectors}
