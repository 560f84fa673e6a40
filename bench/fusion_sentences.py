"""A turn scored by its best sentence (issue 20, tried), on the raw pools of
bench/fusion_pools.py, against the shipped ranking in the same run.

    nice -n 19 python -m bench.fusion_pools          # once (~30 s)
    nice -n 19 python -m bench.fusion_sentences      # prints numbers (a few minutes)

A static vector is the mean of a text's token rows, so a turn that greets, answers and asks
back in three sentences matches the query by a third of its tokens. Token-level MaxSim was
tried (bench/fusion_maxsim.py); this is the sentence level: each pool turn of two or more
sentences is split at sentence ends, each sentence embedded by the static table, and the
turn gets (a) its best sentence's cosine to the query (``sentence_best``) and (b) that minus
its own cosine (``sentence_gain``), as one more column refitted with the 13 shipped signals
(listwise, L2 0.01; LOCO on the tuning split), and (c) in place of the turn's cosine
(``max(own, best sentence)``) under the shipped table. Prints numbers; writes nothing.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import FEATURES, TUNE, features  # noqa: E402
from bench.fusion_pools import load  # noqa: E402
from bench.fusion_prf import compare_columns  # noqa: E402
from bench.fusion_round2 import SEL, Slots, fit, line, pool_query, table  # noqa: E402
from bench.fusion_sessions import fold_loco  # noqa: E402

_END = re.compile(r"(?<=[.!?])\s+(?=\S)|\n+")


def sentences(text: str) -> list[str]:
    return [s for s in (p.strip() for p in _END.split(text)) if len(s) > 1]


def main(argv: Sequence[str] | None = None) -> int:
    from tiered_memory.config import RetrievalConfig
    from tiered_memory.embedding import default_embedder, embed_query
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question
    from tiered_memory.recall.search import turn_weights

    embedder = default_embedder()
    pools = load()
    split = {c.text: sentences(c.text) for p in pools for c in p.candidates}
    parts = sorted({s for ss in split.values() if len(ss) > 1 for s in ss})
    svec = dict(zip(parts, embedder.embed_array(parts)))
    print(f"{len(split)} turn texts, {sum(len(ss) > 1 for ss in split.values())} of several sentences", flush=True)
    w = turn_weights(RetrievalConfig())
    width = len(FEATURES)
    shipped = table(LEARNED, width + 2)
    qs, replaced = [], []
    for p in pools:
        qv = embed_query(embedder, p.plan.text)
        own = np.array([c.similarity if c.similarity is not None else np.nan for c in p.candidates])
        best = np.array([max((float(svec[s] @ qv) for s in split[c.text]), default=np.nan)
                         if len(split[c.text]) > 1 else np.nan for c in p.candidates])
        floor = np.nanmin(own) if np.isfinite(own).any() else 0.0
        own_f = np.where(np.isfinite(own), own, floor)
        best_f = np.where(np.isfinite(best), best, own_f)
        x = features(p.candidates, p.previous, p.plan, w, p.places)
        qs.append(pool_query(p, np.column_stack([x, best_f, best_f - own_f])))
        cands = [c if c.similarity is None or not np.isfinite(b) else replace(c, similarity=max(c.similarity, float(b)))
                 for c, b in zip(p.candidates, best)]
        x2 = features(cands, p.previous, p.plan, w, p.places)
        replaced.append(pool_query(p, np.column_stack([x2, np.zeros((len(x2), 2))])))
    listing = {id(q): 2 if is_listing_question(p.plan.text) else 0 for q, p in zip(qs, pools)}
    listing.update({id(q): 2 if is_listing_question(p.plan.text) else 0 for q, p in zip(replaced, pools)})
    lst = lambda q: listing[id(q)]  # noqa: E731
    compare_columns(qs, shipped, lst, {"sentence_best": width, "sentence_gain": width + 1}, ())
    line("(c) cosine = max(own, best sentence)", replaced, Slots(shipped, lst, 40))
    rtune = [q for q in replaced if q.conversation in TUNE]
    rf = {c: fit([q for q in rtune if q.conversation != c], SEL) for c in TUNE}
    line("(c) the same, refitted", replaced, Slots(fit(rtune, SEL), lst, 40),
         f"LOCO {fold_loco(rtune, rf, lambda x: Slots(x, lst, 40)):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
