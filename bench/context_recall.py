"""Context recall at a token budget: how much of a question's evidence ``build_context``
hands the model.

For each LoCoMo question the context is built with budgets of 500, 1,000 and 2,000
tokens (:data:`BUDGETS`) in a new, empty session, and the evidence turns that reach the
model are counted:

- **direct**: the turn itself is in the context (any section);
- **cited**: direct, or a fact or an episode in the context cites the turn in its
  ``source_ids`` (the issue's measure);
- **carried**: direct, or a citing fact or episode whose text also holds at least half of
  the turn's content words (:data:`CARRIED_SHARE`). An episode cites every turn of its
  session, so *cited* credits a three-sentence summary with the whole session; *carried*
  credits it only with what it says.

Three memories are compared in the same run: **turns** (only turns were ever written: the
context is the relevant past turns), **extractive** (``end_session`` after every session
with no LLM: facts and episodes made by the rules), and, on one conversation, **llm** (the
same with the local LLM of ``scripts/local_llm.py`` making them). Per mode and budget it
reports recall (share of the evidence reached, averaged over questions), the tokens the
context hands the model (its rendered memory text, the preamble and each section's tags
included, and the recent turns; before 2026-12-04 evening only the items were counted), and
evidence reached per 1,000 of those tokens.

Pure counting here (:func:`reached`, :func:`summarize_context`); the runner is
:func:`measure`, called by ``python -m bench.locomo --context``.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from bench.locomo_data import Conversation, Turn

BUDGETS = (500, 1000, 2000)
CARRIED_SHARE = 0.5
MODES = ("turns", "extractive", "llm")


@dataclass(frozen=True, kw_only=True)
class Source:
    """A fact or episode of the memory: its text and the turns it cites (dialogue ids)."""

    text: str
    cites: frozenset[str]


@dataclass(kw_only=True)
class Measured:
    """One question at one budget in one mode."""

    category: int
    evidence: tuple[str, ...]
    tokens: int
    direct: frozenset[str] = frozenset()
    cited: frozenset[str] = frozenset()
    carried: frozenset[str] = frozenset()
    sections: dict[str, int] = field(default_factory=dict)


def _words(text: str) -> frozenset[str]:
    from tiered_memory.recall.coverage import stems

    return stems(text)


def carries(source_text: str, turn_text: str, share: float = CARRIED_SHARE) -> bool:
    """Does ``source_text`` hold at least ``share`` of ``turn_text``'s content words?"""
    want = _words(turn_text)
    return bool(want) and len(want & _words(source_text)) >= share * len(want)


def reached(item_ids: Iterable[str], dia_of: Mapping[str, str], sources: Mapping[str, Source],
            turn_text: Mapping[str, str], evidence: Sequence[str]) -> tuple[frozenset[str], frozenset[str],
                                                                             frozenset[str]]:
    """(direct, cited, carried) evidence dialogue ids among the context's ``item_ids``:
    turn ids map through ``dia_of``, ``fact:<id>`` / ``ep:<id>`` through ``sources``."""
    want = set(evidence)
    direct: set[str] = set()
    cited: set[str] = set()
    carried: set[str] = set()
    for i in item_ids:
        if i in dia_of:
            if dia_of[i] in want:
                direct.add(dia_of[i])
            continue
        src = sources.get(i)
        if src is None:
            continue
        for d in src.cites & want:
            cited.add(d)
            if carries(src.text, turn_text.get(d, "")):
                carried.add(d)
    return frozenset(direct), frozenset(direct | cited), frozenset(direct | carried)


def summarize_context(rows: Sequence[Measured]) -> dict[str, float]:
    """Mean recall (direct / cited / carried), mean tokens, evidence per 1,000 tokens."""
    if not rows:
        return {"count": 0}

    def share(got: frozenset[str], ev: tuple[str, ...]) -> float:
        return len(got & set(ev)) / len(set(ev)) if ev else 0.0

    tokens = statistics.fmean(r.tokens for r in rows)
    out: dict[str, float] = {"count": len(rows), "tokens": tokens}
    for kind in ("direct", "cited", "carried"):
        out[kind] = statistics.fmean(share(getattr(r, kind), r.evidence) for r in rows)
        found = sum(len(getattr(r, kind)) for r in rows)
        out[f"{kind}_per_1k_tokens"] = 1000 * found / max(1, sum(r.tokens for r in rows))
    return out


