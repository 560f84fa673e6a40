"""A LangGraph ``BaseStore`` backed by tiered-memory: the modern long-term memory path.

LangChain recommends ``create_agent(..., store=...)`` (and the ``store`` of LangGraph
graphs) for memory that outlives a thread. :class:`TieredMemoryStore` keeps those
items in the same folder as the conversation memory, in the core's item table
(:mod:`tiered_memory.layers.items`), and searches them with the core's hybrid recall
(vector + keyword + recency), using the memory's embedder: no separate
embedding or index configuration.

Users: every item belongs to the user whose id is at ``user_position`` in its
namespace (default ``0``: ``("u1", "memories")``). That id scopes semantic search
and ``TieredMemory.forget_user`` removes the user's items with everything else.

Indexing: ``fields`` (default ``["$"]``, the whole value as JSON) names what text to
search an item by, with LangGraph's path syntax (``"text"``, ``"notes[*].body"``);
``put(..., index=[...])`` overrides it per item and ``index=False`` stores an item
that only ``get`` and filters can find.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)
from langgraph.store.base.embed import get_text_at_path, tokenize_path

from tiered_memory import TieredMemory
from tiered_memory.errors import InvalidInputError
from tiered_memory.records import Item as CoreItem
from tiered_memory.layers.items import ItemStore, ItemWrite

__all__ = ["TieredMemoryStore"]


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _item(i: CoreItem) -> Item:
    return Item(value=i.value, key=i.key, namespace=i.namespace,
                created_at=_dt(i.created_at), updated_at=_dt(i.updated_at))


def item_text(value: dict[str, Any], fields: Sequence[str]) -> str | None:
    """The searchable text of ``value``: the texts at ``fields``, one per line (pure)."""
    texts: list[str] = []
    for f in fields:
        texts += get_text_at_path(value, f if f == "$" else tokenize_path(f))
    joined = "\n".join(t for t in texts if t and t.strip())
    return joined or None


class TieredMemoryStore(BaseStore):
    """LangGraph store over a :class:`~tiered_memory.TieredMemory`.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory` (on SQLite or PostgreSQL).
        user_position: which namespace label is the user id.
        fields: default paths of the text to index (``["$"]``: the whole value).

    Example:
        >>> store = TieredMemoryStore(memory, fields=["text"])  # doctest: +SKIP
        >>> store.put(("u1", "memories"), "tea", {"text": "Prefers green tea"})  # doctest: +SKIP
        >>> store.search(("u1", "memories"), query="what drink?")[0].key  # doctest: +SKIP
        'tea'
        >>> agent = create_agent(model, tools, store=store)  # doctest: +SKIP
    """

    def __init__(self, memory: TieredMemory, *, user_position: int = 0,
                 fields: Sequence[str] | None = None) -> None:
        if user_position < 0:
            raise InvalidInputError("user_position must be >= 0")
        self.memory = memory
        self.user_position = user_position
        self.fields = list(fields) if fields is not None else ["$"]
        self.items = memory.item_store()
        self._repaired = False

    def _user_of(self, namespace: tuple[str, ...]) -> str | None:
        return namespace[self.user_position] if len(namespace) > self.user_position else None

    def _ready(self) -> None:
        # restore item vectors dropped by rebuild_index() or a crash, once per store object
        if not self._repaired:
            self.items.repair()
            self._repaired = True

    # ---- ops -----------------------------------------------------------------
    def _writes(self, ops: Sequence[PutOp]) -> list[ItemWrite]:
        writes = []
        for op in ops:
            user = self._user_of(op.namespace)
            if user is None:
                raise InvalidNamespaceError(
                    f"namespace {op.namespace} has no label at user_position={self.user_position}; "
                    "put items under a namespace that includes the user id")
            text = None
            if op.value is not None and op.index is not False:
                text = item_text(dict(op.value), op.index if op.index is not None else self.fields)
            writes.append(ItemWrite(namespace=op.namespace, key=op.key, user_id=user,
                                    value=op.value, text=text))
        return writes

    def _search(self, op: SearchOp) -> list[SearchItem]:
        user = self._user_of(op.namespace_prefix)
        if op.query and user is None:
            raise InvalidNamespaceError(
                f"semantic search needs the user id in the namespace prefix (position "
                f"{self.user_position}); got {op.namespace_prefix}")
        hits = self.items.search(op.namespace_prefix, query=op.query, user_id=user,
                                 filter=op.filter, limit=op.limit, offset=op.offset)
        return [SearchItem(namespace=h.item.namespace, key=h.item.key, value=h.item.value,
                           created_at=_dt(h.item.created_at), updated_at=_dt(h.item.updated_at),
                           score=h.score) for h in hits]

    def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = [(c.match_type, tuple(c.path)) for c in op.match_conditions or ()]
        return self.items.namespaces(conditions=conditions, max_depth=op.max_depth,
                                     limit=op.limit, offset=op.offset)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order. Consecutive puts/deletes are written in one transaction
        with one embedding batch; reads see every write before them."""
        ops = list(ops)
        self._ready()
        results: list[Result] = [None] * len(ops)
        pending: list[PutOp] = []

        def flush() -> None:
            if pending:
                self.items.write_many(self._writes(pending))
                pending.clear()

        for n, op in enumerate(ops):
            if isinstance(op, PutOp):
                pending.append(op)
                continue
            flush()
            if isinstance(op, GetOp):
                found = self.items.get(op.namespace, op.key)
                results[n] = _item(found) if found else None
            elif isinstance(op, SearchOp):
                results[n] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[n] = self._list(op)
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        flush()
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))
