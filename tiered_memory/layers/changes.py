"""What a fact's history entry says of a change, and the metadata merge it records (pure).

An ``edit`` entry holds the old and new text in its own fields; its ``details`` say what
else changed, from what: ``type`` and ``confidence`` (the new value, or None where it did
not change: entries written before 2026-12 hold only these two), ``old_type`` and
``old_confidence`` (only where they changed), ``metadata_keys`` (the keys the edit added or
changed, sorted) and ``old_metadata`` (the old values of those that were there before: a key in
``metadata_keys`` but not in ``old_metadata`` was added). Details are held to the metadata limit
an import takes (``MemoryConfig.max_metadata_bytes``), so every entry exports and imports:
old values too big to fit beside the rest are left out (``old_metadata_left_out``), and keys too
many to name are counted (``metadata_keys_changed``). Every entry's details are held to that
limit when written (:func:`bounded_details`): a list too long to fit (the ``source_ids`` of a
model's fact that names every turn of a long session, the duplicates an ``absorb`` entry of a
merge's keeper took in) names its first items as far as the limit allows and counts the rest
(``source_ids_left_out``, ``absorbed_left_out``); the fact keeps all its sources, and each
duplicate's own ``merge`` entry names the keeper. The ``update``
and ``confirm`` entries of an ``add_fact`` that keeps a known fact say the same of the
caller's metadata merged into it (:func:`merge_metadata`, :func:`metadata_details`).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..json_values import json_bytes
from ..records import Fact
from ..validation import check_metadata


def stored_metadata(metadata: dict[str, Any] | None, method: str) -> dict[str, Any]:
    """A new fact's metadata as stored: the caller's, and the ``resolution`` method that
    decided it ("rules" or "llm") (pure)."""
    return {**(metadata or {}), "resolution": method}


def merge_metadata(old: Mapping[str, Any], given: Mapping[str, Any] | None, max_bytes: int) -> dict[str, Any]:
    """A fact's metadata ``old`` with ``given`` merged in (given keys win), the whole held to
    ``max_bytes`` as stored JSON (what is stored exports and imports whole): past it, an
    InvalidInputError. Unchecked where nothing is given."""
    merged = {**old, **(given or {})}
    if given:
        check_metadata(merged, max_bytes, "the fact's metadata with this change")
    return merged


def edit_details(old: Fact, *, type: str, confidence: float, metadata: Mapping[str, Any],
                 max_bytes: int) -> dict[str, Any]:
    """The details of the ``edit`` entry that takes ``old`` to ``type``, ``confidence`` and
    ``metadata`` (what was given, merged into its own), within ``max_bytes`` as JSON."""
    details: dict[str, Any] = {"type": None if type == old.type else type,
                               "confidence": None if confidence == old.confidence else confidence}
    if type != old.type:
        details["old_type"] = old.type
    if confidence != old.confidence:
        details["old_confidence"] = old.confidence
    return {**details, **metadata_details(old.metadata, metadata, beside=details, max_bytes=max_bytes)}


def metadata_details(old: Mapping[str, Any], given: Mapping[str, Any], *, beside: Mapping[str, Any],
                     max_bytes: int) -> dict[str, Any]:
    """What an entry's details say of ``given`` merged into metadata ``old`` (``metadata_keys``,
    ``old_metadata``...), as much as fits within ``max_bytes`` as JSON beside the entry's other
    details ``beside``; ``{}`` where nothing changes."""
    keys = sorted(k for k, v in given.items() if k not in old or old[k] != v)
    if not keys:
        return {}
    before = {k: old[k] for k in keys if k in old}
    for shown in ({"metadata_keys": keys, "old_metadata": before} if before else {"metadata_keys": keys},
                  {"metadata_keys": keys, "old_metadata_left_out": True} if before else None,
                  {"metadata_keys_changed": len(keys)}):
        if shown is not None and _size({**beside, **shown}) <= max_bytes:
            return shown
    return {}  # a limit under a hundred bytes: the rest of the entry alone


def _size(details: Mapping[str, Any]) -> int:
    return json_bytes(details, "history details")  # as check_metadata measures it on import


def bounded_details(details: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """A history entry's ``details`` as written: as given where they fit within ``max_bytes`` as
    JSON; past it, each list (``source_ids``, ``absorbed``...) keeps as many of its first items
    as fit beside the rest, in turn, and ``<key>_left_out`` counts those it left out. A limit
    under what the rest takes leaves the rest alone (nothing else is shortened)."""
    lists = {k: v for k, v in details.items() if isinstance(v, list)}
    if not lists or _size(details) <= max_bytes:
        return dict(details)
    out = {**details, **{k: [] for k in lists}, **{f"{k}_left_out": len(v) for k, v in lists.items()}}
    for key, items in lists.items():
        room = max_bytes - _size(out)  # beside the lists before (as shown) and after (empty)
        shown: list[Any] = []
        for item in items:
            room -= _size({"": item}) - 4  # the item as JSON, and the ", " before it (no larger than {"": })
            if room < 0:
                break
            shown.append(item)
        out[key] = shown
        if len(shown) < len(items):
            out[f"{key}_left_out"] = len(items) - len(shown)
        else:
            del out[f"{key}_left_out"]
    return out
