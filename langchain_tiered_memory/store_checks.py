"""Checks of the LangGraph store's operations and configuration: every operation is
checked before any runs, so bad input is :class:`~tiered_memory.errors.InvalidInputError`
and nothing is half-done."""

from __future__ import annotations

from typing import Mapping

from langgraph.store.base import GetOp, InvalidNamespaceError, ListNamespacesOp, Op, PutOp, SearchOp, TTLConfig

from tiered_memory.errors import InvalidInputError
from tiered_memory.layers.items import check_ttl
from tiered_memory.validation import check_flag, encodable, encode_json

__all__ = ["ItemValueError", "NamespaceLabelError", "check_item_namespace", "check_labels", "check_op", "check_paths",
           "check_put_namespace", "check_ttl_config"]


class NamespaceLabelError(InvalidInputError, InvalidNamespaceError):
    """A namespace LangGraph refuses or no store can hold (a label that is not text, is
    empty, holds ``.``, NUL or lone surrogates, or at the user's position is no usable user
    id; an item's namespace ``()``). Both the library's
    ``InvalidInputError`` and LangGraph's ``InvalidNamespaceError`` catch it, as code
    written against LangGraph's stores expects."""


class ItemValueError(InvalidInputError, TypeError):
    """An item value that is not a JSON object (a dict of JSON values: no sets, bytes,
    datetimes, NaN, no keys but strings). LangGraph's SQL stores fail on most such values
    with the ``TypeError`` of their JSON encoder; this is both that ``TypeError`` and the
    library's ``InvalidInputError``."""


def check_labels(labels: object, what: str) -> tuple[str, ...]:
    """A namespace (or prefix, or ``list_namespaces`` pattern) is a tuple of labels LangGraph
    accepts: non-empty str without ``.`` or NUL (its ``InvalidNamespaceError`` rules, which
    its SQL stores apply to every operation of a batch), and no lone surrogates, which
    storage cannot hold. A list is taken too, as LangGraph's SQL stores take ``search(["users"])``."""
    if not isinstance(labels, (tuple, list)):
        raise NamespaceLabelError(f"{what} must be a tuple of strings, got {labels!r}")
    for label in labels:  # one pass, cheap for ASCII: this runs for every operation
        if not isinstance(label, str):
            raise NamespaceLabelError(f"Invalid namespace label {label!r} found in {what} {labels!r}. "
                                      f"Namespace labels must be strings, but got {type(label).__name__}.")
        if not label:
            raise NamespaceLabelError(f"Namespace labels cannot be empty strings. Got {label!r} in {what} {labels!r}")
        if "." in label:
            raise NamespaceLabelError(f"Invalid namespace label {label!r} found in {what} {labels!r}. "
                                      "Namespace labels cannot contain periods ('.').")
        if "\x00" in label or not (label.isascii() or encodable(label)):
            raise NamespaceLabelError(f"Invalid namespace label {label!r} found in {what} {labels!r}. "
                                      "Namespace labels cannot contain NUL bytes ('\\x00') or lone surrogates.")
    return tuple(labels)


def check_item_namespace(namespace: object) -> tuple[str, ...]:
    """An item's namespace (a get, put or delete): :func:`check_labels`' rules, and not empty
    (LangGraph's ``put()`` refuses it, so no item is there)."""
    labels = check_labels(namespace, "namespace")
    if not labels:
        raise NamespaceLabelError("Namespace cannot be empty: an item's namespace has at least one label")
    return labels


def check_put_namespace(namespace: object) -> tuple[str, ...]:
    """A namespace ``put`` may write to: :func:`check_item_namespace`, and LangGraph's own rule
    for a put (not under its reserved root ``"langgraph"``), refused with its message as a
    :class:`NamespaceLabelError` (LangGraph's ``put`` raises its plain ``InvalidNamespaceError``)."""
    labels = check_item_namespace(namespace)
    if labels[0] == "langgraph":
        raise NamespaceLabelError(f'Root label for namespace cannot be "langgraph". Got: {labels}')
    return labels


