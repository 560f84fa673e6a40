"""The default embedder: a static table distilled from the bundled all-MiniLM-L6-v2.

A text's vector is the mean of its WordPiece tokens' rows in a table (one row per token
of MiniLM's vocabulary), made unit length. No transformer runs, so it needs only numpy
and ``tokenizers`` (no torch, no download) and embeds thousands of turns per second on
a CPU. The table ships inside the package (``data/static-minilm.npz``, int8 rows with a
float32 scale each, and MiniLM's ``tokenizer.json``); ``scripts/build_static_embedder.py``
rebuilds it from the bundled MiniLM. The table is loaded lazily, once per process and
folder; constructing a :class:`StaticEmbedder` reads nothing.

Static vectors do not see word order or context, so they are a little weaker than
MiniLM on their own; inside the library's hybrid ranking (vectors fused with keyword
search) the difference is small: see ``bench/README.md`` for the figures.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EmbeddingError, missing
from .base import ArrayEmbedder, normalize

BUNDLED_DIR = Path(__file__).resolve().parent / "data"
TABLE_FILE = "static-minilm.npz"
TOKENIZER_FILE = "tokenizer.json"
BUNDLED_NAME = "static-MiniLM-L6-v2 (bundled)"


@dataclass(frozen=True)
class StaticTable:
    """A loaded table: the tokenizer and one float32 row per token id."""

    tokenizer: Any
    rows: np.ndarray
    unknown_id: int | None


_TABLES: dict[Path, StaticTable] = {}
_TABLES_LOCK = threading.Lock()


def load_table(folder: Path) -> StaticTable:
    """The table in ``folder``, read once per process."""
    with _TABLES_LOCK:
        table = _TABLES.get(folder)
        if table is None:
            table = _TABLES[folder] = _read_table(folder)
        return table


def _read_table(folder: Path) -> StaticTable:
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise missing("tokenizers", "embedded") from e
    try:
        with np.load(folder / TABLE_FILE) as data:
            rows = np.asarray(data["rows"], dtype=np.float32)
            if "scale" in data:  # int8 rows: one float32 scale per row
                rows *= data["scale"][:, None]
        tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    except (OSError, KeyError, ValueError) as e:
        raise EmbeddingError(
            f"could not load the static embedder from {str(folder)!r}: {e}. Rebuild it with "
            "python scripts/build_static_embedder.py, or reinstall tiered-memory") from e
    tokenizer.no_truncation()  # a static table has no window: every token counts
    tokenizer.no_padding()
    if tokenizer.get_vocab_size() != len(rows):
        raise EmbeddingError(f"{folder}: the tokenizer has {tokenizer.get_vocab_size()} tokens "
                             f"but the table {len(rows)} rows; rebuild the table")
    return StaticTable(tokenizer=tokenizer, rows=rows, unknown_id=tokenizer.token_to_id("[UNK]"))


def pool(rows: np.ndarray, ids: list[list[int]], unknown_id: int | None) -> np.ndarray:
    """Unit mean of each text's token rows; unknown tokens are skipped unless a text has
    nothing else (then it gets the unknown row, never a zero vector) (pure)."""
    kept = []
    for text_ids in ids:
        known = [i for i in text_ids if i != unknown_id] if unknown_id is not None else text_ids
        kept.append(known or ([unknown_id] if unknown_id is not None else [0]))
    lengths = np.fromiter((len(k) for k in kept), dtype=np.int64, count=len(kept))
    flat = np.fromiter((i for k in kept for i in k), dtype=np.int64, count=int(lengths.sum()))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return normalize(np.add.reduceat(rows[flat], starts, axis=0))


class StaticEmbedder(ArrayEmbedder):
    """Static token vectors distilled from all-MiniLM-L6-v2: no torch, no download.

    Args:
        folder: a folder written by ``scripts/build_static_embedder.py``; ``None`` is the
            table shipped in the package.

    Example:
        >>> from tiered_memory import StaticEmbedder
        >>> StaticEmbedder().embed_array(["I live in Lisbon"]).shape
        (1, 256)
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        self._folder = Path(folder).resolve() if folder is not None else BUNDLED_DIR

    @property
    def name(self) -> str:
        return BUNDLED_NAME if self._folder == BUNDLED_DIR else f"static:{self._folder}"

    @property
    def table(self) -> StaticTable:
        return load_table(self._folder)

    def embed_array(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        table = self.table
        try:
            encodings = table.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        except Exception as e:  # a non-str text, for one
            raise EmbeddingError(f"embedding failed: {e}") from e
        return pool(table.rows, [e.ids for e in encodings], table.unknown_id)

    def query_array(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embed_array([text])[0]
        return vector
