"""The JSON a store keeps of a caller's value (metadata, an item's value), encoded and checked:
serialisable, string keys at every level, no NUL, at most :data:`MAX_JSON_DEPTH` levels deep
(pure). :func:`~.validation.check_metadata` checks metadata with it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import InvalidInputError

MAX_JSON_DEPTH = 100  # dicts and lists within one another in metadata and item values
# made once: json.dumps with any argument builds a new encoder on every call, which was a
# fifth of an export's time (each metadata checked, each line written)
_STRICT = {ascii: json.JSONEncoder(ensure_ascii=ascii, allow_nan=False) for ascii in (True, False)}
_TEXT = json.JSONEncoder(ensure_ascii=False)


def json_text(value: object) -> str:
    """``json.dumps(value, ensure_ascii=False)``, with one encoder made once."""
    return _TEXT.encode(value)


def encode_json(value: object, name: str, *, ensure_ascii: bool = True) -> str:
    """``value`` (metadata, an item's value) as the JSON a store keeps, checked: serialisable
    (no NaN, no set, no value that holds itself; ``json.dumps`` runs first, as it refuses a
    value that holds itself, which :func:`check_json_value`'s walk would follow forever), then
    :func:`check_json_value`."""
    try:
        encoded = _STRICT[ensure_ascii].encode(value)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{name} must be JSON-serialisable: {e}") from e
    except RecursionError as e:
        check_json_value(value, name)  # deeper than the stack allows: it says so
        raise InvalidInputError(f"{name} could not be encoded from a call stack this deep") from e
    check_json_value(value, name)
    return encoded


def json_bytes(value: object, name: str) -> int:
    """The UTF-8 bytes of ``value`` as :func:`encode_json` writes it with non-ASCII kept: what a
    limit on stored JSON (metadata, a history entry's details, a scratchpad) measures."""
    return len(encode_json(value, name, ensure_ascii=False).encode("utf-8"))


def check_json_value(value: object, name: str) -> None:
    """Refuse ``value`` (metadata, an item's value, JSON-serialisable already) if it nests
    more than :data:`MAX_JSON_DEPTH` containers, if a key in it is not a string (JSON would
    rewrite it), or if a key or string in it holds NUL.
    Walked without recursion: how deep Python's own JSON code may go depends on the caller's
    stack, so a value stored from a shallow stack could fail every read made from a deeper
    one (a web framework, a callback, a notebook). PostgreSQL's ``jsonb``, which its filters
    read the value as, cannot hold NUL: such a value would break that user's filtered
    searches there."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            if not all(isinstance(k, str) for k in item):
                raise InvalidInputError(f"{name} keys must be strings at every level (JSON would turn them into "
                                        f"strings, and {{1: 'a', '1': 'b'}} into one key)")
            if any("\x00" in k for k in item):
                raise InvalidInputError(f"{name} has a key holding NUL, which no store can filter on")
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            if isinstance(item, str) and "\x00" in item:
                raise InvalidInputError(f"{name} holds a string with NUL, which no store can filter on")
            continue
        if depth > MAX_JSON_DEPTH:
            raise InvalidInputError(f"{name} nests more than {MAX_JSON_DEPTH} levels of dicts and lists")
        stack.extend((child, depth + 1) for child in children)
