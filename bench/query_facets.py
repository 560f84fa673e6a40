"""The facets of a question, and the searches of ``bench.query_split`` (cached): each dev question
searched once as asked (no spread, the first 40 turns) and once per facet (that module's docstring
says which). Pure functions first, then the searches."""

from __future__ import annotations

import pickle
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.locomo import DEFAULT_DATA, ingest, make_embedder  # noqa: E402
from bench.locomo_data import load_conversations, session_of  # noqa: E402

DEPTH = 40
TUNE = {"conv-26", "conv-30", "conv-41"}
CACHE = Path("/tmp/qs")

Hits = list[tuple[str, float, str]]  # (dia_id, score, text), best first


# ---- facets (pure) -----------------------------------------------------------
_COORD = re.compile(r"\b([\w'’-]+)\s+(and|or)\s+((?:(?:her|his|their|the|a|an|my|our|its|your)\s+)?[\w'’-]+)")
_BOTH = re.compile(r"\s*\bboth\b", re.I)


def split_coordination(question: str) -> list[str]:
    """The question once per conjunct of each ``X and Y`` / ``X or Y`` (one word each side, a
    determiner kept with the right one), ``both`` dropped: ``"What have Jon and Gina both
    done?"`` -> ``["What have Jon done?", "What have Gina done?"]``. No conjunction, no facets."""
    from tiered_memory.recall.query import STOPWORDS

    out: list[str] = []
    for m in _COORD.finditer(question):
        left, right = m.group(1), m.group(3)
        if left.lower() in STOPWORDS or right.split()[-1].lower() in STOPWORDS:
            continue
        base = _BOTH.sub("", question)
        span = m.group(0)
        out += [base.replace(span, left, 1), base.replace(span, right, 1)]
    return list(dict.fromkeys(f for f in out if f != question))


def subject_words(question: str) -> list[str]:
    """The question's proper names with each of its other content words: ``"What books has
    Melanie read?"`` -> ``["Melanie books", "Melanie read"]``; a question with one content
    word besides its names gives none (that is the question itself)."""
    from tiered_memory.recall.query import keywords, proper_names

    names = sorted(proper_names(question))
    lower_names = {n.lower() for n in names}
    rest = [w for w in keywords(question) if w not in lower_names and not w.isdigit()]
    if len(rest) < 2:
        return []
    return [" ".join(names + [w]) for w in rest]


