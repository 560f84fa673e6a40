"""What ``python -m bench.locomo`` prints and draws: the library-against-baseline table of one
run, the plot of recall@k, and the table comparing embedders."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

from bench.locomo_data import KS


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def print_table(lib: Mapping[str, Any], base: Mapping[str, Any], title: str, file: Any = None) -> None:
    file = file or sys.stdout
    print(f"\n== {title} ==", file=file)
    print(f"{'':34s} {'library':>9s} {'baseline':>9s} {'ratio':>7s}", file=file)
    metrics = ["recall@5", "recall@10", "hit@5", "hit@10", "session_recall@5", "session_recall@10",
               "session_search_recall@5", "session_search_recall@10", "tokens@10", "latency_ms_p50",
               "latency_ms_p95", "session_search_ms_p95"]
    for part in lib:
        lp, bp = lib[part], base[part]
        if not lp.get("count"):
            continue
        print(f"-- {part} (n={lp['count']})", file=file)
        shown = metrics if part == "overall" else ["recall@5", "recall@10", "hit@10", "session_recall@10",
                                                   "session_search_recall@10"]
        for m in shown:
            if m not in lp or m not in bp:
                continue
            r = _ratio(lp[m], bp[m])
            print(f"   {m:31s} {lp[m]:9.3f} {bp[m]:9.3f} {r if r is not None else float('nan'):7.2f}",
                  file=file)


def plot(results: Mapping[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib missing: pip install "tiered-memory[plot]" for the plot', file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, style in (("library", "-o"), ("baseline", "--s")):
        for split, alpha in (("all", 1.0), ("held_out", 0.45)):
            summary = results["splits"].get(split, {}).get(system, {}).get("overall")
            if not summary or not summary.get("count"):
                continue
            ax.plot(KS, [summary[f"recall@{k}"] for k in KS], style, alpha=alpha,
                    label=f"{system} ({split.replace('_', '-')}, n={summary['count']})")
    ax.set_xlabel("k (turns returned)")
    ax.set_ylabel("turn-level recall@k")
    ax.set_title(f"LoCoMo retrieval: tiered-memory vs plain Chroma ({results.get('embedder', '')})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compact(one: Mapping[str, Any]) -> dict[str, Any]:
    """The figures the embedder comparison prints (from one embedder's results)."""
    overall = one["splits"]["all"]["library"]["overall"]
    scale = one.get("scale") or {}
    return {
        "name": one["embedder"],
        "recall@5": overall["recall@5"], "recall@10": overall["recall@10"],
        "session_recall@10": overall["session_recall@10"],
        "session_search_recall@10": overall.get("session_search_recall@10"),
        "baseline_recall@10": one["splits"]["all"]["baseline"]["overall"]["recall@10"],
        "ingest_turns_per_s": one["throughput"]["library_ingest_turns_per_s"],
        "batch_embed_texts_per_s": one["throughput"]["batch_embed_texts_per_s"],
        "search_ms_p50": scale.get("latency_ms_p50"), "search_ms_p95": scale.get("latency_ms_p95"),
        "search_given_vector_ms_p50": scale.get("without_query_embedding_ms_p50"),
        "search_given_vector_ms_p95": scale.get("without_query_embedding_ms_p95"),
        "first_search_s": one.get("first_search_s"), "first_search_process_s": one.get("first_search_process_s"),
    }


def print_comparison(results: Mapping[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    rows = results["embedders"]
    specs = list(rows)
    ref = rows.get("minilm")
    print("\n== embedders (full hybrid, all conversations) ==", file=file)
    print(f"{'':40s}" + "".join(f"{s[:14]:>15s}" for s in specs), file=file)

    def line(label: str, key: str, fmt: str = "{:15.3f}") -> None:
        cells = [rows[s].get(key) for s in specs]
        print(f"{label:40s}" + "".join(fmt.format(c) if c is not None else f"{'-':>15s}" for c in cells),
              file=file)

    line("recall@5", "recall@5")
    line("recall@10", "recall@10")
    line("session recall@10", "session_recall@10")
    line("session search: session recall@10", "session_search_recall@10")
    line("plain-Chroma baseline recall@10", "baseline_recall@10")
    line("ingest turns/s (add_many)", "ingest_turns_per_s", "{:15.1f}")
    line("batch embedding texts/s", "batch_embed_texts_per_s", "{:15.1f}")
    line("search p50 ms (query embedded)", "search_ms_p50", "{:15.1f}")
    line("search p95 ms (query embedded)", "search_ms_p95", "{:15.1f}")
    line("search p50 ms (query vector given)", "search_given_vector_ms_p50", "{:15.1f}")
    line("search p95 ms (query vector given)", "search_given_vector_ms_p95", "{:15.1f}")
    line("import -> first search, fresh process s", "first_search_s", "{:15.2f}")
    line("  whole process (interpreter too) s", "first_search_process_s", "{:15.2f}")
    for s in specs:
        r = rows[s]
        if r.get("search_ms_p95") and r.get("search_given_vector_ms_p95"):
            print(f"  {s}: search p95 embedded / given {r['search_ms_p95'] / r['search_given_vector_ms_p95']:.2f}x",
                  file=file)
        if ref and s != "minilm":
            print(f"  {s}: recall@10 {r['recall@10'] - ref['recall@10']:+.4f} vs minilm; ingest "
                  f"{r['ingest_turns_per_s'] / ref['ingest_turns_per_s']:.1f}x minilm", file=file)
    size = results.get("install_size")
    if size:
        print(f"install size of {size['venv']}: {size['megabytes']:.0f} MB in site-packages, "
              f"{size['distributions']} distributions, torch {'present' if size['torch'] else 'absent'}",
              file=file)
