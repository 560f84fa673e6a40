"""Context recall under other section shares: which split of ``build_context``'s budget lets
the layers earn their tokens (issue 20: the full context must reach more evidence per token
than turns alone at every budget, or the defaults change until it does).

    nice -n 19 python -m bench.context_shares                    # the default sweep (~10 min)
    nice -n 19 python -m bench.context_shares --shares 0.3/0.4/0.4/1.5 0.3/0.4/0.4/2
    nice -n 19 python -m bench.context_shares --dataset realchat --shares --budget episode_relevance=0.7

Each conversation's memories are made once (turns only; extractive facts and episodes after
every session) in ``--keep`` and copied afresh for every setting, so a setting never sees the
access counts an earlier one left. A setting is ``session/facts/episodes/turns``
(``BudgetConfig.shares``). Prints recall *cited* (evidence per 1,000 tokens, mean tokens handed on) at
500 / 1,000 / 2,000 tokens, and *carried* at 500, for turns only and each setting; writes nothing but the
kept memories.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.context_recall import BUDGETS, Measured, measure, summarize_context  # noqa: E402
from bench.fusion_fit import DEFAULT_DATA  # noqa: E402  (it also sets the offline environment)
from bench.locomo_data import load_conversations  # noqa: E402

# around 0.3/0.4/0.4/1.5, the default before answer types (today's: 0.3/0.2/0.4/1.5)
SWEEP = ("0.3/0.4/0.4/1.5", "0.3/0.4/0.4/1.75", "0.3/0.4/0.4/2", "0.3/0.4/0.4/2.5", "0.3/0.4/0.3/1.5",
         "0.3/0.4/0.5/1.5", "0.3/0.3/0.4/1.5", "0.3/0.5/0.4/1.5", "0.3/0.2/0.4/1.5", "0.3/0.3/0.5/1.5", "0.3/0.1/0.4/1.5",
         "0.3/0.2/0.3/1.5", "0.3/0.2/0.5/1.5")


def shares(spec: str) -> dict[str, float]:
    session, facts, episodes, turns = (float(x) for x in spec.split("/"))
    return {"session": session, "facts": facts, "episodes": episodes, "turns": turns}


def row(name: str, rows: dict[int, list[Measured]]) -> None:
    cells = []
    for b in BUDGETS:
        r = summarize_context(rows[b])
        cells.append(f"{r['cited']:.3f} ({r['cited_per_1k_tokens']:.3f}, {r['tokens']:.0f} t)")
    carried = summarize_context(rows[BUDGETS[0]])["carried"]
    print(f"{name:22s} | " + " | ".join(cells) + f" | carried@{BUDGETS[0]} {carried:.3f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    from dataclasses import replace

    from tiered_memory import MemoryConfig, StaticEmbedder

    p = argparse.ArgumentParser(prog="python -m bench.context_shares", description=__doc__.split("\n")[0])
    p.add_argument("file", nargs="?", default=str(DEFAULT_DATA))
    p.add_argument("--shares", nargs="+", default=list(SWEEP), help="session/facts/episodes/turns settings")
    p.add_argument("--budget", nargs="+", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                   help="other BudgetConfig settings, one row each, on the default shares "
                        "(for example episode_relevance=0.7)")
    p.add_argument("--dataset", choices=["locomo", "realchat", "realchat-noisy"], default="locomo",
                   help="realchat: the conversations rewritten as real chat (bench/realchat.py); "
                        "realchat-noisy: with reactions (lol, omg) between messages")
    p.add_argument("--keep", help="where the made memories are kept (default: a temporary folder)")
    args = p.parse_args(argv)
    convs = load_conversations(Path(args.file))
    if args.dataset != "locomo":
        from bench.realchat import realchat, realchat_noisy

        convs = realchat(convs) if args.dataset == "realchat" else realchat_noisy(convs)
    embedder = StaticEmbedder()
    keep = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="context-shares-"))
    print(f"{len(convs)} conversations, {sum(len(c.questions) for c in convs)} questions; memories in {keep}; "
          f"cited recall (per 1,000 tokens, mean tokens) at {' / '.join(map(str, BUDGETS))} tokens", flush=True)

    def run(mode: str, config: Any) -> dict[int, list[Measured]]:
        rows: dict[int, list[Measured]] = {b: [] for b in BUDGETS}
        for c in convs:
            made = keep / f"{mode}-{c.id}"
            if not (made / "ingested.json").is_file():
                measure(c, embedder=embedder, folder=made, mode=mode, budgets=())  # make it once
            with tempfile.TemporaryDirectory(prefix="context-share-") as tmp:
                copy = Path(tmp) / "m"
                shutil.copytree(made, copy)
                got = measure(c, embedder=embedder, folder=copy, mode=mode, config=config)
            for b in BUDGETS:
                rows[b] += got[b]
        return rows

    row("turns only", run("turns", MemoryConfig()))
    for spec in args.shares:
        config = MemoryConfig()
        config = replace(config, budget=replace(config.budget, shares=shares(spec)))
        row(f"extractive {spec}", run("extractive", config))
    for spec in args.budget:
        settings = {k.strip(): float(v) for k, _, v in (x.partition("=") for x in spec.split(","))}
        config = MemoryConfig()
        config = replace(config, budget=replace(config.budget, **settings))
        row(f"extractive {spec}", run("extractive", config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
