"""The ``tiered-memory`` command line.

Examples::

    tiered-memory demo
    tiered-memory --path ./mem import chats.jsonl
    tiered-memory --path ./mem search "where do I live?" --user u1
    tiered-memory --path ./mem stats
    tiered-memory --path ./mem export dump.jsonl --user u1
    tiered-memory --path ./mem forget-user u1 --yes
    tiered-memory --path ./mem rebuild-index
    tiered-memory --path ./mem consolidate --user u1
    tiered-memory --path ./mem sessions --user u1
    tiered-memory --path ./mem facts --user u1            # with their history
    tiered-memory --path ./mem episodes --user u1
    tiered-memory --path ./mem working --user u1 --session s1
    tiered-memory --path ./mem context "where do I live?" --user u1 --session s1 --max-tokens 300
    tiered-memory --path ./mem --config app.toml search "where do I live?" --user u1
    tiered-memory config --defaults > app.toml     # the MemoryConfig defaults, as a file --config reads

While an application holds the folder, the read commands read its records read-only
(:mod:`.cli_open`); the others get ``StoreLockedError``.

The commands that look inside each tier are in :mod:`.cli_inspect`, ``export`` and ``import``
in :mod:`.cli_portable`. Every command opens the memory with the default MemoryConfig, or the
one ``--config FILE`` describes (:mod:`.cli_config`): the application's, so that search,
context, working and consolidate see what it sees.

Exit codes: 0 success, 1 runtime failure (store, index, model), 2 usage error
(bad arguments, bad input file, no memory at ``--path``), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from typing import Any, Callable, Sequence, TextIO

from .cli_open import (EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliUsageError, embedder_hint,
                       keyword_only_label, open_memory as _open)
from .cli_portable import COMMANDS as PORTABLE, add_parsers as add_portable_parsers
from .errors import EmbedderRequiredError, TieredMemoryError, UsageError


EMBEDDER_HELP = ("the application's own embedder, for a memory whose vectors it made: FACTORY() of MODULE "
                 "(imported from the current folder or PYTHONPATH); reads of rows need none")
CONFIG_HELP = ("the application's MemoryConfig, as a TOML file ([retrieval], [budget], [working], ... by field "
               "name; a .json file as JSON): what it sets replaces the defaults every command opens the "
               "memory with ('tiered-memory config --defaults' writes them out)")


def _parser() -> argparse.ArgumentParser:
    from .memory import default_path

    # --path is accepted before or after the subcommand
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--path", default=argparse.SUPPRESS,
                        help="memory folder (default: $TIERED_MEMORY_HOME or ~/.tiered-memory)")
    common.add_argument("--embedder", default=argparse.SUPPRESS, metavar="MODULE:FACTORY", help=EMBEDDER_HELP)
    common.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE", help=CONFIG_HELP)
    p = argparse.ArgumentParser(
        prog="tiered-memory",
        description="Long-term memory for LLM agents: inspect and manage a memory folder.",
    )
    p.add_argument("--path", default=None,
                   help=f"memory folder (default: $TIERED_MEMORY_HOME or {default_path()})")
    p.add_argument("--embedder", default=None, metavar="MODULE:FACTORY", help=EMBEDDER_HELP)
    p.add_argument("--config", default=None, metavar="FILE", help=CONFIG_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser("demo", parents=[common],
                       help="the story of the tiers on a bundled sample, in a temporary folder, offline")
    d.add_argument("--plain", action="store_true", help="plain text, even on a terminal where rich is installed")

    s = sub.add_parser("search", parents=[common], help="hybrid search of one user's memories")
    s.add_argument("query", help="what to look for, in words (\"where does Ana live?\")")
    s.add_argument("--user", required=True, help="user id")
    s.add_argument("--session", default=None, help="only this session")
    s.add_argument("-k", type=int, default=5, help="number of results (default 5)")
    s.add_argument("--sessions", action="store_true",
                   help="rank the user's sessions (by their best turn) instead of turns")
    s.add_argument("--json", action="store_true", help="print JSON lines")

    st = sub.add_parser("stats", parents=[common], help="counts of users, sessions, messages, vectors")
    st.add_argument("--json", action="store_true", help="print JSON")

    add_portable_parsers(sub, common)

    f = sub.add_parser("forget-user", parents=[common], help="delete every trace of a user")
    f.add_argument("user", help="user id")
    f.add_argument("--yes", action="store_true", help="confirm the deletion")

    sub.add_parser("rebuild-index", parents=[common],
                   help="drop the vector index and rebuild it from the record store")

    c = sub.add_parser("consolidate", parents=[common],
                       help="merge duplicate facts, promote, archive old turns, prune (idempotent)")
    c.add_argument("--user", required=True, help="user id")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--dry-run", action="store_true", help="report what a run would do, and change nothing")

    cf = sub.add_parser("config", parents=[common],
                        help="the MemoryConfig the commands open the memory with (--config FILE's, else the "
                             "defaults), as a TOML file --config reads")
    cf.add_argument("--defaults", action="store_true", help="the defaults, whatever --config says")
    cf.add_argument("--json", action="store_true", help="as JSON (a .json file --config reads)")

    from .cli_inspect import add_parsers

    add_parsers(sub, common)
    return p


def _cmd_demo(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    from .demo import rich_console, run

    if args.path:
        out(f"(the demo always uses a temporary folder; --path {args.path} is left alone)")
    if args.config:
        out(f"(the demo always uses the default config; --config {args.config} is left alone)")
    return run(out, console=None if args.plain else rich_console(args.stream))


def _search_sessions(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    if args.session is not None:
        raise CliUsageError("--sessions ranks all of the user's sessions; leave out --session")
    with _open(args, err) as memory:
        found = memory.search_sessions(args.query, user_id=args.user, k=args.k, turns=1)
        keyword_only_label(memory, args, out)
    if args.json:
        for f in found:
            vectors = {"vectors": f.hits[0].explanation["vectors"]} if "vectors" in f.hits[0].explanation else {}
            out(json.dumps({"session_id": f.session_id, "score": f.score,
                            "best": {"id": f.hits[0].id, "role": f.hits[0].role, "text": f.hits[0].text}, **vectors},
                           ensure_ascii=False))
        return EXIT_OK
    if not found:
        out(f"no sessions found for user {args.user!r}")
    from .demo import shorten

    for rank, f in enumerate(found, 1):
        best = f.hits[0]
        out(f"{rank}. {f.score:.4f}  [{f.session_id}] best turn: {best.role}: {shorten(best.text, 90)}")
    return EXIT_OK


def _cmd_search(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    if args.k < 1:
        raise CliUsageError(f"-k must be at least 1, got {args.k}")
    if args.sessions:
        return _search_sessions(args, out, err)
    with _open(args, err) as memory:
        hits = memory.search(args.query, user_id=args.user, k=args.k, session_id=args.session)
        keyword_only_label(memory, args, out)
    if args.json:
        for h in hits:
            out(json.dumps({"id": h.id, "score": h.score, "layer": h.layer, "role": h.role,
                            "session_id": h.session_id, "timestamp": h.timestamp, "text": h.text,
                            "metadata": h.metadata, "explanation": h.explanation},
                           ensure_ascii=False, default=str))
        return EXIT_OK
    if not hits:
        out(f"no memories found for user {args.user!r}")
    from .demo import describe_hit, shorten

    for rank, h in enumerate(hits, 1):
        out(f"{rank}. {h.score:.4f}  [{h.session_id}] {h.role}: {shorten(h.text, 100)}")
        out(f"   {describe_hit(h)}  id={h.id}")
    return EXIT_OK


def _cmd_stats(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    with _open(args, err) as memory:
        s = memory.stats()
        where, read_only = str(memory.path), getattr(memory, "read_only", False)
    fields = {"path": where, "users": s.users, "sessions": s.sessions, "messages": s.messages,
              "indexed": s.indexed, "duplicates": s.duplicates, "vectors": s.vectors, **s.extra,
              "read_only": read_only}
    if args.json:
        out(json.dumps(fields))
        return EXIT_OK
    if s.vectors is None:
        fields["vectors"] = f"not available ({memory.why})"
    for key, value in fields.items():
        out(f"{key:>11}: {value}")
    return EXIT_OK


def _cmd_forget_user(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    if not args.yes:
        raise CliUsageError(
            f"this deletes every message of user {args.user!r} for good; re-run with --yes to confirm")
    with _open(args, err) as memory:
        n = memory.forget_user(args.user)
    out(f"forgot user {args.user!r}: {n} messages removed from every store and index")
    return EXIT_OK


def _cmd_rebuild_index(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    with _open(args, err) as memory:
        report = memory.rebuild_index()
        vectors = memory.stats().vectors
    out(f"rebuilt the vector index: {report.get('indexed', 0)} messages embedded, {vectors} vectors")
    return EXIT_OK


def _cmd_consolidate(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def progress(step: str, done: int, total: int) -> None:
        if step not in bars:
            for bar in bars.values():
                bar.close()
            bars[step] = tqdm(total=total, desc=step, unit="item", file=err,
                              disable=True if args.no_progress else None)
        bars[step].n = done
        bars[step].refresh()

    with _open(args, err) as memory:
        try:
            report = memory.consolidate(args.user, progress=progress, dry_run=args.dry_run)
        finally:
            for bar in bars.values():
                bar.close()
    counts = {"sessions": report.sessions, "merged": report.merged, "promoted": report.promoted,
              "compressed": report.compressed, "archived_messages": report.archived_messages,
              "pruned": report.pruned}
    if args.json:
        out(json.dumps({**counts, "dry_run": args.dry_run}))
    else:
        done = "would consolidate" if args.dry_run else "consolidated"
        out(f"{done} user {args.user!r}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return EXIT_OK


def _cmd_config(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    from dataclasses import asdict
    from .cli_config import config_toml, load_config
    from .config import MemoryConfig

    config = load_config(args.config) if args.config and not args.defaults else MemoryConfig()
    text = json.dumps(asdict(config), indent=2) if args.json else config_toml(config)
    for line in text.splitlines():
        out(line)
    return EXIT_OK


def _inspect(args: argparse.Namespace, out: Callable[[str], None], err: TextIO) -> int:
    from .cli_inspect import COMMANDS as INSPECT

    if getattr(args, "max_tokens", None) is not None and args.max_tokens < 1:
        raise CliUsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    with _open(args, err) as memory:
        INSPECT[args.command](memory, args, out)
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, Callable[[str], None], TextIO], int]] = {
    "demo": _cmd_demo,
    "search": _cmd_search,
    "stats": _cmd_stats,
    **PORTABLE,
    "forget-user": _cmd_forget_user,
    "rebuild-index": _cmd_rebuild_index,
    "consolidate": _cmd_consolidate,
    "config": _cmd_config,
    **{name: _inspect for name in ("sessions", "facts", "episodes", "working", "context")},
}


# what a terminal acts on instead of showing: C0 controls but line feed and tab (escape
# sequences, carriage return, backspace), DEL, C1 controls (the one-byte CSI) and the
# bidirectional marks and overrides, which reorder the text shown around them
_TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def terminal_safe(line: str) -> str:
    """``line`` with every character a terminal would act on written as a ``\\uXXXX``
    escape (pure): stored text cannot clear the screen, retitle the window or hide what
    is printed around it. The escape is JSON's own, so a JSON line stays valid JSON."""
    return _TERMINAL_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def _lenient(stream: TextIO) -> TextIO:
    """``stream`` writing what its encoding cannot hold as escapes (a terminal or pipe that is
    not UTF-8), not failing half-way through a listing of stored text."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")
    return stream


class _ReaderGone(Exception):
    """What reads the CLI's output closed it (``| head -1``)."""


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    # the pool warns of each failed connection attempt; the StoreError that follows says it once
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    out_stream = stdout or _lenient(sys.stdout)
    err_stream = stderr or _lenient(sys.stderr)

    def out(line: str) -> None:
        try:
            print(terminal_safe(line), file=out_stream, flush=True)
        except BrokenPipeError as e:  # (only the output's: a socket's broken pipe stays an error)
            raise _ReaderGone() from e

    def fail(line: str) -> None:
        print(terminal_safe(line), file=err_stream)

    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage message
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    args.stream = out_stream
    try:
        if args.path is not None and not args.path.strip():  # `--path "$UNSET"`: never the default memory
            raise CliUsageError("--path is empty; name the memory folder, or leave out --path for "
                                "the default ($TIERED_MEMORY_HOME or ~/.tiered-memory)")
        if args.config is not None and not args.config.strip():  # `--config "$UNSET"`: never the defaults silently
            raise CliUsageError("--config is empty; name the config file, or leave out --config for the defaults")
        return COMMANDS[args.command](args, out, err_stream)
    except EmbedderRequiredError as e:  # the CLI's way to give it, not embedder=
        fail(f"tiered-memory {args.command}: error: {embedder_hint(e, args.command)}")
        return EXIT_USAGE
    except (CliUsageError, UsageError) as e:
        fail(f"tiered-memory {args.command}: error: {e}")
        return EXIT_USAGE
    except TieredMemoryError as e:
        fail(f"tiered-memory {args.command}: {type(e).__name__}: {e}")
        return EXIT_FAILURE
    except _ReaderGone:  # the reader stopped early (`| head -1`): what it read is what it wanted
        if stdout is None:  # and the interpreter's last flush of stdout must not fail on the pipe again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        fail(f"tiered-memory {args.command}: error: {e}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        fail("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # a bug: say so briefly; TIERED_MEMORY_DEBUG=1 shows the traceback
        if os.environ.get("TIERED_MEMORY_DEBUG"):
            raise
        fail(f"tiered-memory {args.command}: unexpected {type(e).__name__}: {e} "
             "(set TIERED_MEMORY_DEBUG=1 for the traceback and please report it)")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
