"""The raw candidate pools of every dev question, dumped once (issue 20, round two of the
learned fusion): ``bench/fusion_fit.py`` keeps only a feature matrix, so trying a new signal
meant ingesting again; this keeps what ``recall.search.gather_pool`` returned (candidates,
the turn before each, the query plan, each candidate's session position and dialogue id), so
``bench/fusion_round2.py`` computes any signal from the pool offline.

    nice -n 19 python -m bench.fusion_pools          # writes the cache (about 100 MB)
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.locomo_data import load_conversations  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo_dev.json"
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fusion_pools_wt20e.pkl"


@dataclass
class RawPool:
    dataset: str
    conversation: str
    category: int
    evidence: tuple[str, ...]
    candidates: list[Any]  # recall.scoring.Candidate, in pool order
    previous: dict[str, str]
    plan: Any  # recall.query.QueryPlan
    dia: list[str]  # each candidate's dialogue id
    seq: list[int]  # each candidate's position in its session


def dump(data: Path, dataset: str) -> list[RawPool]:
    from bench.locomo import ingest
    from bench.realchat import realchat
    from tiered_memory import MemoryConfig, StaticEmbedder, TieredMemory
    from tiered_memory.recall.search import gather_pool

    convs = load_conversations(data)
    if dataset == "realchat":
        convs = realchat(convs)
    embedder = StaticEmbedder()
    out: list[RawPool] = []
    with tempfile.TemporaryDirectory(prefix="fusion-pools-") as tmp:
        for c in convs:
            user = f"locomo-{c.id}"
            with TieredMemory(Path(tmp) / c.id, embedder=embedder, config=MemoryConfig()) as memory:
                ingest(memory, c, user_id=user)
                config = memory.config.retrieval
                for q in c.questions:
                    pool = gather_pool(store=memory.store, index=memory.index, embedder=memory.embedder,
                                       config=config, query=q.question, user_id=user, k=10)
                    assert pool is not None
                    cands = pool.candidates
                    out.append(RawPool(
                        dataset=dataset, conversation=c.id, category=q.category, evidence=q.evidence,
                        candidates=list(cands), previous=dict(pool.previous), plan=pool.plan,
                        dia=[str(pool.records[cd.id].metadata.get("dia_id")) for cd in cands],
                        seq=[int(pool.records[cd.id].seq) for cd in cands]))
            print(f"  {dataset} {c.id}: {len(c.questions)} questions", flush=True)
    return out


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # run as ``python -m bench.fusion_pools``, the pools were pickled as ``__main__.RawPool``
        return RawPool if name == "RawPool" else super().find_class(module, name)


def load(cache: Path = DEFAULT_CACHE) -> list[RawPool]:
    with cache.open("rb") as f:
        pools: list[RawPool] = _Unpickler(f).load()
    return pools


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fusion_pools", description=__doc__.split("\n")[0])
    p.add_argument("file", nargs="?", default=str(DEFAULT_DATA))
    p.add_argument("--cache", default=str(DEFAULT_CACHE))
    args = p.parse_args(argv)
    pools = dump(Path(args.file), "locomo") + dump(Path(args.file), "realchat")
    Path(args.cache).write_bytes(pickle.dumps(pools))
    print(f"{len(pools)} pools, {sum(len(q.dia) for q in pools)} rows -> {args.cache}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
