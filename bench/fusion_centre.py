"""The cosine of a turn search measured around the user's own mean (issue 20), on the raw
pools of bench/fusion_pools.py, against the shipped ranking in the same run.

    nice -n 19 python -m bench.fusion_pools       # once (~30 s)
    nice -n 19 python -m bench.fusion_centre      # prints numbers (a few minutes)

A static table's vectors share a large common direction (every text is a mean of token
rows), and a user's turns share more: their small talk, their names, their topics. The
first table's diagnostic (bench/README, "Embedders") centred the vectors on the evaluation
turns and gained +0.010 under the hand ranking of the time. A memory can do the same per
user at run time: subtract the mean of the user's own turn vectors from the query and from
each turn before the cosine ("all-but-the-top", Mu & Viswanath 2018, also removes the
first principal directions). Here each pool's cosines are recomputed that way (``mean``:
the conversation's mean removed; ``mean+pcN``: also its first N principal directions), the
pool's signals computed again from them by the core's own code, and the ranking read (a)
under the shipped table and (b) refitted (the 13 shipped signals, listwise, L2 0.01; LOCO
on the tuning split). The pool itself is the shipped one (which turns the vector query
fetched does not change). Prints numbers; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import DEFAULT_DATA, FEATURES, TUNE, Query, features  # noqa: E402
from bench.fusion_pools import load  # noqa: E402
from bench.fusion_round2 import SEL, Slots, fit, line, pool_query, table  # noqa: E402
from bench.fusion_sessions import fold_loco  # noqa: E402
from bench.locomo_data import load_conversations  # noqa: E402
from bench.realchat import realchat  # noqa: E402

VARIANTS = ("raw", "mean", "mean+pc1", "mean+pc2", "mean+pc4")


def user_frames(embedder) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(dataset, conversation) -> (the mean of its turn vectors, its principal directions)."""
    base = load_conversations(DEFAULT_DATA)
    out = {}
    for ds, convs in (("locomo", base), ("realchat", realchat(base))):
        for c in convs:
            v = embedder.embed_array([t.text for t in c.turns])
            mu = v.mean(0)
            _, _, vt = np.linalg.svd(v - mu, full_matrices=False)
            out[(ds, c.id)] = (mu, vt)
    return out


def centred(x: np.ndarray, mu: np.ndarray, pcs: np.ndarray) -> np.ndarray:
    y = x - mu
    if len(pcs):
        y = y - (y @ pcs.T) @ pcs
    return y / np.maximum(1e-9, np.linalg.norm(y, axis=-1, keepdims=True))


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser().parse_args(argv)
    from tiered_memory.config import RetrievalConfig
    from tiered_memory.embedding import default_embedder, embed_query
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question
    from tiered_memory.recall.search import turn_weights

    embedder = default_embedder()
    pools = load()
    frames = user_frames(embedder)
    texts = sorted({c.text for p in pools for c in p.candidates})
    vec = dict(zip(texts, embedder.embed_array(texts)))
    w = turn_weights(RetrievalConfig())
    shipped = table(LEARNED, len(FEATURES))
    listing = [is_listing_question(p.plan.text) for p in pools]
    by_variant: dict[str, list[Query]] = {}
    for variant in VARIANTS:
        qs = []
        for p in pools:
            mu, vt = frames[(p.dataset, p.conversation)]
            if variant == "raw":
                cands = p.candidates
            else:
                pcs = vt[:int(variant.split("pc")[1])] if "pc" in variant else vt[:0]
                qv = centred(embed_query(embedder, p.plan.text), mu, pcs)
                cands = [c if c.similarity is None else replace(c, similarity=float(centred(vec[c.text], mu, pcs) @ qv))
                         for c in p.candidates]
            qs.append(pool_query(p, features(cands, p.previous, p.plan, w, p.places)))
        by_variant[variant] = qs
        print(f"computed {variant}", flush=True)
    print("recall@10 (recall@5, session recall@10); listing spread throughout", flush=True)
    for variant, qs in by_variant.items():
        lst_of = {id(q): 2 if listing[n] else 0 for n, q in enumerate(qs)}
        lst = lambda q, lst_of=lst_of: lst_of[id(q)]  # noqa: E731
        tune = [q for q in qs if q.conversation in TUNE]
        folds = {c: fit([q for q in tune if q.conversation != c], SEL) for c in TUNE}
        line(f"{variant}: shipped table", qs, Slots(shipped, lst, 40))
        m = fit(tune, SEL)
        line(f"{variant}: refitted", qs, Slots(m, lst, 40),
             f"LOCO {fold_loco(tune, folds, lambda x: Slots(x, lst, 40)):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
