"""The demo behind ``tiered-memory demo`` and ``make demo``: the story of the tiers.

Two users of the bundled sample talk over several sessions, in a temporary folder,
offline, with the bundled model and no LLM (rules do the extraction). The demo shows
the buffer evicting whole turns, recall with the reasons a turn was found,
``end_session`` making an episode, facts added, updated and invalidated with their
history, working memory decaying, ``build_context`` under a tight budget with what it
dropped and why, ``consolidate``'s report, isolation between the users, and a restart
that keeps everything. It uses the public API only, and checks what it claims: the
exit code is 1 if a claim does not hold.
"""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import time
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Callable, Iterator, TextIO

from . import (BufferConfig, ConsolidationConfig, Embedder, MemoryConfig, MemoryHit, StoredMessage,
               TieredMemory)
from .cli_inspect import context_lines, fact_lines, history_by_fact, plural, when

SAMPLE = "sample_conversation.json"
CONTEXT_BUDGET = 260
HOUR = 3600.0
Out = Callable[[str], None]
# demo settings, so a small sample shows each mechanism (defaults: 20 messages, 30 days)
DEMO_CONFIG = MemoryConfig(buffer=BufferConfig(max_messages=4),
                           consolidation=ConsolidationConfig(compress_after_days=14))


def load_sample() -> dict[str, Any]:
    """The bundled sample (two users, a few sessions each, and demo questions)."""
    text = resources.files("tiered_memory").joinpath("data", SAMPLE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def sample_sessions(sample: dict[str, Any], shift: float = 0.0) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    """``(user_id, session_id, messages)`` with timestamps one minute apart, moved by ``shift``
    seconds (pure)."""
    for user in sample["users"]:
        for session in user["sessions"]:
            start = datetime.fromisoformat(session["started"].replace("Z", "+00:00"))
            messages = [
                {"role": m["role"], "content": m["content"],
                 "timestamp": (start + timedelta(minutes=n)).timestamp() + shift}
                for n, m in enumerate(session["messages"])
            ]
            yield user["user_id"], session["session_id"], messages


def shift_to(sample: dict[str, Any], now: float, days_before: float = 1.0) -> float:
    """The shift that makes the sample's last session start ``days_before`` days before ``now`` (pure)."""
    last = max(datetime.fromisoformat(s["started"].replace("Z", "+00:00")).timestamp()
               for u in sample["users"] for s in u["sessions"])
    return now - days_before * 86400 - last


def load_into(memory: TieredMemory, sample: dict[str, Any], shift: float = 0.0) -> int:
    """Store every sample session; returns how many messages were stored."""
    n = 0
    for user_id, session_id, messages in sample_sessions(sample, shift):
        n += len(memory.add_many(messages, session_id=session_id, user_id=user_id))
    return n


def shorten(text: str, width: int = 88) -> str:
    return textwrap.shorten(" ".join(text.split()), width=width, placeholder=" ...")


def describe_hit(hit: MemoryHit) -> str:
    """Why a turn was found, from its explanation: ``meaning: cosine 0.59 (rank 1); words: BM25 5.2
    (rank 1); session +0.08`` (whatever signals it carries)."""
    signals = hit.explanation.get("signals", {}) if isinstance(hit.explanation, dict) else {}
    parts = []
    for name, s in signals.items():
        if not isinstance(s, dict) or not isinstance(s.get("value"), (int, float)):
            continue
        rank = f" (rank {int(s['rank'])})" if s.get("rank") else ""
        if name == "vector":
            parts.append(f"meaning: cosine {s['value']:.2f}{rank}")
        elif name == "keyword":
            parts.append(f"words: BM25 {s['value']:.1f}{rank}")
        elif isinstance(s.get("contribution"), (int, float)) and s["contribution"] > 0.005:
            parts.append(f"{name} +{s['contribution']:.2f}")
    return "; ".join(parts) or "recency only"


def rich_console(stream: TextIO) -> Any:
    """A ``rich`` console for ``stream`` when it is a terminal and rich is installed (it comes
    with chromadb); ``None`` otherwise, and the demo prints plain text."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb" or not stream.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(file=stream, highlight=False, soft_wrap=True)


class Story:
    """Writes numbered chapters (plain lines through ``out``, or styled on a rich console)
    and keeps the checks the demo makes."""

    def __init__(self, out: Out, console: Any = None) -> None:
        self.out, self.console, self.chapter = out, console, 0
        self.failed: list[str] = []

    def _line(self, text: str, style: str = "") -> None:
        if self.console is None:
            self.out(text)
        else:
            from rich.text import Text

            self.console.print(Text(text, style=style))

    def title(self, text: str) -> None:
        self.chapter += 1
        self._line("")
        self._line(f"{self.chapter}. {text}", "bold cyan")
        self._line("-" * (len(text) + 3), "cyan")

    def say(self, text: str, indent: int = 0) -> None:
        style = "dim" if text.startswith("why:") else "yellow" if text.startswith("dropped") else ""
        self._line(" " * indent + text, style)

    def check(self, ok: bool, claim: str) -> None:
        if not ok:
            self.failed.append(claim)
            self._line(f"   !! not as expected: {claim}", "bold red")


def _turns(messages: list[StoredMessage]) -> list[str]:
    return [f"{m.role}: {shorten(m.content, 70)}" for m in messages]


def chapter_buffer(memory: TieredMemory, s: Story) -> None:
    s.title("The buffer keeps the newest whole turns")
    sid = "maria-2026-03-02"
    every = memory.get_messages(sid, user_id="maria")
    kept = memory.get_buffer(sid, user_id="maria")
    evicted = every[:len(every) - len(kept)]
    s.say(f"Maria's first session has {len(every)} messages; the buffer holds at most "
          f"{memory.config.buffer.max_messages} (demo setting) within {memory.config.buffer.max_tokens} tokens.")
    s.say("kept (what the model sees verbatim):")
    for line in _turns(kept):
        s.say(line, 3)
    s.say("evicted, a whole turn (user message and reply together), still stored and searchable:")
    for line in _turns(evicted):
        s.say(line, 3)
    s.check(bool(kept) and kept[0].role == "user" and len(kept) <= 4 and evicted[-1].role == "assistant",
            "the buffer starts at a user turn and evicts whole turns")


def chapter_recall(memory: TieredMemory, s: Story, questions: list[dict[str, Any]]) -> None:
    s.title("Recall, with the reasons each turn was found")
    for q in questions[1:3]:
        t = time.perf_counter()
        hits = memory.search(q["query"], user_id=q["user_id"], k=3)
        s.say(f"[{q['user_id']}] {q['query']}  ({(time.perf_counter() - t) * 1000:.0f} ms)")
        for rank, h in enumerate(hits, 1):
            s.say(f"{rank}. {h.score:.2f}  {h.role}: {shorten(h.text, 72)}", 3)
            s.say(f"why: {describe_hit(h)}", 9)
        s.check(bool(hits) and all(h.explanation.get("signals") for h in hits), "every hit carries its reasons")


def chapter_episodes(memory: TieredMemory, s: Story) -> None:
    s.title("end_session turns a session into an episode, and its facts into semantic memory")
    ended = 0
    for user in ("maria", "sam"):
        for info in memory.sessions(user)[:-1] if user == "sam" else memory.sessions(user):
            memory.end_session(info.session_id, user_id=user)
            ended += 1
    ep = memory.episodes("maria", session_id="maria-2026-03-02")[0]
    s.say(f"ended {ended} sessions (Sam's last one is left for consolidate). Maria's first episode:")
    s.say(f"summary:   {shorten(ep.summary, 100)}", 3)
    s.say(f"entities:  {', '.join(ep.entities)}", 3)
    s.say(f"key facts: {'; '.join(ep.key_facts) or '-'}", 3)
    s.say(f"covers {ep.turn_count} turns, {when(ep.start)} .. {when(ep.end)}; made by: "
          f"{ep.metadata.get('method')} ({ep.metadata.get('reason', '')}; pass llm= to use a model)", 3)
    s.check(ep.turn_count == 3 and "Lisbon" in ep.entities, "the episode covers the session's turns")


def chapter_facts(memory: TieredMemory, s: Story, now: float) -> None:
    s.title("Facts: added, updated and invalidated; the history keeps every change")
    moved = "Big news: I moved to Porto last week. The flat is near the river."
    s.say(f"Maria, in a new session: {moved!r}; end_session extracts the facts,")
    memory.add_many([
        {"role": "user", "content": moved,
         "timestamp": now - 2 * HOUR},
        {"role": "assistant", "content": "Congratulations! Porto is lovely. How is Biscuit taking it?",
         "timestamp": now - 2 * HOUR + 60},
    ], session_id="maria-porto", user_id="maria")
    memory.end_session("maria-porto", user_id="maria")
    piano = next((f for f in memory.facts("maria") if "piano" in f.text.lower()), None)
    if piano is None:
        piano = memory.add_fact("User is learning the piano", user_id="maria", type="fact")
    memory.update_fact(piano.id, user_id="maria", text="User is learning the piano and wants a Yamaha",
                       confidence=0.9)
    memory.add_fact("User has a severe peanut allergy and carries an EpiPen", user_id="maria",
                    type="constraint")
    s.say("then the application edits one (update_fact) and adds one (add_fact). Maria's facts:")
    history = history_by_fact(memory.fact_history("maria"))
    facts = memory.facts("maria", include_invalid=True)
    for f in facts:
        first, *rest = fact_lines(f, history.get(f.id, []))
        s.say("- " + first, 1)
        for line in rest:
            s.say(shorten(line, 104), 3)
    lisbon = [f for f in facts if "Lisbon" in f.text]
    s.check(bool(lisbon) and not lisbon[0].valid and any(f.valid and "Porto" in f.text for f in facts),
            "'lives in Porto' invalidates 'lives in Lisbon'")
    s.check(any(c.action != "add" for c in history.get(piano.id, [])), "the edit is in the history")


def chapter_working(memory: TieredMemory, s: Story, now: float) -> None:
    s.title("Working memory: what matters now in this session, decaying with age")
    wm = memory.working_memory("maria-now", user_id="maria")
    wm.remember("Goal: book a peanut-free restaurant for Friday", importance=0.9, type="goal", now=now - 1 * HOUR)
    wm.remember("She wants a table by the window", importance=0.5, type="note", now=now - 5 * HOUR)
    wm.remember("Asked about tram times earlier", importance=0.3, type="note", now=now - 96 * HOUR)
    wm.scratchpad["step"] = "choosing a restaurant"
    rate = memory.config.working.decay_per_hour
    s.say(f"importance x (1 - {rate})^hours; the same items seen now, in a day and in three days:")
    s.say(f"{'item':<50} {'set':>5} {'now':>6} {'+1 day':>7} {'+3 days':>8}", 3)
    later = {h: {i.id: i.score for i in wm.items(now=now + h * HOUR)} for h in (24, 72)}
    items = wm.items(now=now)
    for i in items:
        s.say(f"{shorten(i.text, 50):<50} {i.importance:>5.2f} {i.score or 0:>6.3f} "
              f"{later[24][i.id] or 0:>7.3f} {later[72][i.id] or 0:>8.3f}", 3)
    s.say("the four-day-old note has faded below ConsolidationConfig.prune_below: consolidate prunes it", 3)
    s.say(f"scratchpad (agent state for the session, no decay): {wm.scratchpad.to_dict()}", 3)
    s.check([i.type for i in items][0] == "goal" and all(
        (later[72][i.id] or 0) < (i.score or 0) for i in items), "items decay and the goal ranks first")


def chapter_context(memory: TieredMemory, s: Story, now: float, query: str) -> None:
    s.title(f"build_context within {CONTEXT_BUDGET} tokens: each section, and what was dropped and why")
    memory.add_many([{"role": "user", "content": "Can you book somewhere for Friday night?", "timestamp": now - 60},
                     {"role": "assistant", "content": "Sure. Any constraints I should know about?",
                      "timestamp": now - 30}], session_id="maria-now", user_id="maria")
    ctx = memory.build_context(query, user_id="maria", session_id="maria-now", max_tokens=CONTEXT_BUDGET)
    s.say(f"[maria] {query}")
    for line in context_lines(ctx, width=84, group_dropped=True):
        s.say(line, 3)
    s.say("to_messages() hands this to a model as one system message of quoted memory, then the recent turns.", 3)
    s.check(ctx.tokens <= CONTEXT_BUDGET and bool(ctx.dropped) and any("peanut" in i.text.lower() for x in
            ctx.sections for i in x.items), "the context fits, keeps the allergy and reports what it dropped")


def chapter_consolidate(memory: TieredMemory, s: Story) -> None:
    s.title("consolidate: compress idle sessions, merge, promote, archive old turns, prune")
    before = memory.stats().messages
    for user in ("maria", "sam"):
        r = memory.consolidate(user)
        days = memory.config.consolidation.compress_after_days
        s.say(f"{user}: {plural(r.sessions, 'idle session')} compressed, {plural(r.merged, 'fact')} merged, "
              f"{plural(r.promoted, 'episode')} promoted, {plural(r.compressed, 'episode')} older than {days:g} "
              f"days archived {plural(r.archived_messages, 'raw message')}, {plural(r.pruned, 'stale item')} "
              "pruned", 3)
        if user == "sam":
            s.check(r.sessions == 1, "Sam's last session, idle, is compressed")
        else:
            s.check(r.pruned >= 1, "the four-day-old working-memory note is pruned")
    again = memory.consolidate("maria")
    idle = (again.sessions, again.merged, again.promoted, again.compressed, again.archived_messages, again.pruned)
    s.say(f"messages in the hot indexes: {before} -> {memory.stats().messages}; the episodes and facts stand "
          f"for the archived turns. Run again, it changes {'nothing' if not any(idle) else idle} (idempotent).", 3)
    s.check(not any(idle), "a second consolidate changes nothing")


def chapter_isolation(memory: TieredMemory, s: Story) -> None:
    s.title("Isolation: every read is scoped to one user")
    maria_words = ("Biscuit", "Lisbon", "Porto", "peanut")
    hits = memory.search("Biscuit the beagle in Lisbon", user_id="sam", k=10)
    facts = memory.facts("sam", include_invalid=True)
    ctx = memory.build_context("where does my dog live?", user_id="sam", session_id="sam-now", max_tokens=400)
    seen = [t for t in [h.text for h in hits] + [f.text for f in facts] + [ctx.to_text()]
            if any(w in t for w in maria_words)]
    s.say(f"Sam's search for 'Biscuit the beagle in Lisbon' returns {len(hits)} of his own turns, none of Maria's;")
    s.say(f"his {len(facts)} facts and his context name none of {', '.join(maria_words)}: {len(seen)} leaks.")
    s.check(not seen, "no memory of Maria reaches Sam")


def snapshot(memory: TieredMemory, query: dict[str, Any]) -> dict[str, Any]:
    """What a restart must keep."""
    out: dict[str, Any] = {"messages": memory.stats().messages}
    for user in ("maria", "sam"):
        out[user] = {"sessions": [x.session_id for x in memory.sessions(user)],
                     "facts": sorted((f.id, f.valid) for f in memory.facts(user, include_invalid=True)),
                     "episodes": [e.id for e in memory.episodes(user)],
                     "history": len(memory.fact_history(user))}
    out["working"] = [i.id for i in memory.working_memory("maria-now", user_id="maria").items()]
    out["top"] = [h.id for h in memory.search(query["query"], user_id=query["user_id"], k=3)]
    return out


def run(out: Out = print, *, embedder: Embedder | None = None, console: Any = None) -> int:
    """Run the demo, writing lines with ``out`` (or styled on a ``rich`` ``console``, see
    :func:`rich_console`); returns a process exit code (1 if a check failed)."""
    started = time.perf_counter()
    sample = load_sample()
    questions = sample["questions"]
    now = time.time()
    s = Story(out, console)
    with tempfile.TemporaryDirectory(prefix="tiered-memory-demo-") as tmp:
        path = os.path.join(tmp, "memory")
        s.say(f"tiered-memory demo: a temporary store in {path}")
        s.say("(SQLite + Chroma + the static embedder distilled from all-MiniLM-L6-v2; offline, no API key, "
              "no torch, no LLM: rules extract)")
        memory = TieredMemory(path, embedder=embedder, config=DEMO_CONFIG)
        try:
            s.title("Two users, several sessions")
            stored = load_into(memory, sample, shift_to(sample, now))
            for user in ("maria", "sam"):
                found = memory.sessions(user)
                s.say(f"{user}: {len(found)} sessions, {sum(x.messages for x in found)} messages, "
                      f"{when(found[0].first)} .. {when(found[-1].last)}", 3)
            s.say(f"{stored} messages stored and indexed in {time.perf_counter() - started:.1f} s "
                  "(model load included); the sample's dates are moved so its last session was yesterday", 3)
            chapter_buffer(memory, s)
            chapter_recall(memory, s, questions)
            chapter_episodes(memory, s)
            chapter_facts(memory, s, now)
            chapter_working(memory, s, now)
            chapter_context(memory, s, now, questions[0]["query"])
            chapter_consolidate(memory, s)
            chapter_isolation(memory, s)
            before = snapshot(memory, questions[1])
        finally:
            memory.close()
        s.title("Restart: close, reopen the folder, everything is still there")
        with TieredMemory(path, embedder=embedder, config=DEMO_CONFIG) as reopened:
            after = snapshot(reopened, questions[1])
        kept = [k for k in ("messages", "maria", "sam", "working", "top") if before[k] == after[k]]
        lost = [k for k in ("messages", "maria", "sam", "working", "top") if k not in kept]
        s.say(f"after reopening: the same {after['messages']} messages, sessions, facts and their validity, "
              "episodes, fact history, working memory and top answers"
              + (f"; differs: {', '.join(lost)}" if lost else ""))
        s.check(len(kept) == 5, "a restart keeps everything")
    s.say("")
    s.say(f"Done in {time.perf_counter() - started:.1f} s; the temporary store was deleted. "
          "Look inside your own store with: tiered-memory --path FOLDER facts|episodes|sessions|working|context ...")
    if s.failed:
        s.say(f"{len(s.failed)} claims did not hold: " + "; ".join(s.failed))
    return 1 if s.failed else 0
