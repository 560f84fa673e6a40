"""The CLI commands that look inside each tier: ``sessions``, ``facts``, ``episodes``,
``working`` and ``context``. Each prints readable text, or JSON with ``--json``.

Every command reads through the public :class:`~tiered_memory.TieredMemory` API only, or
the same reads of a :class:`~tiered_memory.readonly.ReadOnlyMemory` (a folder another
process holds). ``context`` is exactly :meth:`~tiered_memory.TieredMemory.build_context`,
so, like it, it counts the facts and episodes it returns as accessed (and it needs the
vector index: never read-only).

Stored text is printed on the line of its item (:func:`one_line`): a line break in a note, a
fact or a turn is written as JSON's ``\\n``, so it cannot start a line that reads as another
item of the listing (the CLI's output escapes what a terminal acts on, :func:`.cli.terminal_safe`).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, Callable

from .config import WorkingConfig
from .context.render import MemoryContext
from .records import Fact, FactChange
from .tokens import TokenCount

Out = Callable[[str], None]

#: ``working --help``: its scores are the config's, the default one unless --config names the application's
WORKING_DESCRIPTION = (
    "A session's working memory: its items best first, with their scores, and its scratchpad. Items are "
    "ranked and scored with the WorkingConfig of --config FILE, else the default (WorkingConfig.decay_per_hour, "
    f"{WorkingConfig().decay_per_hour}): an application that set another decay rate ranks and scores the "
    "same items otherwise unless its config is given as --config (which items a session holds is the same).")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register the inspection subcommands on the CLI's subparsers."""
    s = sub.add_parser("sessions", parents=[common], help="a user's sessions: messages, first and last time")
    s.add_argument("--user", required=True, help="user id")
    s.add_argument("--json", action="store_true", help="print JSON lines")

    f = sub.add_parser("facts", parents=[common], help="a user's facts, invalidated ones too, with their history")
    f.add_argument("--user", required=True, help="user id")
    f.add_argument("--type", default=None, help="only facts of this type (preference, fact, constraint, ...)")
    f.add_argument("--valid", action="store_true", help="only facts still valid")
    f.add_argument("--json", action="store_true", help="print JSON lines")

    e = sub.add_parser("episodes", parents=[common], help="a user's episodes (compressed sessions)")
    e.add_argument("--user", required=True, help="user id")
    e.add_argument("--session", default=None, help="only this session")
    e.add_argument("--json", action="store_true", help="print JSON lines")

    w = sub.add_parser("working", parents=[common],
                       help="a session's working memory: items by decayed importance, and the scratchpad",
                       description=WORKING_DESCRIPTION)
    w.add_argument("--user", required=True, help="user id")
    w.add_argument("--session", required=True, help="session id")
    w.add_argument("--query", default=None, help="rank items by relevance to this text too")
    w.add_argument("--json", action="store_true", help="print JSON")

    c = sub.add_parser("context", parents=[common],
                       help="what build_context would hand a model for a query: sections, recent turns, "
                            "what was dropped and why")
    c.add_argument("query", help="the message the model is about to answer, which the memory is recalled for")
    c.add_argument("--user", required=True, help="user id")
    c.add_argument("--session", required=True, help="the current session id")
    c.add_argument("--max-tokens", type=int, default=None, help="token budget (default: BudgetConfig.max_tokens)")
    c.add_argument("--json", action="store_true", help="print JSON")


def when(ts: float | None) -> str:
    """A UTC date and time for a timestamp, or "-" (pure)."""
    if ts is None:
        return "-"
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return str(ts)


def one_line(text: str) -> str:
    """Stored ``text`` as one printed line: its line breaks written as ``\\n``, JSON's escape (pure)."""
    return text.replace("\n", "\\n")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def fact_lines(fact: Fact, history: list[FactChange]) -> list[str]:
    """A fact and its history as text lines (pure)."""
    state = "valid" if fact.valid else f"invalid since {when(fact.invalid_at)}"
    if fact.superseded_by:
        state += f", superseded by {fact.superseded_by}"
    lines = [one_line(fact.text), f"   {fact.type}, confidence {fact.confidence:.2f}, {state}; id={fact.id}"]
    for change in history:
        if change.new_text is None or change.old_text is None or change.old_text == change.new_text:
            what = repr(change.new_text if change.new_text is not None else change.old_text or "")
        else:
            what = f"{change.old_text!r} -> {change.new_text!r}"
        reason = change.details.get("reason")
        lines.append(f"   {when(change.at)}  {change.action:<10} {what}{f'  ({reason})' if reason else ''}".rstrip())
    return lines


