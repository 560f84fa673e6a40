"""Late interaction over the static table (issue 20, tried, not shipped): for each pool
candidate, MaxSim scores from the bundled static embedder's token rows, as new columns
on top of the shipped 13 signals, refitted on the tuning split like ``bench/fusion_round2.py``.

    nice -n 19 python -m bench.fusion_pools     # once: the raw pools
    nice -n 19 python -m bench.fusion_maxsim    # prints numbers (about a minute after the row cache)

Columns (each min-max scaled within a pool): ``maxsim_mean``, the mean over the query's
tokens of their best cosine with any of the turn's tokens; ``maxsim_w``, the same weighted by
each query token's row norm (its SIF weight); ``maxsim_rev``, each turn token's best cosine
with a query token, weighted by the turn token's norm; ``maxsim_sym``, the mean of the two.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fusion_fit import TUNE  # noqa: E402  (it also sets the offline environment)
from bench.fusion_pools import DEFAULT_CACHE, load  # noqa: E402
from bench.fusion_round2 import NAMES, SEL, fit, line, loco, queries, table  # noqa: E402

COLUMNS = ("maxsim_mean", "maxsim_w", "maxsim_rev", "maxsim_sym")


class TokenRows:
    """The static table's token rows for MaxSim: unit rows, their norms (SIF weights) and the
    tokenizer, read once."""

    def __init__(self, table_: Any) -> None:
        self.tokenizer = table_.tokenizer
        self.norms = np.linalg.norm(table_.rows, axis=1)
        self.unit = table_.rows / np.maximum(self.norms, 1e-9)[:, None]
        self.special = {self.tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[UNK]")}

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, special and unknown tokens left out; ``[0]`` for none."""
        return [[i for i in e.ids if i not in self.special] or [0]
                for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def maxsim_columns(query: str, texts: Sequence[str], tokens: TokenRows) -> np.ndarray:
    """Rows in ``texts`` order, columns :data:`COLUMNS`, scaled to 0..1 within the pool (pure
    given the table)."""
    q = tokens.ids([query])[0]
    weight_q = tokens.norms[q] / tokens.norms[q].sum()
    per_text = tokens.ids(texts)
    flat = np.array([i for t in per_text for i in t])
    starts = np.concatenate(([0], np.cumsum([len(t) for t in per_text])[:-1]))
    sims = tokens.unit[q] @ tokens.unit[flat].T
    best = np.maximum.reduceat(sims, starts, axis=1)  # each query token's best in each text
    weight_t = tokens.norms[flat]
    rev = np.add.reduceat(sims.max(axis=0) * weight_t, starts) / np.add.reduceat(weight_t, starts)
    out = np.column_stack([best.mean(axis=0), weight_q @ best, rev, 0.5 * (weight_q @ best + rev)])
    lo, hi = out.min(axis=0), out.max(axis=0)
    scaled: np.ndarray = (out - lo) / np.where(hi > lo, hi - lo, 1.0)
    return scaled


def main(argv: Sequence[str] | None = None) -> int:
    from tiered_memory.embedding.static import BUNDLED_DIR, load_table
    from tiered_memory.recall.fusion import LEARNED

    tokens = TokenRows(load_table(BUNDLED_DIR))
    qs = queries(False)
    pools = load(DEFAULT_CACHE)
    tune = [q for q in qs if q.conversation in TUNE]
    line("shipped table (fusion.LEARNED)", qs, table(dict(LEARNED)), f"LOCO {loco(tune, lambda t: fit(t, SEL)):.4f}")
    for q, p in zip(qs, pools):
        q.x = np.column_stack([q.x, maxsim_columns(p.plan.text, [c.text for c in p.candidates], tokens)])
    for j, name in enumerate(COLUMNS):
        cols = SEL + [len(NAMES) + j]
        line(f"13 + {name}", qs, fit(tune, cols), f"LOCO {loco(tune, lambda t: fit(t, cols)):.4f}")
    both = SEL + [len(NAMES) + 1, len(NAMES) + 2]
    line("13 + maxsim_w + maxsim_rev", qs, fit(tune, both), f"LOCO {loco(tune, lambda t: fit(t, both)):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
