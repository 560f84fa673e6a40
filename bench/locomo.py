"""LoCoMo retrieval benchmark: the library's hybrid recall against a plain Chroma baseline.

Run it from the repository root::

    python -m bench.locomo                      # ../shared/data/locomo_dev.json
    python -m bench.locomo path/to/locomo.json --conversations conv-26 conv-30
    python -m bench.locomo --tune 3 --out bench/results/locomo_dev.json

Every turn of each conversation goes into a fresh :class:`TieredMemory` through the
public API (``add_many``, one call per session; the text keeps the speaker's name, the
session's date is the timestamp, the dialogue id is in the metadata). Every question of
categories 1-4 that has evidence is asked with ``search(k=10)``. The baseline is the
recipe most users start from: a plain ChromaDB collection holding one embedding per
turn, queried by cosine nearest neighbours. The whole run repeats for each embedder of
``--embedders`` (default: the static default, then MiniLM), which also times the first
search in a fresh process, and ends with a table comparing them.

Parsing and scoring are pure functions in :mod:`bench.locomo_data` (tested in
``tests/test_bench_locomo.py``, re-exported here); the tables and the plot are
:mod:`bench.locomo_report`, the machine, first-search and install-size measures
:mod:`bench.locomo_env`, the plain Chroma baseline :mod:`bench.locomo_baseline`. The run writes ``<out>.json`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo_dev.json"
DEFAULT_OUT = REPO / "bench" / "results" / "locomo.json"

if not __package__:  # run as a script (python bench/locomo.py): make `bench` importable
    sys.path.insert(0, str(REPO))
# the tests and notebooks import the data and metric names from here: re-exported (`x as x`)
from bench.locomo_data import (  # noqa: E402
    CATEGORIES as CATEGORIES,
    KS as KS,
    Answer as Answer,
    Conversation as Conversation,
    EvidenceReport as EvidenceReport,
    Question as Question,
    Turn as Turn,
    hit_at as hit_at,
    load_conversations as load_conversations,
    parse_evidence as parse_evidence,
    parse_session_date as parse_session_date,
    percentile as percentile,
    recall_at as recall_at,
    session_of as session_of,
    session_recall_at as session_recall_at,
    summarize as summarize,
    turn_text as turn_text,
    within_budget as within_budget,
)
from bench.locomo_baseline import Baseline  # noqa: E402
from bench.locomo_env import first_search_seconds, install_size, machine_facts  # noqa: E402
from bench.locomo_report import compact, plot, print_comparison, print_table  # noqa: E402


# ---- runners (I/O) -----------------------------------------------------------
class CachedDocumentEmbedder:
    """Documents from a precomputed table (falls back to the model); queries live, unless
    ``queries`` holds them (to time search without the query embedding).

    Used only for the latency-at-scale memory, so that filling it does not embed every
    turn a second time.
    """

    def __init__(self, inner: Any, cache: Mapping[str, Any]) -> None:
        self.inner = inner
        self.cache = cache
        self.queries: dict[str, list[float]] = {}
        self.name = getattr(inner, "name", "embedder")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in texts if t not in self.cache]
        fresh = dict(zip(missing, self.inner.embed_array(missing))) if missing else {}
        return [list(map(float, self.cache.get(t, fresh.get(t)))) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        if text in self.queries:
            return self.queries[text]
        vector: list[float] = self.inner.embed_query(text)
        return vector


def _role(conv: Conversation, speaker: str) -> str:
    return "assistant" if len(conv.speakers) > 1 and speaker == conv.speakers[1] else "user"


def ingest(memory: Any, conv: Conversation, *, user_id: str, session_prefix: str = "") -> float:
    """Every turn through ``add_many`` (one call per session); returns the seconds spent,
    ``flush()`` included."""
    by_session: dict[int, list[Turn]] = defaultdict(list)
    for t in conv.turns:
        by_session[t.session].append(t)
    spent = 0.0
    for s, turns in sorted(by_session.items()):
        msgs = [{"role": _role(conv, t.speaker), "content": t.text, "timestamp": t.timestamp,
                 "metadata": {"dia_id": t.dia_id, "speaker": t.speaker}} for t in turns]
        start = time.perf_counter()
        memory.add_many(msgs, user_id=user_id, session_id=f"{session_prefix}session_{s}")
        spent += time.perf_counter() - start
    start = time.perf_counter()
    memory.flush()  # until the vectors written behind are in the engine too
    return spent + time.perf_counter() - start


def ask_library(memory: Any, conv: Conversation, *, user_id: str, k: int,
                count: Callable[[str], int]) -> list[Answer]:
    answers = []
    for q in conv.questions:
        start = time.perf_counter()
        hits = memory.search(q.question, user_id=user_id, k=k)
        spent = time.perf_counter() - start
        sizes = [count(h.text) for h in hits]
        start = time.perf_counter()
        found = memory.search_sessions(q.question, user_id=user_id, k=k, turns=1)
        session_spent = time.perf_counter() - start
        answers.append(Answer(question=q, retrieved=[str(h.metadata.get("dia_id")) for h in hits],
                              tokens=sum(sizes), seconds=spent, hit_tokens=sizes,
                              sessions=[str(f.hits[0].metadata.get("dia_id")) for f in found],
                              session_seconds=session_spent))
    return answers


def make_embedder(spec: str) -> Any:
    """``static`` (the default), ``minilm``, or ``static:<folder>`` (a table built by
    ``scripts/build_static_embedder.py``)."""
    from tiered_memory import SentenceTransformerEmbedder, StaticEmbedder

    if spec == "static":
        return StaticEmbedder()
    if spec.startswith("static:"):
        return StaticEmbedder(spec.split(":", 1)[1])
    if spec == "minilm":
        return SentenceTransformerEmbedder()
    raise SystemExit(f"unknown embedder {spec!r}: static, minilm or static:<folder>")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every embedder of ``--embedders`` in turn; the JSON's top level is the first one's
    results (the library default), each embedder's are under ``embedders``."""
    machine = machine_facts()
    convs = load_conversations(args.file)
    if args.dataset == "realchat":
        from bench.realchat import realchat

        convs = realchat(convs)
    elif args.dataset == "realchat-noisy":
        from bench.realchat import realchat_noisy

        convs = realchat_noisy(convs)
    if args.conversations:
        wanted = set(args.conversations)
        convs = [c for c in convs if c.id in wanted or str(convs.index(c)) in wanted]
    if not convs:
        raise SystemExit("no conversations selected")
    results: dict[str, Any] = {}
    every: dict[str, Any] = {}
    for spec in args.embedders:
        print(f"\n######## embedder: {spec}", flush=True)
        one = run_embedder(args, convs, spec, machine)
        every[spec] = one
        if not results:
            results = dict(one)
    results["embedders"] = {spec: compact(one) for spec, one in every.items()}
    if args.context or args.context_llm:
        from bench.context_recall import run_context

        print(f"\n######## context recall at a token budget ({args.embedders[0]})", flush=True)
        with tempfile.TemporaryDirectory(prefix="locomo-context-") as tmp:
            # --context-keep: the LLM-made memory survives the run and a later run measures it again
            keep = Path(args.context_keep) if args.context_keep else Path(tmp)
            results["context_recall"] = run_context(convs, embedder=make_embedder(args.embedders[0]), folder=keep,
                                                    llm_conversation=args.context_llm, llm_sessions=args.context_llm_sessions)
    if args.install_size:
        results["install_size"] = install_size(Path(args.install_size))
    print_comparison(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return results


def run_embedder(args: argparse.Namespace, convs: list[Conversation], spec: str,
                 machine: Mapping[str, Any]) -> dict[str, Any]:
    from dataclasses import replace

    from tiered_memory import MemoryConfig, TieredMemory, embedder_name
    from tiered_memory.tokens import default_token_counter

    tune_ids = [c.id for c in convs[: args.tune]]
    count = default_token_counter()
    embedder = make_embedder(spec)
    embedder.embed_query("warm up")
    config = MemoryConfig()
    if args.no_dedup:
        config = replace(config, dedup_threshold=1.01)

    # the physical limit: every text embedded in one batch with the same model
    texts = list(dict.fromkeys(t.text for c in convs for t in c.turns))
    start = time.perf_counter()
    vectors = embedder.embed_array(texts)
    embed_seconds = time.perf_counter() - start
    n_turns = sum(len(c.turns) for c in convs)
    print(f"{len(convs)} conversations, {n_turns} turns, "
          f"{sum(len(c.questions) for c in convs)} questions; batch embedding: "
          f"{len(texts) / embed_seconds:.1f} texts/s", flush=True)

    answers: dict[str, dict[str, list[Answer]]] = {"library": {}, "baseline": {}}
    ingest_seconds = {"library": 0.0, "baseline": embed_seconds}
    cache = dict(zip(texts, vectors))
    first: tuple[float, float] | None = None
    with tempfile.TemporaryDirectory(prefix="locomo-bench-") as tmp:
        baseline = Baseline(os.path.join(tmp, "baseline"), embedder)
        for c in convs:
            user = f"locomo-{c.id}"
            with TieredMemory(Path(tmp) / "library" / c.id, embedder=embedder, config=config) as memory:
                ingest_seconds["library"] += ingest(memory, c, user_id=user)
                answers["library"][c.id] = ask_library(memory, c, user_id=user, k=10, count=count)
            if first is None and c.questions:
                first = first_search_seconds(spec, Path(tmp) / "library" / c.id, user, c.questions[-1].question)
            col, spent = baseline.ingest(c, f"b{uuid.uuid4().hex[:12]}", cache)
            ingest_seconds["baseline"] += spent
            answers["baseline"][c.id] = baseline.ask(col, c, k=10, count=count)
            r = summarize(answers["library"][c.id])["overall"]
            b = summarize(answers["baseline"][c.id])["overall"]
            print(f"  {c.id}: {len(c.turns)} turns, {len(c.questions)} questions, recall@10 "
                  f"library {r['recall@10']:.3f} / baseline {b['recall@10']:.3f}", flush=True)
        # search latency with every turn of every selected conversation under one user
        scale: dict[str, Any] = {}
        if not args.no_scale:
            cached = CachedDocumentEmbedder(embedder, cache)
            with TieredMemory(Path(tmp) / "scale", embedder=cached, config=config) as memory:
                for c in convs:
                    ingest(memory, c, user_id="scale", session_prefix=f"{c.id}/")
                questions = [q for c in convs for q in c.questions][: args.scale_questions]

                def timed() -> list[float]:
                    ms = []
                    for q in questions:
                        start = time.perf_counter()
                        memory.search(q.question, user_id="scale", k=10)
                        ms.append((time.perf_counter() - start) * 1000)
                    return ms

                ms = timed()
                # again with the query vectors ready: what the library adds to the model's time
                cached.queries = {q.question: embedder.embed_query(q.question) for q in questions}
                overhead = timed()
                stats = memory.stats()
            scale = {"memories_per_user": stats.messages, "vectors": stats.vectors,
                     "queries": len(ms), "latency_ms_p50": percentile(ms, 50),
                     "latency_ms_p95": percentile(ms, 95),
                     "without_query_embedding_ms_p50": percentile(overhead, 50),
                     "without_query_embedding_ms_p95": percentile(overhead, 95)}
            print(f"scale: {stats.messages} memories in one user, search p50 "
                  f"{scale['latency_ms_p50']:.1f} ms, p95 {scale['latency_ms_p95']:.1f} ms; without the "
                  f"query embedding p50 {scale['without_query_embedding_ms_p50']:.1f} ms, "
                  f"p95 {scale['without_query_embedding_ms_p95']:.1f} ms", flush=True)

    splits = {"all": [c.id for c in convs], "tune": tune_ids,
              "held_out": [c.id for c in convs if c.id not in tune_ids]}
    results: dict[str, Any] = {
        "benchmark": "LoCoMo turn-level retrieval", "file": str(args.file), "dataset": args.dataset,
        "machine": dict(machine),
        "embedder": embedder_name(embedder),
        "first_search_s": first[0] if first else None, "first_search_process_s": first[1] if first else None,
        "config": asdict(config.retrieval), "dedup_threshold": config.dedup_threshold,
        "conversations": [c.id for c in convs], "split_ids": splits,
        "evidence_issues": dict(sum((c.evidence_issues for c in convs), Counter())),
        "evidence_issue_examples": [e for c in convs for e in c.evidence_examples],
        "throughput": {
            "turns": n_turns,
            "batch_embed_texts_per_s": len(texts) / embed_seconds,
            "library_ingest_turns_per_s": n_turns / ingest_seconds["library"],
            "baseline_ingest_turns_per_s": n_turns / ingest_seconds["baseline"],
        },
        "scale": scale, "splits": {},
    }
    t = results["throughput"]
    t["library_vs_batch_embed"] = t["library_ingest_turns_per_s"] / t["batch_embed_texts_per_s"]
    t["baseline_vs_batch_embed"] = t["baseline_ingest_turns_per_s"] / t["batch_embed_texts_per_s"]
    for split, ids in splits.items():
        if not ids:
            continue
        lib = summarize([a for i in ids for a in answers["library"][i]])
        base = summarize([a for i in ids for a in answers["baseline"][i]])
        pairs = [(a, b) for i in ids for a, b in zip(answers["library"][i], answers["baseline"][i])]
        lib["overall"]["recall@baseline_tokens"] = statistics.fmean(
            recall_at(a.retrieved, a.question.evidence, within_budget(a.hit_tokens, b.tokens))
            for a, b in pairs)
        results["splits"][split] = {"conversations": ids, "library": lib, "baseline": base}
        print_table(lib, base, f"{split}: {', '.join(ids)}")
        print(f"   library recall within the baseline's tokens at k=10: "
              f"{lib['overall']['recall@baseline_tokens']:.3f}")
    print(f"\nevidence issues: {results['evidence_issues']}")
    print(f"ingest: library {t['library_ingest_turns_per_s']:.1f} turns/s, baseline "
          f"{t['baseline_ingest_turns_per_s']:.1f}, batch embedding {t['batch_embed_texts_per_s']:.1f} "
          f"texts/s -> library/batch {t['library_vs_batch_embed']:.2f}")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.locomo", description=__doc__.split("\n")[0])
    p.add_argument("file", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo-format JSON")
    p.add_argument("--conversations", nargs="*", help="sample ids (or list indices) to run")
    p.add_argument("--dataset", choices=["locomo", "realchat", "realchat-noisy"], default="locomo",
                   help="locomo: the file as it is; realchat: its conversations rewritten to look like "
                        "real chat (bench/realchat.py: no speaker prefix, split, informal, typos); "
                        "realchat-noisy: realchat with reactions (lol, omg) between messages")
    p.add_argument("--tune", type=int, default=3,
                   help="the first N conversations form the tuning split; the rest are held out")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON output (the plot goes beside it)")
    p.add_argument("--no-scale", action="store_true", help="skip the one-user latency run")
    p.add_argument("--scale-questions", type=int, default=200)
    p.add_argument("--embedders", nargs="+", default=["static", "minilm"],
                   help="embedders to run, the first is the JSON's top level: static (the default), "
                        "minilm, static:<folder>")
    p.add_argument("--install-size", metavar="VENV",
                   help="also report the size of this virtualenv (e.g. one with only [embedded])")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch CPU threads for MiniLM in both systems (0 = torch's default)")
    p.add_argument("--context", action="store_true",
                   help="also measure context recall at 500/1,000/2,000 tokens: turns only against turns + "
                        "facts + episodes made by the extractive fallback (bench/context_recall.py)")
    p.add_argument("--context-llm", metavar="CONVERSATION",
                   help="also make facts and episodes with the local LLM (scripts/local_llm.py) on this one "
                        "conversation (slow: about two LLM calls per session)")
    p.add_argument("--context-llm-sessions", type=int, metavar="N",
                   help="with --context-llm: only the conversation's first N sessions and the questions whose "
                        "evidence lies in them (about 4 minutes an LLM session on a busy 2-core machine)")
    p.add_argument("--context-keep", metavar="FOLDER",
                   help="keep the context-recall memories here; a memory already there is measured again "
                        "without re-ingesting (so the LLM-made one is built once)")
    p.add_argument("--no-dedup", action="store_true", help="index near-duplicate turns too")
    args = p.parse_args(argv)
    if args.torch_threads and "minilm" in args.embedders:
        import torch

        torch.set_num_threads(args.torch_threads)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
