"""Session spread for listing questions (issue 20), and what else was tried beside it, on the
raw pools of ``bench/fusion_pools.py`` (the shipped ranking, no ingest).

    nice -n 19 python -m bench.fusion_pools                      # once: the static pools (~30 s)
    nice -n 19 python -m bench.fusion_spread                     # prints numbers (~1 minute)
    nice -n 19 python -m bench.fusion_pools --embedder minilm    # MiniLM's pools (~2 minutes)
    nice -n 19 python -m bench.fusion_spread --embedder minilm --part spread

``--part spread``: the gate (oracle: the dev set's multi-hop label; shipped:
``recall.query.is_listing_question``), the spread's forms (``Slots``: the last n of ten to
unseen sessions; a penalty per turn already taken from the same session), the trade-off of
spreading every query, and per category. ``--part tried``: signals and tables tried beside it
(per question type tables, names left out of the query vector, first-person signals), each
fitted on the tuning split as ``bench/fusion_round2.py`` does. Choices are made on the tuning
split; the held-out columns say whether they carry. Prints numbers, writes only row caches.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fusion_fit import TUNE, Linear, Query  # noqa: E402  (it also sets the offline environment)
from bench.fusion_pools import DEFAULT_CACHE, MINILM_CACHE, RawPool, load  # noqa: E402
from bench.fusion_round2 import INDEX, SEL, Capped, Slots, fit, line, loco, queries, table  # noqa: E402

Score = Callable[[Query], np.ndarray]


class Penalty:
    """Greedy: each next place goes to the best score less ``lam`` x (the sd of the 30 best
    scores) x the turns of its session already placed."""

    def __init__(self, model: Linear, lam: float) -> None:
        self.model, self.lam = model, lam

    def score(self, q: Query) -> np.ndarray:
        s = self.model.score(q)
        order = [int(i) for i in np.lexsort((q.ids, -s))][:60]
        scale = float(s[order[:30]].std()) + 1e-9
        taken: dict[int, int] = {}
        left, placed = list(order), []
        while left and len(placed) < 15:
            best = max(left, key=lambda i: s[i] - self.lam * scale * taken.get(int(q.session[i]), 0))
            left.remove(best)
            placed.append(best)
            taken[int(q.session[best])] = taken.get(int(q.session[best]), 0) + 1
        out = s - 1e3
        out[placed] = 1e3 - np.arange(len(placed))
        return out


def gated(model: Linear, gate: Callable[[Query], bool], spread: object) -> Score:
    """``spread``'s score for the questions ``gate`` passes, the table's for the others."""
    return lambda q: spread.score(q) if gate(q) else model.score(q)  # type: ignore[attr-defined]


def with_texts(qs: list[Query], pools: Sequence[RawPool]) -> dict[int, str]:
    """Each question's text, by the row object's id (rows do not carry it)."""
    assert len(qs) == len(pools)
    return {id(q): p.plan.text for q, p in zip(qs, pools)}


def part_spread(qs: list[Query], text: dict[int, str], shipped: Linear) -> None:
    from tiered_memory.recall.query import is_listing_question

    listing = {id(q): is_listing_question(text[id(q)]) for q in qs}
    is_list: Callable[[Query], bool] = lambda q: listing[id(q)]  # noqa: E731
    oracle: Callable[[Query], bool] = lambda q: q.category == 1  # noqa: E731
    for split in (True, False):
        n = [(q.category, listing[id(q)]) for q in qs if q.dataset == "locomo" and (q.conversation in TUNE) == split]
        print(f"listing questions, LoCoMo {'tuning' if split else 'held out'}, by category: "
              + ", ".join(f"{c}: {sum(1 for x in n if x == (c, True))}/{sum(1 for x in n if x[0] == c)}"
                          for c in (1, 2, 3, 4)))
    line("shipped table, no spread", qs, shipped.score)
    for name, gate in (("oracle (multi-hop)", oracle), ("listing", is_list)):
        for n in (1, 2, 3):
            line(f"{name}: last {n} to unseen sessions", qs, gated(shipped, gate, Slots(shipped, n, 40)))
        for lam in (0.25, 0.5, 1.0):
            line(f"{name}: penalty {lam:g}", qs, gated(shipped, gate, Penalty(shipped, lam)))
    line("listing: last 2, within 20", qs, gated(shipped, is_list, Slots(shipped, 2, 20)))
    line("listing: last 2, within 80", qs, gated(shipped, is_list, Slots(shipped, 2, 80)))
    print("spread for every query (RetrievalConfig.spread), listing questions 0.2:")
    for every in (0.1, 0.2, 0.3, 0.5, 1.0):
        def score(q: Query, every: float = every) -> np.ndarray:
            n = round(10 * max(every, 0.2 if listing[id(q)] else 0.0))
            return Slots(shipped, n, 40).score(q)
        line(f"  spread {every:g}", qs, score)
    for cap in (1, 2):
        line(f"  at most {cap} turn(s) of a session", qs, Capped(shipped, cap).score)
    shipping = gated(shipped, is_list, Slots(shipped, 2, 40))
    for c, name in ((1, "multi-hop"), (2, "temporal"), (3, "open-domain"), (4, "single-hop")):
        line(f"{name}: no spread", qs, shipped.score, keep=lambda q, c=c: q.category == c)  # type: ignore[misc]
        line(f"{name}: listing spread", qs, shipping, keep=lambda q, c=c: q.category == c)  # type: ignore[misc]


class PerType:
    """One table per question type (``kind``); questions of a type not fitted use ``default``."""

    def __init__(self, tune: Sequence[Query], kind: Callable[[Query], str], only: set[str] | None,
                 default: Linear) -> None:
        self.kind, self.default = kind, default
        self.tables = {t: fit([q for q in tune if kind(q) == t], SEL, 0.1)
                       for t in {kind(q) for q in tune} if only is None or t in only}

    def score(self, q: Query) -> np.ndarray:
        return self.tables.get(self.kind(q), self.default).score(q)


FIRST_PERSON = re.compile(r"\b(?:i|i'm|im|i've|ive|i'd|my|me|we|we're|we've|our|us)\b", re.I)


def part_tried(qs: list[Query], text: dict[int, str], pools: Sequence[RawPool], shipped: Linear) -> None:
    from tiered_memory import StaticEmbedder
    from tiered_memory.recall.query import SENTENCE_BREAK, is_listing_question, is_temporal_question

    tune = [q for q in qs if q.conversation in TUNE]
    fitted = lambda name, make: line(f"{name} (LOCO {loco(tune, make):.4f})", qs, make(tune))  # noqa: E731
    fitted("13 shipped signals, refitted", lambda t: fit(t, SEL))
    kinds: dict[str, Callable[[Query], str]] = {
        "oracle category": lambda q: str(q.category),
        "listing / other": lambda q: "list" if is_listing_question(text[id(q)]) else "other",
        "when / listing / other": lambda q: "when" if is_temporal_question(text[id(q)])
        else "list" if is_listing_question(text[id(q)]) else "other"}
    for name, kind in kinds.items():
        only = {"list"} if name == "listing / other" else None
        fitted(f"a table per type: {name}", lambda t, kind=kind, only=only: PerType(t, kind, only, fit(t, SEL)))
    # the query's names that are speakers of the pool, left out of the query vector
    embedder, sim = StaticEmbedder(), INDEX["similarity"]
    texts = sorted({c.text for p in pools for c in p.candidates})
    vectors = dict(zip(texts, embedder.embed_array(texts)))
    kept = [q.x[:, sim].copy() for q in qs]
    for strip in (False, True):
        # the cosine recomputed from the turns' own vectors (a long message's chunks and the
        # neighbours the index did not return get theirs too), the query's speakers kept or not
        for q, p in zip(qs, pools):
            query = p.plan.text
            for name in (p.plan.names & {c.speaker for c in p.candidates if c.speaker}) if strip else ():
                query = re.sub(rf"\b{re.escape(name)}(?:['’]s)?\b", " ", query)
            q.x[:, sim] = np.stack([vectors[c.text] for c in p.candidates]) @ embedder.embed_array([query])[0]
        line("speakers left out of the query vector" if strip else "cosine recomputed, whole query", qs,
            shipped.score)
        fitted("  the same, refitted", lambda t: fit(t, SEL))
    for q, k in zip(qs, kept):
        q.x[:, sim] = k
    # first person: the share of a turn's sentences that speak of "I", "my", "we"
    width = qs[0].x.shape[1]
    for q, p in zip(qs, pools):
        share = [sum(1 for s in sents if FIRST_PERSON.search(s)) / len(sents) if sents else 0.0
                 for sents in ([s for s in SENTENCE_BREAK.split(c.text) if s.strip()] for c in p.candidates)]
        q.x = np.column_stack([q.x[:, :width], share])
    fitted("13 + first-person share", lambda t: fit(t, SEL + [width]))
    for q in qs:
        q.x = q.x[:, :width]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fusion_spread", description=__doc__.split("\n")[0])
    p.add_argument("--embedder", choices=["static", "minilm"], default="static", help="whose pools")
    p.add_argument("--part", default="all", choices=("all", "spread", "tried"))
    args = p.parse_args(argv)
    cache = MINILM_CACHE if args.embedder == "minilm" else DEFAULT_CACHE
    pools, qs = load(cache), queries(False, cache)
    text = with_texts(qs, pools)
    from tiered_memory.recall.fusion import LEARNED

    shipped = table(dict(LEARNED))
    print(f"{args.embedder} pools: {len(qs)} questions; recall@10 (recall@5, session recall@10)")
    if args.part in ("all", "spread"):
        part_spread(qs, text, shipped)
    if args.part in ("all", "tried"):
        part_tried(qs, text, pools, shipped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