# ---- runner (I/O) ---------------------------------------------------------------
def ingest_with_ids(memory: Any, conv: Conversation, *, user_id: str, end_sessions: bool,
                    log: Any = None) -> dict[str, str]:
    """Every session through ``add_many`` (``end_session`` after each when asked); returns
    message id -> dialogue id."""
    from bench.locomo import _role

    by_session: dict[int, list[Turn]] = defaultdict(list)
    for t in conv.turns:
        by_session[t.session].append(t)
    dia_of: dict[str, str] = {}
    for s, turns in sorted(by_session.items()):
        msgs = [{"role": _role(conv, t.speaker), "content": t.text, "timestamp": t.timestamp,
                 "metadata": {"dia_id": t.dia_id, "speaker": t.speaker}} for t in turns]
        ids = memory.add_many(msgs, user_id=user_id, session_id=f"session_{s}")
        dia_of.update(zip(ids, (t.dia_id for t in turns)))
        if end_sessions:
            start = time.perf_counter()
            ep = memory.end_session(f"session_{s}", user_id=user_id)
            if log is not None:
                print(f"    session {s}: episode by {ep.metadata.get('method', 'llm')} in "
                      f"{time.perf_counter() - start:.1f} s", file=log, flush=True)
    return dia_of


def sources_of(memory: Any, user_id: str, dia_of: Mapping[str, str]) -> dict[str, Source]:
    """``fact:<id>`` / ``ep:<id>`` -> what the item says and the dialogue ids it cites."""
    out: dict[str, Source] = {}
    for f in memory.facts(user_id):
        out[f"fact:{f.id}"] = Source(text=f.text, cites=frozenset(dia_of[i] for i in f.source_ids if i in dia_of))
    for e in memory.episodes(user_id):
        out[f"ep:{e.id}"] = Source(text=e.render(), cites=frozenset(dia_of[i] for i in e.source_ids if i in dia_of))
    return out


def measure(conv: Conversation, *, embedder: Any, folder: Path, mode: str, budgets: Sequence[int] = BUDGETS,
            llm: Any = None, log: Any = None, config: Any = None) -> dict[int, list[Measured]]:
    """Ingest ``conv`` into a fresh memory in ``mode`` and build every question's context at
    every budget; returns budget -> one :class:`Measured` per question. ``config``: the
    memory's ``MemoryConfig`` (default: the defaults)."""
    from tiered_memory import MemoryConfig, TieredMemory
    from tiered_memory.config import LLMConfig

    import json

    if config is None:
        config = MemoryConfig(llm=LLMConfig(timeout_s=600, max_tokens=512)) if llm is not None else MemoryConfig()
    user = "u"
    out: dict[int, list[Measured]] = {b: [] for b in budgets}
    done = folder / "ingested.json"  # a kept folder (--context-keep) is measured again without re-ingesting
    with TieredMemory(folder, embedder=embedder, config=config, llm=llm) as memory:
        if done.is_file():
            dia_of = json.loads(done.read_text())
        else:
            dia_of = ingest_with_ids(memory, conv, user_id=user, end_sessions=mode != "turns", log=log)
            done.write_text(json.dumps(dia_of))
        sources = sources_of(memory, user, dia_of)
        text = {t.dia_id: t.text for t in conv.turns}
        for q in conv.questions:
            for b in budgets:
                ctx = memory.build_context(q.question, user_id=user, session_id="question", max_tokens=b)
                items = [i for s in ctx.sections for i in s.items]
                direct, cited, carried = reached((i.id for i in items), dia_of, sources, text, q.evidence)
                # what the model gets: the rendered memory (preamble and section tags too) and recent turns
                tokens = memory.count_tokens(ctx.memory_text()) + sum(i.tokens for i in ctx.recent)
                out[b].append(Measured(category=q.category, evidence=q.evidence, tokens=tokens,
                                       direct=direct, cited=cited, carried=carried,
                                       sections={s.name: len(s.items) for s in ctx.sections}))
    return out


