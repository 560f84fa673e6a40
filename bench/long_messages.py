"""What writing one long message costs: ``add`` of one message of each of ``--sizes``
characters into a fresh memory, per embedder, and how much of it is the model.

The text is this repository's own prose (``README.md`` then ``bench/README.md``, from a
different offset for each repeat, so no two messages are the same). Each repeat opens a
new memory (SQLite and the embedded vector index), writes one short message first (the
store's first write is not the figure) and then times ``add`` of the long one. The
embedder is wrapped to time its calls and count the characters it is handed, so the
figure says how often each character goes through the model. Prints the median of
``--repeats``::

    python -m bench.long_messages --embedders static minilm --sizes 2000 10000 90000

``--compare`` prints instead, for long texts of each size, the cosine between a message's
vector embedded from its whole text and the one the library pools from its chunks'
vectors (:func:`tiered_memory.recall.chunking.pooled_vector`), and the same with the
chunks weighted equally, for reference. ``--recall`` ranks the long sections (over
1,200 characters) of this repository's Markdown by their heading as the query, once by the
vectors embedded whole and once by the pooled ones, each alone and as search scores a
message (the better of its own vector and its best chunk's), and prints recall@1, @5 and
the mean reciprocal rank.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_memory import SentenceTransformerEmbedder, StaticEmbedder, TieredMemory
from tiered_memory.embedding.base import ArrayEmbedder, normalize
from tiered_memory.recall.chunking import chunk_spans, pooled_vector

ROOT = Path(__file__).resolve().parent.parent


class TimedEmbedder(ArrayEmbedder):
    """The inner embedder, with the seconds spent in it and the characters it embedded."""

    def __init__(self, inner: ArrayEmbedder) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.seconds = 0.0
        self.chars = 0

    def embed_array(self, texts: list[str]) -> np.ndarray:
        t = time.perf_counter()
        try:
            return self.inner.embed_array(texts)
        finally:
            self.seconds += time.perf_counter() - t
            self.chars += sum(map(len, texts))

    def query_array(self, text: str) -> np.ndarray:
        return self.embed_array([text])[0]


def prose(size: int, offset: int) -> str:
    source = " ".join(" ".join((ROOT / name).read_text(encoding="utf-8").split())
                      for name in ("README.md", "bench/README.md"))
    return (source * (1 + (size + offset) // len(source)))[offset:offset + size]


def measure(make: str, size: int, repeats: int) -> tuple[float, float, float]:
    """Median seconds of ``add``, of it in the model, and characters embedded per character."""
    inner = StaticEmbedder() if make == "static" else SentenceTransformerEmbedder()
    inner.embed_array(["warm up"])
    walls, models, ratios = [], [], []
    for r in range(repeats):
        folder = tempfile.mkdtemp(prefix="tm-long-")
        try:
            embedder = TimedEmbedder(inner)
            with TieredMemory(folder, embedder=embedder) as memory:
                memory.add("user", "hello there", session_id="s", user_id="u")
                text = prose(size, offset=7919 * (r + 1))
                embedder.seconds = embedder.chars = 0
                t = time.perf_counter()
                memory.add("assistant", text, session_id="s", user_id="u")
                walls.append(time.perf_counter() - t)
                models.append(embedder.seconds)
                ratios.append(embedder.chars / len(text))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return statistics.median(walls), statistics.median(models), statistics.median(ratios)


def compare(make: str, sizes: list[int], repeats: int) -> None:
    """Cosine of the whole text's vector to the pooled one, per size (min and median of repeats)."""
    embedder = StaticEmbedder() if make == "static" else SentenceTransformerEmbedder()
    texts = {f"{size}": [prose(size, offset=7919 * (r + 1)) for r in range(repeats)] for size in sizes}
    texts["log lines 87k"] = ["Is this a known error? " + "frame at payments.py line 42 " * 3000]
    for label, group in texts.items():
        pooled, equal = [], []
        for text in group:
            spans = chunk_spans(text)
            if not spans:
                continue
            whole = embedder.embed_array([text])[0]
            parts = embedder.embed_array([text[s:e] for s, e in spans])
            pooled.append(float(whole @ pooled_vector(parts, spans)))
            equal.append(float(whole @ normalize(parts.sum(axis=0, keepdims=True))[0]))
        if pooled:
            print(f"{make:8} {label:>14} {len(spans):7d} {min(pooled):9.4f} {statistics.median(pooled):9.4f} "
                  f"{min(equal):9.4f} {statistics.median(equal):9.4f}", flush=True)


def sections() -> list[tuple[str, str]]:
    """(heading, body) of each section of the repository's Markdown longer than CHUNK_OVER."""
    out = []
    for path in [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        parts = re.split(r"^(#{2,4} .+)$", path.read_text(encoding="utf-8"), flags=re.M)
        for heading, body in zip(parts[1::2], parts[2::2]):
            body = " ".join(body.split())
            if chunk_spans(body):
                out.append((heading.strip("# ").strip(), body))
    return out


def ranks(scores: np.ndarray) -> list[int]:
    """1-based rank of section i for query i, ``scores[query, section]``."""
    return [1 + int((row > row[i]).sum()) for i, row in enumerate(scores)]


def recall(make: str) -> None:
    embedder = StaticEmbedder() if make == "static" else SentenceTransformerEmbedder()
    found = sections()
    queries = np.stack([embedder.query_array(h) for h, _ in found])
    whole = embedder.embed_array([b for _, b in found])
    best_chunk, pooled = [], []
    for _, body in found:
        spans = chunk_spans(body)
        parts = embedder.embed_array([body[s:e] for s, e in spans])
        pooled.append(pooled_vector(parts, spans))
        best_chunk.append((queries @ parts.T).max(axis=1))
    chunk_best = np.stack(best_chunk, axis=1)  # [query, section]
    by_whole, by_pooled = queries @ whole.T, queries @ np.stack(pooled).T
    for label, scores in (("whole", by_whole), ("pooled", by_pooled),
                          ("max(whole, chunk)", np.maximum(by_whole, chunk_best)),
                          ("max(pooled, chunk)", np.maximum(by_pooled, chunk_best))):
        r = ranks(scores)
        print(f"{make:8} {label:>18} {len(r):5d} {sum(x == 1 for x in r) / len(r):6.3f} "
              f"{sum(x <= 5 for x in r) / len(r):6.3f} {statistics.mean(1 / x for x in r):6.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedders", nargs="+", default=["static", "minilm"], choices=["static", "minilm"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[2000, 10000, 90000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare", action="store_true", help="cosine of whole-text to pooled vectors")
    parser.add_argument("--recall", action="store_true", help="sections found by their heading, whole or pooled")
    args = parser.parse_args()
    if args.recall:
        print(f"{'embedder':8} {'message vector':>18} {'n':>5} {'@1':>6} {'@5':>6} {'MRR':>6}")
        for make in args.embedders:
            recall(make)
        return
    if args.compare:
        print(f"{'embedder':8} {'text':>14} {'chunks':>7} {'min cos':>9} {'median':>9} "
              f"{'equal min':>9} {'median':>9}")
        for make in args.embedders:
            compare(make, args.sizes, args.repeats)
        return
    print(f"load average {os.getloadavg()[0]:.2f} at start, {os.cpu_count()} cores")
    print(f"{'embedder':8} {'chars':>7} {'add s':>8} {'model s':>8} {'embedded/char':>14}")
    for make in args.embedders:
        for size in args.sizes:
            wall, model, ratio = measure(make, size, args.repeats)
            print(f"{make:8} {size:7d} {wall:8.3f} {model:8.3f} {ratio:14.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
