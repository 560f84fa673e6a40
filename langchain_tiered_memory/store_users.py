"""Which user a LangGraph namespace belongs to: a namespace template with one ``"{user_id}"``
label (LangMem's ``("memories", "{user_id}")``), or a callable, as ``TieredMemoryStore``'s
``user_namespace`` takes it (pure)."""

from __future__ import annotations

from typing import Callable, Sequence, Union

from tiered_memory.errors import InvalidInputError
from .store_checks import check_labels

__all__ = ["USER_LABEL", "UserMapping", "check_template", "user_from_template"]

USER_LABEL = "{user_id}"

#: a namespace template with one ``"{user_id}"`` label, or ``(namespace, key) -> user_id | None``
UserMapping = Union[Sequence[str], Callable[[tuple[str, ...], "str | None"], "str | None"]]


def check_template(template: object) -> tuple[str, ...]:
    """A user template: labels as LangGraph takes them in a namespace (a template no namespace
    can match, a label with ``.`` say, is refused), exactly one of them ``"{user_id}"``."""
    labels = check_labels(template, "user_namespace")
    if labels.count(USER_LABEL) != 1:
        raise InvalidInputError(
            f"user_namespace {labels} must have exactly one {USER_LABEL!r} label, "
            "for example ('memories', '{user_id}')")
    return labels


def user_from_template(template: Sequence[str], namespace: Sequence[str]) -> str | None:
    """The user ``namespace`` belongs to under ``template`` (pure): the label in place of
    ``{user_id}``, when the namespace reaches it and every other label it has matches."""
    at = list(template).index(USER_LABEL)
    if len(namespace) <= at:
        return None
    if any(t != USER_LABEL and t != n for t, n in zip(template, namespace)):
        return None
    return namespace[at]
