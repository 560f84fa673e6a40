"""Writing to the vector index in batches that one bad row cannot stop.

A pass over what the index lacks or owes (the turns' repair, the payment of owed deletions)
sends its rows in batches, and an engine refuses a whole call for one row it cannot take. A
batch refused is sent again in halves, down to the rows refused alone: those are skipped for
this pass (left pending or owed, logged, tried again by the next pass) and the rest are written.

Invariants:

- Each row is tried alone at most once per pass, so a pass ends (its caller excludes the
  skipped rows from what it reads next).
- An engine that is down, not a row, is told apart by :data:`DOWN_AFTER` rows refused alone in
  a row with nothing written between them: the pass stops there and raises, at a cost of a few
  calls (the halving down to one row, then those rows), not one call per row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, Sequence, TypeVar

from ..errors import VectorIndexError

log = logging.getLogger("tiered_memory")

T = TypeVar("T")

#: rows refused alone, one after another with nothing written between them, after which a pass
#: takes the engine (not a row) to be failing and stops
DOWN_AFTER = 3


@dataclass(kw_only=True)
class SkippingPass(Generic[T]):
    """One pass's writes: what it skipped, the first error, and the refusals since the last write.

    Args:
        what: what a row is, for the log (``"turn"``, ``"owed deletion"``).
        name: a row's name in the log.
    """

    what: str
    name: Callable[[T], str] = str
    skipped: list[T] = field(default_factory=list)
    error: VectorIndexError | None = None
    _refused: int = 0

    def write(self, rows: Sequence[T], write: Callable[[Sequence[T]], None]) -> None:
        """``write(rows)``; refused, each half again, down to single rows: one refused alone is
        skipped (:attr:`skipped`, :attr:`error`) and the others written.

        Raises:
            VectorIndexError: :data:`DOWN_AFTER` rows refused alone in a row: the engine is
                failing; what was not written stays as it was (pending, owed).
        """
        if not rows:
            return
        try:
            write(rows)
        except VectorIndexError as e:
            if len(rows) > 1:
                half = (len(rows) + 1) // 2
                self.write(rows[:half], write)
                self.write(rows[half:], write)
                return
            self._skip(rows[0], e)
            return
        self._refused = 0

    def _skip(self, row: T, error: VectorIndexError) -> None:
        self._refused += 1
        if self._refused >= DOWN_AFTER:
            raise self.error or error
        self.skipped.append(row)
        self.error = self.error or error
        log.warning("%s %s skipped by this pass, kept for the next: %s", self.what, self.name(row), error)


def summary_error(message: str, first: VectorIndexError) -> VectorIndexError:
    """One error for what a pass skipped: ``message`` (its ``{error}`` filled with what the index
    said the first time, ``first``'s cause), caused by ``first``."""
    error = VectorIndexError(message.format(error=first.__cause__ or first))
    error.__cause__ = first
    return error


def raise_or_hand_on(errors: Iterable[VectorIndexError | None], skipped: list[VectorIndexError] | None) -> None:
    """The errors of what a pass left undone (``None``: nothing), the rest of it done: the first
    raised, or, with ``skipped`` (a caller with more passes to run first), all put there."""
    left = [e for e in errors if e is not None]
    if skipped is not None:
        skipped.extend(left)
    elif left:
        raise left[0]
