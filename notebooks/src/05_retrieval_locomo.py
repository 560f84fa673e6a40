# %% [markdown]
# # Retrieval on LoCoMo: tiered-memory vs a plain vector store
#
# LoCoMo (Maharana et al., ACL 2024) is public long-conversation data with questions
# whose evidence lists the turns that answer them. We ingest one dev conversation
# through the public API, ask its questions, and compare the library's hybrid recall
# with the seed recipe every agent starts from: a plain Chroma collection with the same
# vectors (the default static embedder, distilled from MiniLM). The full five-conversation
# run is `python -m bench.locomo`
# (see `bench/README.md`).
#
# The data file is not shipped with the library (CC BY-NC 4.0); this notebook reads it
# from `$LOCOMO_FILE` or the benchmark's default path, `../shared/data/locomo_dev.json`.

# %%
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
repo = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
sys.path.insert(0, str(repo))
from bench import locomo

data = Path(os.environ.get("LOCOMO_FILE", locomo.DEFAULT_DATA))
if not data.exists():
    raise FileNotFoundError(f"LoCoMo data not found at {data}: set LOCOMO_FILE to a LoCoMo-format JSON file")
print("data:", data)

# %% [markdown]
# ## Run the benchmark on one conversation
# Same code as the command line; it prints the library's figures beside the baseline's. One
# embedder, the default static one (the command line's default adds MiniLM for its comparison table).

# %%
out = Path(tempfile.mkdtemp(prefix="locomo-")) / "locomo.json"
locomo.main([str(data), "--conversations", "conv-26", "--tune", "1", "--no-scale", "--embedders", "static",
             "--out", str(out)])
results = json.loads(out.read_text())

# %% [markdown]
# ## Recall@k for both systems

# %%
import matplotlib.pyplot as plt

get_ipython().run_line_magic("matplotlib", "inline")  # the benchmark switched matplotlib to Agg for its PNG

overall = {name: results["splits"]["all"][name]["overall"] for name in ("library", "baseline")}
fig, ax = plt.subplots(figsize=(6, 4))
for name, style in (("library", "-o"), ("baseline", "--s")):
    ax.plot(locomo.KS, [overall[name][f"recall@{k}"] for k in locomo.KS], style, label=name)
ax.set_xlabel("k (turns returned)"); ax.set_ylabel("turn-level recall@k"); ax.set_ylim(0, 1)
ax.set_title("LoCoMo conv-26"); ax.grid(alpha=0.3); ax.legend()
plt.tight_layout(); plt.show()

for k in (5, 10):
    lib, base = overall["library"][f"recall@{k}"], overall["baseline"][f"recall@{k}"]
    print(f"recall@{k}: library {lib:.3f}  baseline {base:.3f}  ratio {lib / base:.2f}")
assert overall["library"]["recall@10"] > overall["baseline"]["recall@10"]

# %% [markdown]
# ## Which sessions? The ten turns against a session search
# Ten turns can all come from the one session that matches best. `search_sessions` ranks the
# user's sessions by their best turn instead, so its first ten sessions hold more of the
# sessions a question's evidence lies in. The baseline's session search is the sessions of its
# nearest turns, each once.

# %%
for name in ("library", "baseline"):
    o = overall[name]
    print(f"{name:8s} session recall@10: of the ten turns {o['session_recall@10']:.3f}, "
          f"of a session search {o['session_search_recall@10']:.3f}")
assert overall["library"]["session_search_recall@10"] > overall["library"]["session_recall@10"]
assert overall["library"]["session_search_recall@10"] > overall["baseline"]["session_search_recall@10"]
