"""LangGraph's ``BaseStore`` whose every method refuses a bad namespace with
:class:`~.store_checks.NamespaceLabelError`.

``BaseStore.get``, ``search``, ``put``, ``delete``, ``list_namespaces`` and their async twins
check labels themselves before they call ``batch``, raising LangGraph's plain
``InvalidNamespaceError`` (a namespace that is no sequence, ``5``, escaped as iterating it:
a ``TypeError``). Each method here checks its namespace first with the rules ``batch`` applies
to every operation (:func:`~.store_checks.check_op`), LangGraph's rules and messages, so a
bad namespace is the same error, both LangGraph's and the library's, on every path, and
nothing runs.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from langgraph.store.base import NOT_PROVIDED, BaseStore, Item, NamespacePath, NotProvided, SearchItem

from .store_checks import check_item_namespace, check_labels, check_put_namespace

__all__ = ["NamespaceCheckedStore"]


def _check_patterns(prefix: object, suffix: object) -> None:
    # as BaseStore.list_namespaces reads them: an empty or None pattern is no condition
    check_labels(prefix or (), "prefix pattern")
    check_labels(suffix or (), "suffix pattern")


class NamespaceCheckedStore(BaseStore):
    """``BaseStore`` with its namespaces checked as ours; subclasses implement ``batch`` and
    ``abatch``, as for ``BaseStore``."""

    def get(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        check_item_namespace(namespace)
        return super().get(namespace, key, refresh_ttl=refresh_ttl)

    async def aget(self, namespace: tuple[str, ...], key: str, *, refresh_ttl: bool | None = None) -> Item | None:
        check_item_namespace(namespace)
        return await super().aget(namespace, key, refresh_ttl=refresh_ttl)

    def search(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None,
               filter: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
               refresh_ttl: bool | None = None) -> list[SearchItem]:
        check_labels(namespace_prefix, "namespace prefix")
        return super().search(namespace_prefix, query=query, filter=filter, limit=limit, offset=offset,
                              refresh_ttl=refresh_ttl)

    async def asearch(self, namespace_prefix: tuple[str, ...], /, *, query: str | None = None,
                      filter: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
                      refresh_ttl: bool | None = None) -> list[SearchItem]:
        check_labels(namespace_prefix, "namespace prefix")
        return await super().asearch(namespace_prefix, query=query, filter=filter, limit=limit, offset=offset,
                                     refresh_ttl=refresh_ttl)

    def put(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any],
            index: Literal[False] | list[str] | None = None, *, ttl: float | None | NotProvided = NOT_PROVIDED) -> None:
        check_put_namespace(namespace)
        super().put(namespace, key, value, index, ttl=ttl)

    async def aput(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any],
                   index: Literal[False] | list[str] | None = None, *,
                   ttl: float | None | NotProvided = NOT_PROVIDED) -> None:
        check_put_namespace(namespace)
        await super().aput(namespace, key, value, index, ttl=ttl)

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        check_item_namespace(namespace)
        super().delete(namespace, key)

    async def adelete(self, namespace: tuple[str, ...], key: str) -> None:
        check_item_namespace(namespace)
        await super().adelete(namespace, key)

    def list_namespaces(self, *, prefix: NamespacePath | None = None, suffix: NamespacePath | None = None,
                        max_depth: int | None = None, limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:
        _check_patterns(prefix, suffix)
        return super().list_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth, limit=limit, offset=offset)

    async def alist_namespaces(self, *, prefix: NamespacePath | None = None, suffix: NamespacePath | None = None,
                               max_depth: int | None = None, limit: int = 100,
                               offset: int = 0) -> list[tuple[str, ...]]:
        _check_patterns(prefix, suffix)
        return await super().alist_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth, limit=limit,
                                              offset=offset)