_CAP = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z][\w'’-]*")


def second_hop(question: str, hits: Hits, speakers: Sequence[str], *, top: int = 3, extra: int = 4) -> str | None:
    """A second query from the first ``top`` hits: the question's names and the ``extra`` words of
    those hits the question lacks that are rarest among the first 40 (names in the middle of a
    sentence first), or None when there are none."""
    from tiered_memory.recall.query import keywords, proper_names

    asked = set(keywords(question))
    skip = asked | {s.lower() for s in speakers}
    df: dict[str, int] = {}
    for _, _, text in hits[:DEPTH]:
        for w in set(keywords(text)):
            df[w] = df.get(w, 0) + 1
    found: dict[str, float] = {}
    for _, _, text in hits[:top]:
        caps = {re.sub(r"['’]s$", "", w.lower()) for w in _CAP.findall(text)}
        for w in keywords(text):
            if w in skip or len(w) < 3 or w.isdigit():
                continue
            found[w] = min(found.get(w, 1e9), df.get(w, 1) - (10 if w in caps else 0))
    picked = sorted(found, key=lambda w: (found[w], w))[:extra]
    if not picked:
        return None
    return " ".join(sorted(proper_names(question)) + picked)


# ---- fusion (pure) -----------------------------------------------------------
def shipped(main: Sequence[str], listing: bool) -> list[int]:
    from tiered_memory.recall.spread import spread_sessions

    return spread_sessions([session_of(i) for i in main], 10, 2 if listing else 0)


def tail_fill(main: Sequence[str], base: list[int], facets: Sequence[Sequence[str]], *, cap: int, reach: int,
              keep: int = 5) -> list[str]:
    """The shipped ten with up to ``cap`` of its last places given to facet hits (each facet's
    first ``reach``, round robin) from sessions not yet among them; only a place (past the first
    ``keep``) whose session another of the ten holds is given up."""
    ten = [main[i] for i in base]
    seen = {session_of(i) for i in ten}
    picks: list[str] = []
    for depth in range(reach):
        for f in facets:
            if depth < len(f) and session_of(f[depth]) not in seen and len(picks) < cap:
                picks.append(f[depth])
                seen.add(session_of(f[depth]))
    return give_places(ten, picks, keep)


def give_places(ten: list[str], picks: Sequence[str], keep: int) -> list[str]:
    """``ten`` with each pick in turn taking the last place (past the first ``keep``) whose
    session another of the ten holds; no session of ``ten`` is lost."""
    ten = list(ten)
    for p in picks:
        counts: dict[str, int] = {}
        for i in ten:
            counts[session_of(i)] = counts.get(session_of(i), 0) + 1
        spare = [n for n in range(len(ten) - 1, keep - 1, -1) if counts[session_of(ten[n])] > 1]
        if not spare:
            break
        del ten[spare[0]]
        ten.append(p)
    return ten


def rrf(lists: Sequence[Sequence[str]], weights: Sequence[float], c: float = 60.0) -> list[str]:
    score: dict[str, float] = {}
    for lst, w in zip(lists, weights):
        for r, i in enumerate(lst):
            score[i] = score.get(i, 0.0) + w / (c + r + 1)
    return sorted(score, key=lambda i: -score[i])


# ---- the searches (I/O, cached) ---------------------------------------------
@dataclass
class Asked:
    conversation: str
    category: int
    question: str
    evidence: tuple[str, ...]
    listing: bool
    main: Hits
    facets: dict[str, list[Hits]]  # family -> one ranking per facet


def collect(dataset: str, embedder: str) -> list[Asked]:
    from tiered_memory import MemoryConfig, TieredMemory
    from tiered_memory.recall.query import plan_query

    CACHE.mkdir(exist_ok=True)
    cache_file = CACHE / f"{dataset}.pkl"
    cache: dict[tuple[str, str], Hits] = pickle.loads(cache_file.read_bytes()) if cache_file.exists() else {}
    convs = load_conversations(DEFAULT_DATA)
    if dataset == "realchat":
        from bench.realchat import realchat

        convs = realchat(convs)
    emb = make_embedder(embedder)
    base = MemoryConfig()
    config = replace(base, retrieval=replace(base.retrieval, spread=0.0, listing_spread=0.0))
    out: list[Asked] = []
    timings: list[float] = []
    for c in convs:
        folder = CACHE / dataset / c.id
        memory: Any = None

        def search(query: str) -> Hits:
            nonlocal memory
            key = (c.id, query)
            if key not in cache:
                if memory is None:
                    fresh = not folder.exists()
                    memory = TieredMemory(folder, embedder=emb, config=config)
                    if fresh:
                        ingest(memory, c, user_id="u")
                start = time.perf_counter()
                hits = memory.search(query, user_id="u", k=DEPTH)
                timings.append(time.perf_counter() - start)
                cache[key] = [(str(h.metadata.get("dia_id")), h.score, h.text) for h in hits]
            return cache[key]

        for q in c.questions:
            main = search(q.question)
            facets = {"coord": [search(f) for f in split_coordination(q.question)],
                      "words": [search(f) for f in subject_words(q.question)]}
            hop = second_hop(q.question, main, c.speakers)
            facets["hop"] = [search(hop)] if hop else []
            wide = second_hop(q.question, main, c.speakers, extra=2)
            facets["hop+q"] = [search(f"{q.question} {wide}")] if wide else []
            each = [second_hop(q.question, [h] + main, c.speakers, top=1) for h in main[:3]]
            facets["hops"] = [search(f) for f in dict.fromkeys(e for e in each if e)]
            out.append(Asked(c.id, q.category, q.question, q.evidence, plan_query(q.question).listing, main, facets))
        if memory is not None:
            memory.close()
    cache_file.write_bytes(pickle.dumps(cache))
    if timings:
        print(f"searched {len(timings)} queries, p50 {statistics.median(timings) * 1000:.1f} ms")
    return out
