"""Dates for the tests that name one: a UTC calendar day as the epoch seconds the stores keep."""

from __future__ import annotations

from datetime import datetime, timezone

DAY = 86400.0


def utc(y: int, m: int, d: int) -> float:
    return datetime(y, m, d, tzinfo=timezone.utc).timestamp()
