"""Recall at scale: does the gain over plain vector search hold in a big store?

``bench.locomo`` asks each dev conversation's questions of a user who holds that
conversation alone (about 600 turns). A user of the library may hold tens of thousands.
Here each conversation is one user's history beside ``--distractors`` other turns of the
same user: pairs of the *other* conversations' turns (one turn repeated with a suffix would
be a near-duplicate, which the library rightly indexes once), 20 to a session, their
sessions dated evenly across the conversation's own dates, so a date in a question matches
distractors too. Speakers of the distractors are the other conversations' people.

Per conversation it prints turn recall@10 of ``TieredMemory.search`` and, in the same run,
of plain vector search: the best 10 turns by cosine, read from the same index with the same
embedder (an exact scan, so no approximate index loses anything; the issue's plain recipe
is the same search through LangChain's Chroma). ``--candidates`` compares values of
``RetrievalConfig.candidates`` on the same stores.

    nice -n 19 python -m bench.scale_recall                      # LoCoMo, 29,000 distractors
    nice -n 19 python -m bench.scale_recall --dataset realchat   # the real-chat rewrite
    python -m bench.scale_recall --keep /tmp/scale-recall --candidates 150 200

About 1.5 minutes per conversation on a 2-core machine with two settings, most of it building
the store. Prints numbers; writes only the stores (kept with ``--keep``, where a store is
reused once its build has finished).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.locomo import DEFAULT_DATA, ingest  # noqa: E402
from bench.locomo_data import (Conversation, Question, Turn, load_conversations, recall_at,  # noqa: E402
                               session_recall_at)

SESSION_TURNS = 20


def distractors(others: Sequence[Turn], n: int, start: float, end: float, seed: int) -> list[list[dict[str, Any]]]:
    """``n`` distinct messages in sessions of :data:`SESSION_TURNS`: pairs of ``others``' turns
    (pure; the same seed gives the same sessions). Session ``s`` of ``S`` is dated at
    ``start + s / (S - 1) x (end - start)``, its turns a minute apart."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    texts: list[tuple[str, str]] = []
    while len(texts) < n:
        a, b = (others[int(i)] for i in rng.integers(0, len(others), 2))
        text = f"{a.text} {b.text}"
        if text not in seen:
            seen.add(text)
            texts.append((text, a.speaker))
    count = -(-n // SESSION_TURNS)
    sessions = []
    for s in range(count):
        when = start + (end - start) * s / max(1, count - 1)
        part = texts[s * SESSION_TURNS:(s + 1) * SESSION_TURNS]
        sessions.append([{"role": "user" if j % 2 else "assistant", "content": text, "timestamp": when + 60 * j,
                          "metadata": {"speaker": speaker}} for j, (text, speaker) in enumerate(part)])
    return sessions


def build(memory: Any, conv: Conversation, others: Sequence[Turn], n: int) -> None:
    """The user ``u``: ``n`` distractors, then the conversation itself."""
    times = [t.timestamp for t in conv.turns]
    for s, msgs in enumerate(distractors(others, n, min(times), max(times), seed=1)):
        memory.add_many(msgs, user_id="u", session_id=f"other_{s}")
    ingest(memory, conv, user_id="u")


def held(memory: Any) -> Any:
    """``memory``, once its index holds the user's vectors for an exact scan (when it can), so
    every question sees the same exact ranking, none the engine's approximate one."""
    from tiered_memory.vector.chroma import ChromaVectorIndex

    if isinstance(memory.index, ChromaVectorIndex):
        memory.index.scans_exactly("u", wait=True)
    return memory


def plain(memory: Any) -> Callable[[str], list[str]]:
    """Plain vector search: the user's 10 nearest turns by cosine, as dialogue ids."""
    from tiered_memory.embedding import embed_query

    def ask(question: str) -> list[str]:
        vec = embed_query(memory.embedder, question)
        found = memory.index.query(vec[None, :], user_id="u", k=10, layers=["turn"])[0]
        rows = memory.store.get_by_ids("u", [i for i, _ in found])
        return [str(rows[i].metadata.get("dia_id")) for i, _ in found if i in rows]
    return ask


def library(memory: Any) -> Callable[[str], list[str]]:
    def ask(question: str) -> list[str]:
        return [str(h.metadata.get("dia_id")) for h in memory.search(question, user_id="u", k=10)]
    return ask


def scores(ask: Callable[[str], list[str]], questions: Sequence[Question]) -> list[tuple[float, float, float]]:
    """Per question: turn recall@10, recall@5, session recall@10."""
    out = []
    for q in questions:
        got = ask(q.question)
        out.append((recall_at(got, q.evidence, 10), recall_at(got, q.evidence, 5), session_recall_at(got, q.evidence, 10)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale_recall", description=__doc__.split("\n")[0])
    p.add_argument("file", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo-format JSON")
    p.add_argument("--dataset", choices=["locomo", "realchat"], default="locomo")
    p.add_argument("--conversations", nargs="*", help="sample ids to run (default: all)")
    p.add_argument("--distractors", type=int, default=29_000, help="other turns of the same user")
    p.add_argument("--candidates", type=int, nargs="*", help="RetrievalConfig.candidates values to compare")
    p.add_argument("--keep", metavar="FOLDER", help="build the stores here, or reuse those already here")
    args = p.parse_args(argv)
    from tiered_memory import TieredMemory

    convs = load_conversations(Path(args.file))
    if args.dataset == "realchat":
        from bench.realchat import realchat
        convs = realchat(convs)
    chosen = [c for c in convs if not args.conversations or c.id in args.conversations]
    settings: list[int | None] = list(args.candidates or [None])
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(args.keep or scratch)
        for conv in chosen:
            folder = home / f"{args.dataset}-{conv.id}-{args.distractors}"
            built = home / f"{folder.name}.built"  # a build that stopped half-way is not reused
            if folder.exists() and not built.exists():
                shutil.rmtree(folder)
            with TieredMemory(folder) as m:
                if not built.exists():
                    build(m, conv, [t for o in convs if o is not conv for t in o.turns], args.distractors)
                    m.flush()
                    built.touch()
                line = {"plain vector": scores(plain(held(m)), conv.questions)}
                config = m.config
            for n in settings:  # the same store, opened again with each setting
                retrieval = config.retrieval if n is None else dataclasses.replace(config.retrieval, candidates=n)
                with TieredMemory(folder, config=dataclasses.replace(config, retrieval=retrieval)) as m:
                    line[f"library, {retrieval.candidates} candidates"] = scores(library(held(m)), conv.questions)
            for name, got in line.items():
                rows.setdefault(name, []).extend(got)
            print(f"{conv.id}: " + ", ".join(f"{name} {statistics.fmean(r[0] for r in got):.3f}"
                                              for name, got in line.items()), flush=True)
    print(f"\n{args.dataset}, {len(chosen)} conversation(s), each beside {args.distractors:,} distractor turns "
          "of the same user; recall@10 (recall@5, session recall@10)")
    floor = statistics.fmean(r[0] for r in rows["plain vector"])
    for name, got in rows.items():
        r10 = statistics.fmean(r[0] for r in got)
        ratio = f"  {r10 / floor:.2f}x plain" if floor else ""
        print(f"  {name:28} {r10:.3f} ({statistics.fmean(r[1] for r in got):.3f}, "
              f"{statistics.fmean(r[2] for r in got):.3f}){ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
