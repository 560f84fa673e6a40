"""The vector index of a folder read beside the process that owns it: none.

:class:`NoVectors` stands where a reader of another process's folder
(:class:`~tiered_memory.readonly.ReadOnlyMemory`) has no index to open: that process owns it.
Its queries find nothing, so recall ranks the record store's keyword matches alone (with
their names, dates, neighbours and recency); anything that would write refuses.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import VectorIndexError
from .base import VectorItem


class NoVectors:
    """A :class:`~.base.VectorIndex` that holds nothing and accepts nothing."""

    def _refuse(self) -> VectorIndexError:
        return VectorIndexError("this memory was opened read-only, without its vector index: "
                                "nothing may be written to it")

    def upsert(self, items: list[VectorItem]) -> None:
        raise self._refuse()

    def query(self, vectors: np.ndarray, *, user_id: str, k: int, layers: Sequence[str] | None = None,
              session_id: str | None = None, among: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        return [[] for _ in range(len(vectors))]

    def delete(self, ids: list[str]) -> None:
        raise self._refuse()

    def delete_user(self, user_id: str) -> None:
        raise self._refuse()

    def ids(self, user_id: str | None = None) -> set[str]:
        return set()

    def count(self, user_id: str | None = None) -> int:
        return 0

    def reset(self) -> None:
        raise self._refuse()

    def close(self) -> None:
        pass
