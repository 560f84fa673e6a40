"""The raw candidate pools of every dev question, dumped once (issue 20, round two of the
learned fusion): ``bench/fusion_fit.py`` keeps only a feature matrix, so trying a new signal
meant ingesting again; this keeps what ``recall.search.gather_pool`` returned (candidates,
the turn before each, the query plan, each candidate's seq, place in its session and dialogue id), so
``bench/fusion_round2.py`` computes any signal from the pool offline.

    nice -n 19 python -m bench.fusion_pools          # writes the cache (about 100 MB)
    nice -n 19 python -m bench.fusion_pools --embedder minilm   # MiniLM's pools (MINILM_CACHE)
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fusion_fit import DEFAULT_DATA, each_pool  # noqa: E402  (it also sets the offline environment)
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "fusion_pools_wt20e.pkl"
MINILM_CACHE = Path(tempfile.gettempdir()) / "fusion_pools_minilm.pkl"


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
    seq: list[int]  # each candidate's record seq (consecutive within a dev session: written in order)
    places: dict[str, int]  # each candidate's place in its session, as the search counted it


def dump(data: Path, dataset: str, embedder: Any = None) -> list[RawPool]:
    return [RawPool(dataset=dataset, conversation=c.id, category=q.category, evidence=q.evidence,
                    candidates=list(pool.candidates), previous=dict(pool.previous), plan=pool.plan,
                    dia=[str(pool.records[cd.id].metadata.get("dia_id")) for cd in pool.candidates],
                    seq=[int(pool.records[cd.id].seq) for cd in pool.candidates], places=dict(pool.places))
            for c, q, pool, _ in each_pool(data, dataset, embedder)]


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
    p.add_argument("--cache", help=f"where to write (default {DEFAULT_CACHE}, with MiniLM {MINILM_CACHE})")
    p.add_argument("--embedder", choices=["static", "minilm"], default="static")
    args = p.parse_args(argv)
    embedder = None
    if args.embedder == "minilm":
        from tiered_memory.embedding import SentenceTransformerEmbedder
        embedder = SentenceTransformerEmbedder()
    args.cache = args.cache or str(MINILM_CACHE if args.embedder == "minilm" else DEFAULT_CACHE)
    pools = dump(Path(args.file), "locomo", embedder) + dump(Path(args.file), "realchat", embedder)
    Path(args.cache).write_bytes(pickle.dumps(pools))
    print(f"{len(pools)} pools, {sum(len(q.dia) for q in pools)} rows -> {args.cache}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
