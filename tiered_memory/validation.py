"""Pure checks of caller input. Nothing is written until every message passes."""

from __future__ import annotations

import inspect
import json
import math
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ContentTooLargeError, InvalidInputError
from .json_values import MAX_JSON_DEPTH as MAX_JSON_DEPTH, encode_json as encode_json
from .quoting import defuse_tokens
from .tool_calls import check_tool_calls
from .types import ROLES, Message
from .ids import LAYER_ID_PREFIXES

MAX_ID_LENGTH = 256
MAX_COUNT = 2**31 - 1  # limits, k and budgets: what every store and index can take as a number
MAX_LAYER_METADATA_BYTES = 64_000  # the default MemoryConfig.max_metadata_bytes

# Timestamps a read can always render and score: 1900-01-01 to 2200-01-01 UTC. Wider
# values are almost always a unit mistake (JavaScript's ``Date.now()`` is milliseconds).
MIN_TIMESTAMP = -2208988800.0
MAX_TIMESTAMP = 7258118400.0
#: the control characters an id may not hold (C0 and DEL)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: a name an adapter's framework writes raw as a tag around memory: a letter or ``_``, then
#: letters, digits, ``_``, ``.`` and ``-`` (so no space, ``/``, ``<``, ``>`` or line break)
TAG_NAME = re.compile(r"[^\W\d][\w.-]*")


def check_id(value: object, name: str) -> str:
    """Return ``value`` if it is a usable user/session id.

    Ids are opaque strings stored as data (never used in paths or SQL text),
    so any printable characters are allowed, path separators and quotes included.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInputError(f"{name} is {len(value)} characters; the limit is {MAX_ID_LENGTH}")
    if CONTROL.search(value):
        raise InvalidInputError(f"{name} must not contain control characters")
    if not encodable(value):
        raise InvalidInputError(f"{name} contains lone surrogates and cannot be stored as UTF-8")
    return value


def check_tag_name(value: object, name: str) -> str:
    """Return ``value`` if it can name a tag around memory, as ``<value>`` and ``</value>``
    (LlamaIndex's ``Memory`` writes a block's name so, raw, into the prompt): a :data:`TAG_NAME`
    of at most :data:`MAX_ID_LENGTH` characters whose tags spell no chat template's turn marker
    (``s``, ``think``, ``tool_call``: :func:`~tiered_memory.quoting.defuse_tokens`). Anything
    else could close the tag or add lines of its own outside the quoting."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if len(value) > MAX_ID_LENGTH or not TAG_NAME.fullmatch(value):
        raise InvalidInputError(
            f"{name} {value[:80]!r} cannot name a tag: use a letter or _ then letters, digits, _, . or - "
            f"(at most {MAX_ID_LENGTH} characters)")
    tags = f"<{value}></{value}>"
    if defuse_tokens(tags) != tags:
        raise InvalidInputError(f"{name} {value!r} would spell a chat template's special token as a tag; pick another")
    return value


def check_optional_id(value: object, name: str) -> str | None:
    """``None``, or an id :func:`check_id` accepts (a default that may be left unset)."""
    return None if value is None else check_id(value, name)


def encodable(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 (no lone surrogates), as every store needs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: object, name: str) -> str:
    """Text a layer stores (a fact, a working-memory item, an item's search text): a non-empty
    str that every record store can hold (no NUL, valid UTF-8)."""
    return check_storable(value, name, blank=False)


def check_storable(value: object, name: str, *, blank: bool) -> str:
    """``value`` if it is a str that every record store can hold (no NUL, valid UTF-8), not
    empty, and not only whitespace unless ``blank`` (an item key or a namespace label may be)."""
    if not isinstance(value, str) or not value or not (blank or value.strip()):
        raise InvalidInputError(f"{name} must be a non-empty string, got {_shown(value)[:80]}")
    if "\x00" in value:
        raise InvalidInputError(f"{name} {value[:60]!r} contains NUL, which cannot be stored; remove it")
    if not encodable(value):
        raise InvalidInputError(f"{name} {value[:60]!r} contains lone surrogates; it cannot be stored as UTF-8")
    return value


_LABEL = re.compile(r"[\w .:/+-]{1,40}")