def print_context(results: Mapping[str, Mapping[int, Mapping[str, float]]], title: str, file: Any = None) -> None:
    import sys

    file = file or sys.stdout
    print(f"\n== context recall at a token budget: {title} ==", file=file)
    print(f"{'mode':11s} {'budget':>6s} {'n':>4s} {'tokens':>7s} {'direct':>7s} {'cited':>7s} {'carried':>8s} "
          f"{'cited/1k':>9s} {'carried/1k':>10s}", file=file)
    for mode, per_budget in results.items():
        for b, r in per_budget.items():
            if not r.get("count"):
                continue
            print(f"{mode:11s} {b:6d} {int(r['count']):4d} {r['tokens']:7.0f} {r['direct']:7.3f} {r['cited']:7.3f} "
                  f"{r['carried']:8.3f} {r['cited_per_1k_tokens']:9.3f} {r['carried_per_1k_tokens']:10.3f}",
                  file=file)


def local_llm(log: Any = None) -> tuple[Any, Any]:
    """Start the local LLM server (``scripts/local_llm.py``, as the test plugin does); returns
    (a ``ChatOpenAI`` on it, a function that stops it)."""
    import importlib.util
    import sys

    script = Path(__file__).resolve().parent.parent / "scripts" / "local_llm.py"
    spec = importlib.util.spec_from_file_location("tiered_memory_local_llm", script)
    assert spec and spec.loader
    llm_script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = llm_script
    spec.loader.exec_module(llm_script)
    if not llm_script.is_set_up():
        raise SystemExit(f"the local LLM is not set up in {llm_script.LLM_DIR}: run `make llm`")
    port = llm_script.free_port()
    proc = llm_script.start_server(port)
    url = f"http://127.0.0.1:{port}"
    llm_script.wait_ready(url, 180, proc=proc)
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=url + "/v1", api_key="not-needed", model="qwen", temperature=0,
                       extra_body={"max_tokens": 512}, timeout=600, max_retries=0)
    return model, lambda: llm_script.stop_server(proc)


def first_sessions(conv: Conversation, n: int | None) -> Conversation:
    """``conv`` cut to its first ``n`` sessions, with the questions all of whose evidence lies
    in them (the whole conversation for ``None``)."""
    if n is None:
        return conv
    from dataclasses import replace

    turns = [t for t in conv.turns if t.session <= n]
    known = {t.dia_id for t in turns}
    return replace(conv, turns=turns, questions=[q for q in conv.questions if set(q.evidence) <= known])


def run_context(convs: Sequence[Conversation], *, embedder: Any, folder: Path, llm_conversation: str | None,
                budgets: Sequence[int] = BUDGETS, llm_sessions: int | None = None) -> dict[str, Any]:
    """turns and extractive on every conversation of ``convs``; llm on ``llm_conversation``
    (with turns and extractive on it alone too, for a same-conversation comparison)."""
    results: dict[str, Any] = {}

    def block(chosen: Sequence[Conversation], modes: Sequence[str], llm: Any = None) -> dict[str, Any]:
        rows: dict[str, dict[int, list[Measured]]] = {m: {b: [] for b in budgets} for m in modes}
        for c in chosen:
            for mode in modes:
                start = time.perf_counter()
                got = measure(c, embedder=embedder, folder=folder / f"{mode}-{c.id}", mode=mode, budgets=budgets,
                              llm=llm if mode == "llm" else None, log=None if mode != "llm" else __import__("sys").stdout)
                for b in budgets:
                    rows[mode][b] += got[b]
                print(f"  context {mode} {c.id}: {time.perf_counter() - start:.0f} s", flush=True)
        return {m: {b: summarize_context(rows[m][b]) for b in budgets} for m in modes}

    results["all"] = block(convs, ("turns", "extractive"))
    print_context(results["all"], ", ".join(c.id for c in convs))
    if llm_conversation:
        chosen = [first_sessions(c, llm_sessions) for c in convs if c.id == llm_conversation]
        if not chosen:
            raise SystemExit(f"--context-llm {llm_conversation}: not among the selected conversations")
        folder = folder / f"first-{llm_sessions}" if llm_sessions else folder
        kept = [m for m in ("llm",) if (folder / f"{m}-{llm_conversation}" / "ingested.json").is_file()]
        model, stop = (None, lambda: None) if kept else local_llm()
        try:
            results["llm"] = block(chosen, ("turns", "extractive", "llm"), llm=model)
        finally:
            stop()
        print_context(results["llm"], f"{llm_conversation}" + (f" (first {llm_sessions} sessions, "
                      f"{len(chosen[0].questions)} questions)" if llm_sessions else "")
                      + ", facts and episodes by the local LLM")
    return results
