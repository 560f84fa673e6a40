"""The query's vector from some of its words (issue 20, tried), on the raw pools of
bench/fusion_pools.py, against the shipped ranking in the same run.

    nice -n 19 python -m bench.fusion_pools             # once (~30 s)
    nice -n 19 python -m bench.fusion_query_words       # prints numbers (a few minutes)

A static vector is the mean of a text's token rows, so a question's vector holds its
question words and the names it asks about as much as what it asks for. A name is rare, so
its row weighs a lot after the Zipf down-weighting, and in a chat log it matches every turn
that person wrote or was greeted in, whatever the topic. Each variant embeds the query
without some of its words and scores every pool turn by its cosine to that vector: (a) one
more column, added with a fixed weight or refitted with the 13 shipped signals (listwise,
L2 0.01; LOCO on the tuning split), and (b) in place of the cosine (every signal computed
again from it) under the shipped table, and refitted. Prints numbers; writes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if not __package__:
    sys.path.insert(0, str(REPO))

from bench.fusion_fit import FEATURES, TUNE, features  # noqa: E402
from bench.fusion_pools import load  # noqa: E402
from bench.fusion_prf import compare_columns  # noqa: E402
from bench.fusion_round2 import SEL, Slots, fit, line, pool_query, table  # noqa: E402
from bench.fusion_sessions import fold_loco  # noqa: E402


def without_names(text: str, names: frozenset[str]) -> str:
    for name in names:
        text = re.sub(rf"\b{re.escape(name)}(?:['’]s)?\b", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def variants(plan: object) -> dict[str, str]:
    text, names, terms = plan.text, plan.names, plan.terms  # type: ignore[attr-defined]
    lower = {n.lower() for n in names}
    kept = [t for t in terms if t not in lower]
    return {"no names": without_names(text, names) or text,
            "content words": " ".join(terms) or text,
            "content words, no names": " ".join(kept) or text}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=float, nargs="*", default=[0.2, 0.5])
    args = ap.parse_args(argv)
    from tiered_memory.config import RetrievalConfig
    from tiered_memory.embedding import default_embedder, embed_query
    from tiered_memory.recall.fusion import LEARNED
    from tiered_memory.recall.query import is_listing_question
    from tiered_memory.recall.search import turn_weights

    embedder = default_embedder()
    pools = load()
    texts = sorted({c.text for p in pools for c in p.candidates})
    vec = dict(zip(texts, embedder.embed_array(texts)))
    names = list(variants(pools[0].plan))
    print(f"{len(pools)} questions, {len(texts)} distinct turn texts; variants: {names}", flush=True)
    w = turn_weights(RetrievalConfig())
    width = len(FEATURES)
    qs, replaced = [], {n: [] for n in names}
    for p in pools:
        m = np.stack([vec[c.text] for c in p.candidates])
        cols = {n: m @ embed_query(embedder, t) for n, t in variants(p.plan).items()}
        x = features(p.candidates, p.previous, p.plan, w, p.places)
        qs.append(pool_query(p, np.column_stack([x] + [cols[n] for n in names])))
        for n in names:
            cands = [replace(c, similarity=float(s)) for c, s in zip(p.candidates, cols[n])]
            x2 = features(cands, p.previous, p.plan, w, p.places)
            replaced[n].append(pool_query(p, np.column_stack([x2, np.zeros((len(x2), len(names)))])))
    listing = {id(q): 2 if is_listing_question(p.plan.text) else 0
               for group in [qs, *replaced.values()] for q, p in zip(group, pools)}
    lst: Callable[[object], int] = lambda q: listing[id(q)]  # noqa: E731
    shipped = table(LEARNED, width + len(names))
    compare_columns(qs, shipped, lst, {n: width + j for j, n in enumerate(names)}, args.weights)
    for n in names:
        line(f"(b) cosine from: {n}", replaced[n], Slots(shipped, lst, 40))
        rtune = [q for q in replaced[n] if q.conversation in TUNE]
        rf = {c: fit([q for q in rtune if q.conversation != c], SEL) for c in TUNE}
        line(f"(b) {n}, refitted", replaced[n], Slots(fit(rtune, SEL), lst, 40),
             f"LOCO {fold_loco(rtune, rf, lambda x: Slots(x, lst, 40)):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