def check_label(value: object, name: str) -> str:
    """A short label shown beside an item (a working-memory ``type``): 1-40 word
    characters, spaces or ``.:/+-``, so it can never close the quoting it sits beside."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
    if not _LABEL.fullmatch(value):
        raise InvalidInputError(
            f"{name} must be 1-40 letters, digits, spaces or '_.:/+-', got {value!r}")
    return value


MAX_FACT_CHARS = 5_000  # a fact is a statement; longer text belongs in a message


def not_blank(text: str) -> str:
    """``text`` unless blank by Python's rules (``str.strip``), the rule :func:`check_text` applies;
    for model output, whose schemas' ``\\S`` pattern (pydantic's Rust regex) takes the separators
    ``\\x1c``-``\\x1f`` for text.

    Raises:
        ValueError: only whitespace (pydantic reports it as a validation error).
    """
    if not text.strip():
        raise ValueError("must contain text, not only whitespace or separators")
    return text


def check_fact_text(value: object) -> str:
    """The text of a fact: stored text (:func:`check_text`) of at most :data:`MAX_FACT_CHARS`."""
    text = check_text(value, "fact text")
    if len(text) > MAX_FACT_CHARS:
        raise ContentTooLargeError(f"a fact is {len(text):,} characters; the limit is {MAX_FACT_CHARS:,} "
                                   "(a fact is one statement; store documents as messages)")
    return text


def check_unit(value: object, name: str) -> float:
    """A number in [0, 1] (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise InvalidInputError(f"{name} must be a number within [0, 1], got {value!r}")
    return float(value)


def check_content(content: object, max_chars: int) -> str:
    if not isinstance(content, str):
        raise InvalidInputError(f"content must be a str, got {type(content).__name__}")
    if not content.strip():
        raise InvalidInputError("content must contain non-whitespace text")
    if len(content) > max_chars:
        raise ContentTooLargeError(
            f"content is {len(content):,} characters; the limit is {max_chars:,} "
            "(raise MemoryConfig.max_content_chars or split the text)"
        )
    if "\x00" in content:
        raise InvalidInputError("content must not contain NUL characters")
    if not encodable(content):
        raise InvalidInputError("content contains lone surrogates and cannot be stored as UTF-8")
    return content


def check_role(role: object) -> str:
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidInputError(f"role must be one of {sorted(ROLES)}, got {role!r}")
    return str(role)


def check_metadata(metadata: object, max_bytes: int, name: str = "metadata") -> dict[str, Any]:
    """Return a deep copy of ``metadata`` as JSON-safe data (nested values kept); errors call
    it ``name`` (a scratchpad entry is checked as a one-key mapping, and says so); past
    ``max_bytes`` a ContentTooLargeError (an InvalidInputError)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"{name} must be a mapping, got {type(metadata).__name__}")
    if not metadata:  # most turns': nothing to encode or check
        return {}
    encoded = encode_json(metadata, name, ensure_ascii=False)
    if not encodable(encoded):
        raise InvalidInputError(f"{name} contains lone surrogates")
    if len(encoded.encode("utf-8")) > max_bytes:  # too large, as a message's text past its bound
        raise ContentTooLargeError(
            f"{name} is {len(encoded.encode('utf-8')):,} bytes as JSON; the limit is {max_bytes:,} bytes. Nothing "
            "was written: keep large data elsewhere (messages, item_store) and its key here"
        )
    return dict(json.loads(encoded))


def to_epoch(timestamp: object, default: float) -> float:
    """Accept epoch seconds, an aware/naive datetime (naive = UTC) or an ISO string."""
    if timestamp is None:
        return default
    if isinstance(timestamp, bool):
        raise InvalidInputError("timestamp must be a number, datetime or ISO string, not bool")
    if isinstance(timestamp, (int, float)):
        try:
            value = float(timestamp)
        except OverflowError as e:
            raise InvalidInputError(f"timestamp {_shown(timestamp)} is outside 1900-01-01..2200-01-01 in "
                                   "epoch seconds") from e
    elif isinstance(timestamp, datetime):
        ts = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=timezone.utc)
        try:
            value = ts.timestamp()
        except (OverflowError, OSError, ValueError) as e:
            raise InvalidInputError(f"timestamp {timestamp!r} is out of range: {e}") from e
    elif isinstance(timestamp, str):
        try:
            parsed = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError as e:
            raise InvalidInputError(f"timestamp {timestamp!r} is not ISO 8601") from e
        return to_epoch(parsed, default)
    else:
        raise InvalidInputError(
            f"timestamp must be a number, datetime or ISO string, got {type(timestamp).__name__}"
        )
    if not math.isfinite(value):
        raise InvalidInputError("timestamp must be finite")
    if not MIN_TIMESTAMP <= value < MAX_TIMESTAMP:
        hint = ""
        if MAX_TIMESTAMP * 1000 > abs(value) >= MAX_TIMESTAMP:
            hint = f"; it looks like milliseconds (JavaScript's Date.now()): pass {value / 1000:.3f}"
        raise InvalidInputError(
            f"timestamp {value!r} is outside 1900-01-01..2200-01-01 in epoch seconds{hint}")
    return value


def nearest_time(value: float) -> float:
    """``value`` if :func:`to_epoch` accepts it, else the nearest time it does (1900-01-01, or the
    last second before 2200-01-01): how a time another writer stored out of range (milliseconds)
    is shown and exported."""
    return value if MIN_TIMESTAMP <= value < MAX_TIMESTAMP else min(max(value, MIN_TIMESTAMP), MAX_TIMESTAMP - 1.0)


def normalize_message(item: object, *, max_chars: int, max_metadata_bytes: int, now: float) -> Message:
    """Turn a dict or :class:`Message` into a validated :class:`Message` with epoch timestamp."""
    if isinstance(item, Message):
        role, content, metadata, timestamp, message_id = item.role, item.content, item.metadata, item.timestamp, item.id
    elif isinstance(item, Mapping):
        unknown = set(item) - {"role", "content", "metadata", "timestamp", "id"}
        if unknown:
            raise InvalidInputError(f"unknown message fields {sorted(unknown)}")
        if "role" not in item or "content" not in item:
            raise InvalidInputError("a message needs 'role' and 'content'")
        role, content = item["role"], item["content"]
        metadata, timestamp, message_id = item.get("metadata"), item.get("timestamp"), item.get("id")
    else:
        raise InvalidInputError(f"a message must be a dict or Message, got {type(item).__name__}")
    return Message(
        role=check_role(role),
        content=check_content(content, max_chars),
        metadata=check_tool_calls(check_metadata(metadata, max_metadata_bytes)),  # names, ids: sent unquoted
        timestamp=to_epoch(timestamp, now),
        id=None if message_id is None else check_message_id(message_id),
    )


def check_message_id(value: object) -> str:
    """A caller's message id: a usable id (:func:`check_id`) that does not start with a prefix
    of the vectors of episodes, facts or items, whose ids it would otherwise take over."""
    message_id = check_id(value, "message id")
    if message_id.startswith(LAYER_ID_PREFIXES):
        raise InvalidInputError(f"message id {message_id!r} starts with {message_id.split(':', 1)[0] + ':'!r}, "
                                f"which the vectors of episodes, facts and items use; pick another id")
    return message_id


def check_flag(value: object, name: str) -> bool:
    """``value`` as a ``bool`` if it is ``True`` or ``False`` (numpy's too): a string such as
    ``"no"`` is truthy, and would silently mean yes. ``0`` and ``1`` are refused, as
    ``MemoryConfig`` refuses them: an int where a flag goes is likelier a count given to the
    wrong keyword (``include_recent=5``) than a yes or no."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_count(value: object, name: str, *, minimum: int, optional: bool = False) -> int | None:
    """``value`` if it is an int from ``minimum`` to :data:`MAX_COUNT` (or ``None`` when
    ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise InvalidInputError(f"{name} must be an int >= {minimum} (and at most {MAX_COUNT:,}), got {value!r}")
    return value


def check_filters(filters: object) -> Mapping[str, Any] | None:
    """Search filters: metadata keys to one JSON scalar each (equality), ``role`` to one of
    the roles, ``since``/``until`` to finite epoch seconds. Anything else is refused: a list,
    a mapping (an operator) or a NaN would otherwise match nothing or everything, silently."""
    if filters is None:
        return None
    if not isinstance(filters, Mapping) or not all(isinstance(k, str) and k and encodable(k) and "\x00" not in k
                                                   for k in filters):
        raise InvalidInputError(f"filters must be a mapping with non-empty str keys (no NUL), got {filters!r}")
    for key, value in filters.items():
        if isinstance(value, str) and (not encodable(value) or "\x00" in value):
            raise InvalidInputError(f"filters[{key!r}] holds text no store can hold (a NUL or a lone surrogate)")
        if key in ("since", "until"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
                raise InvalidInputError(f"filters[{key!r}] must be finite epoch seconds, got {_shown(value)}")
        elif key == "role":
            if not isinstance(value, str) or value not in ROLES:
                raise InvalidInputError(f"filters['role'] must be one of {sorted(ROLES)}, got {value!r}")
        elif isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise InvalidInputError(f"filters[{key!r}] is an integer beyond 64 bits, which no store can compare in a "
                                    "filter; store such a value as a string to filter on it")
        elif not (value is None or isinstance(value, (str, bool, int))
                  or (isinstance(value, float) and math.isfinite(value))):
            raise InvalidInputError(
                f"filters[{key!r}] must be one value (str, number, bool or None) that the metadata value "
                f"equals; got {type(value).__name__} (no operators or lists)")
    return filters


def _shown(value: object) -> str:
    """``repr(value)``, but a huge int by its size (Python refuses to print one of 4,300+ digits)."""
    if isinstance(value, int) and abs(value) >= 10**18:
        return f"(an int of {value.bit_length()} bits)"
    return repr(value)


def _finite(value: int | float) -> bool:
    """``math.isfinite`` that says False for an int too large for a float, instead of raising."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_query(query: object) -> str:
    if not isinstance(query, str):
        raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
    if not encodable(query):
        raise InvalidInputError("query contains lone surrogates and is not valid text")
    return query


def check_path(value: object, name: str = "path") -> Path:
    """``value`` as a :class:`~pathlib.Path` if it is a file path a file can have: a str or
    ``os.PathLike`` of text, without NUL (which the OS refuses with a bare ``ValueError``) and
    that the file system's encoding can write (a lone surrogate other than the bytes Python
    decoded it from fails there with a bare ``UnicodeEncodeError``)."""
    if not isinstance(value, (str, os.PathLike)):
        raise InvalidInputError(f"{name} must be a file path (str or os.PathLike), got {type(value).__name__}")
    try:
        path = Path(value)
    except TypeError as e:  # an os.PathLike returning bytes
        raise InvalidInputError(f"{name} must be a file path of text (str), not bytes: {e}") from None
    if not os.fspath(value):  # Path("") is the working directory, which nobody means by it
        raise InvalidInputError(f"{name} is empty: name a file or folder")
    if "\x00" in str(path):
        raise InvalidInputError(f"{name} holds a NUL character, which no file name can; got {str(path)!r}")
    try:
        os.fsencode(path)
    except UnicodeEncodeError as e:  # a lone surrogate the file system's encoding cannot carry
        raise InvalidInputError(f"{name} holds {e.object[e.start:e.end]!r}, which no file name can; "
                                f"got {str(path)!r}") from None
    return path


def check_callback(value: object, name: str, args: int) -> None:
    """``value`` is ``None`` or a function that takes ``args`` arguments: checked before any write,
    so a call that is refused has stored nothing (a non-callable, or one of another shape, would
    fail only after the first commit). One whose signature cannot be read (some builtins) passes."""
    if value is None:
        return
    if not callable(value):
        raise InvalidInputError(f"{name} must be a function (or None), got {type(value).__name__}")
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(getattr(value, "__call__", None)):
        raise InvalidInputError(f"{name} must be a plain function, not an async one: it is called in the worker "
                                "thread that runs the call (the a* twins too), where a coroutine never runs")
    try:
        inspect.signature(value).bind(*range(args))
    except TypeError as e:
        raise InvalidInputError(f"{name} is called with {args} argument{'s' if args != 1 else ''}, which "
                                f"this function cannot take ({e})") from None
    except ValueError:  # no signature to read
        pass


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """``None`` (no limit) or finite, non-negative seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value < 0:
        raise InvalidInputError(f"{name} must be None or a finite number of seconds >= 0, got {_shown(value)}")
    return float(value)