def check_paths(paths: object, what: str) -> list[str]:
    """Paths of the text to index (``fields``, a put's ``index``): a list of non-empty path
    strings (``"$"`` is the whole value). A ``str`` is refused, where LangGraph's stores take
    its characters as paths (``"text"`` indexes ``t``, ``e``, ``x``: the item's text is never
    searched)."""
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)) or not all(
            isinstance(p, str) and p for p in paths):
        raise InvalidInputError(f"{what} must be a list of field paths such as ['text', 'tags[*]'] "
                                f"(['$'] for the whole value), got {paths!r}")
    return list(paths)


def _count(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{what} must be an int >= 0, got {value!r}")


def check_op(op: Op) -> None:
    """Refuse, with ``InvalidInputError``, an operation whose fields no store can run."""
    if not isinstance(op, (PutOp, GetOp, SearchOp, ListNamespacesOp)):
        raise InvalidInputError(f"unknown store operation {type(op).__name__}; use LangGraph's "
                                "GetOp, PutOp, SearchOp or ListNamespacesOp")
    if isinstance(op, (PutOp, GetOp)):
        check_item_namespace(op.namespace)
        if not isinstance(op.key, str) or not op.key or "\x00" in op.key or not encodable(op.key):
            raise InvalidInputError(f"an item key must be a non-empty string without NUL, got {op.key!r}")
    if isinstance(op, PutOp) and op.index is not None and op.index is not False:
        check_paths(op.index, "index (or False, or None for the store's fields)")
    if isinstance(op, PutOp) and op.value is not None:
        if not isinstance(op.value, Mapping):
            raise ItemValueError(f"an item value must be a dict (any Mapping), got {type(op.value).__name__}")
        try:  # the core's check, before anything in the batch runs; any Mapping is stored as a dict
            encode_json(dict(op.value), "item value")
        except InvalidInputError as e:
            raise ItemValueError(f"{e} (no sets, datetimes, NaN, non-string keys)") from e
    if isinstance(op, SearchOp):
        check_labels(op.namespace_prefix, "namespace prefix")
        if op.query is not None and (not isinstance(op.query, str) or not encodable(op.query)):
            raise InvalidInputError(f"a search query must be a str, got {op.query!r}")
        if op.filter is not None and not isinstance(op.filter, Mapping):
            raise InvalidInputError(f"a search filter must be a dict, got {type(op.filter).__name__}")
        _count(op.limit, "limit")
        _count(op.offset, "offset")
    if isinstance(op, ListNamespacesOp):
        for condition in op.match_conditions or ():
            if getattr(condition, "match_type", None) not in ("prefix", "suffix"):
                raise InvalidInputError(f"a namespace match must be 'prefix' or 'suffix', got {condition!r}")
            check_labels(condition.path, f"{condition.match_type} pattern")
        depth = op.max_depth  # LangGraph's stores slice with it: -1 dropped a label, 0 listed ()
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise InvalidInputError(f"max_depth must be an int >= 1 (or None for full depth), got {depth!r}")
        _count(op.limit, "limit")
        _count(op.offset, "offset")
    if isinstance(op, (GetOp, SearchOp)):  # BaseStore's get and search resolve None to the TTLConfig's
        check_flag(op.refresh_ttl, "refresh_ttl")


def check_ttl_config(ttl: TTLConfig | None) -> TTLConfig | None:
    """LangGraph's ``TTLConfig``, with its numbers and its flags (``refresh_on_read``, ``omit_expired``) checked."""
    if ttl is None:
        return None
    if not isinstance(ttl, dict):
        raise InvalidInputError(f"ttl must be a TTLConfig dict, got {type(ttl).__name__}")
    unknown = set(ttl) - {"refresh_on_read", "omit_expired", "default_ttl", "sweep_interval_minutes"}
    if unknown:
        raise InvalidInputError(f"unknown TTLConfig keys {sorted(unknown)}")
    check_ttl(ttl.get("default_ttl"), "TTLConfig default_ttl")
    check_ttl(ttl.get("sweep_interval_minutes"), "TTLConfig sweep_interval_minutes")
    for flag in ("refresh_on_read", "omit_expired"):
        if flag in ttl:
            check_flag(ttl[flag], f"TTLConfig {flag}")
    return ttl
