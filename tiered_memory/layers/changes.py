"""What a fact's history entry says of a change, and the metadata merge it records (pure).

An ``edit`` entry holds the old and new text in its own fields; its ``details`` say what
else changed, from what: ``type`` and ``confidence`` (the new value, or None where it did
not change: entries written before 2026-12 hold only these two), ``old_type`` and
``old_confidence`` (only where they changed), ``metadata_keys`` (the keys the edit added or
changed, sorted) and ``old_metadata`` (the old values of those that were there before: a key in
``metadata_keys`` but not in ``old_metadata`` was added). Details are held to the metadata limit
an import takes (``MemoryConfig.max_metadata_bytes``), so every entry exports and imports:
old values too big to fit beside the rest are left out (``old_metadata_left_out``), and keys too
many to name are counted (``metadata_keys_changed``). An ``absorb`` entry (a merge's keeper)
names the duplicates it took in (``absorbed``) as far as the limit allows and counts the rest
(``absorbed_left_out``): each duplicate's own ``merge`` entry names the keeper. The ``update``
and ``confirm`` entries of an ``add_fact`` that keeps a known fact say the same of the
caller's metadata merged into it (:func:`merge_metadata`, :func:`metadata_details`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..json_values import json_bytes
from ..records import Fact
from ..validation import check_metadata


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


def absorb_details(absorbed: Sequence[str], *, max_bytes: int) -> dict[str, Any]:
    """The details of a merge keeper's ``absorb`` entry: the ids it took in, those that fit
    within ``max_bytes`` as JSON, and how many were left out."""
    if _size({"absorbed": list(absorbed)}) <= max_bytes:
        return {"absorbed": list(absorbed)}
    room = max_bytes - _size({"absorbed": [], "absorbed_left_out": len(absorbed)})
    shown: list[str] = []
    for fid in absorbed:
        room -= _size({"": fid}) - 4  # the id as JSON, and the ", " before it (no larger than {"": })
        if room < 0:
            break
        shown.append(fid)
    return {"absorbed": shown, "absorbed_left_out": len(absorbed) - len(shown)}