def context_lines(ctx: MemoryContext, width: int | None = None, group_dropped: bool = False) -> list[str]:
    """Each section with its items, the recent turns, then what was dropped and why (pure);
    item texts are shortened to ``width`` characters if given; ``group_dropped`` counts the
    dropped items per section and reason instead of listing each."""

    def text(value: str) -> str:
        return textwrap.shorten(" ".join(value.split()), width=width, placeholder=" ...") if width else one_line(value)

    lines = [f"{ctx.tokens} of {ctx.max_tokens} tokens"]
    for s in ctx.sections:
        lines.append(f"[{s.name}] {s.title}: {len(s.items)} items, {s.tokens} tokens")
        lines += [f"   {i.tokens:>4} tok  {text(i.text)}" for i in s.items]
    lines.append(f"[recent] the session's buffer: {len(ctx.recent)} turns, "
                 f"{sum(i.tokens for i in ctx.recent)} tokens")
    lines += [f"   {i.tokens:>4} tok  {text(f'{i.role}: {i.text}')}" for i in ctx.recent]
    if ctx.dropped and group_dropped:
        lines.append(f"dropped {plural(len(ctx.dropped), 'item')} (items are kept whole or not at all):")
        groups: dict[tuple[str, str], list[TokenCount]] = {}
        for d in ctx.dropped:
            groups.setdefault((d.section, d.reason), []).append(d.tokens)
        lines += [f"   {section:<9} {plural(len(t), 'item')}, {sum(t)} tokens: {reason}"
                  for (section, reason), t in groups.items()]
    elif ctx.dropped:
        lines.append(f"dropped {plural(len(ctx.dropped), 'item')} (items are kept whole or not at all):")
        lines += [f"   {d.section:<9} {d.tokens:>4} tok  {d.reason}  id={d.id}" for d in ctx.dropped]
    else:
        lines.append("dropped nothing")
    return lines


def history_by_fact(changes: list[FactChange]) -> dict[str, list[FactChange]]:
    """The fact history grouped by fact id, oldest first (pure)."""
    grouped: dict[str, list[FactChange]] = {}
    for change in changes:
        grouped.setdefault(change.fact_id, []).append(change)
    return grouped


def as_text(out: Out, args: argparse.Namespace, rows: list[dict[str, Any]], empty: str) -> bool:
    """Print ``rows`` as JSON lines with ``--json``, or ``empty`` when there are none;
    True when the caller should print the rows as text."""
    if args.json:
        for row in rows:
            out(_dumps(row))
        return False
    if not rows:
        out(empty)
    return bool(rows)


def cmd_sessions(memory: Any, args: argparse.Namespace, out: Out) -> None:
    found = memory.sessions(args.user)
    if not as_text(out, args, [asdict(s) for s in found], f"no sessions for user {args.user!r}"):
        return
    for s in found:
        out(f"{s.session_id}  {plural(s.messages, 'message')}  {when(s.first)} .. {when(s.last)}")


def cmd_facts(memory: Any, args: argparse.Namespace, out: Out) -> None:
    facts = memory.facts(args.user, type=args.type, include_invalid=not args.valid)
    by_fact = history_by_fact(memory.fact_history(args.user))
    rows = [{**asdict(f), "valid": f.valid, "history": [asdict(c) for c in by_fact.get(f.id, [])]} for f in facts]
    if not as_text(out, args, rows, f"no facts for user {args.user!r}"):
        return
    for n, f in enumerate(facts, 1):
        first, *rest = fact_lines(f, by_fact.get(f.id, []))
        out(f"{n}. {first}")
        for line in rest:
            out(line)


def cmd_episodes(memory: Any, args: argparse.Namespace, out: Out) -> None:
    found = memory.episodes(args.user, session_id=args.session)
    if not as_text(out, args, [asdict(e) for e in found],
                   f"no episodes for user {args.user!r} (end_session or consolidate makes them)"):
        return
    for e in found:
        out(f"{e.session_id}  {plural(e.turn_count, 'turn')}  {when(e.start)} .. {when(e.end)}  "
            f"({e.metadata.get('method', '?')}); id={e.id}")
        out(f"   {one_line(e.summary)}")
        for label, values in (("entities", e.entities), ("decisions", e.decisions),
                              ("open questions", e.open_questions), ("key facts", e.key_facts)):
            if values:
                out(f"   {label}: " + one_line("; ".join(values)))


def cmd_working(memory: Any, args: argparse.Namespace, out: Out) -> None:
    wm = memory.working_memory(args.session, user_id=args.user)  # None: a read-only store with no layers yet
    items = wm.items(args.query) if wm is not None else []
    pad = wm.scratchpad.to_dict() if wm is not None else {}
    if args.json:
        out(_dumps({"items": [asdict(i) for i in items], "scratchpad": pad}))
        return
    if not items:
        out(f"no working-memory items in session {args.session!r} of user {args.user!r}")
    for i in items:
        out(f"{i.score or 0.0:.3f}  [{i.type}] {one_line(i.text)}")
        out(f"       importance {i.importance:.2f} at {when(i.created_at)}; id={i.id}")
    out("scratchpad: " + (_dumps(pad) if pad else "empty"))


def cmd_context(memory: Any, args: argparse.Namespace, out: Out) -> None:
    ctx = memory.build_context(args.query, user_id=args.user, session_id=args.session,
                               max_tokens=args.max_tokens)
    if args.json:
        out(_dumps({**asdict(ctx), "tokens": ctx.tokens, "messages": ctx.to_messages()}))
        return
    for line in context_lines(ctx):
        out(line)


COMMANDS: dict[str, Callable[[Any, argparse.Namespace, Out], None]] = {
    "sessions": cmd_sessions,
    "facts": cmd_facts,
    "episodes": cmd_episodes,
    "working": cmd_working,
    "context": cmd_context,
}
