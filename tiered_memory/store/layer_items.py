"""The items' reads on a SQL record store (the LangGraph store's rows): one item, the items under
a namespace prefix, a page of the listing, and what the TTL sweep and the inspection read.

:class:`LayerItems` is the part of :class:`~.layer_store.LayerStore` that reads ``items``, in the
same portable SQL; the dialect's ``query`` and ``keyword`` are the store's.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..records import Item
from .item_filter_sql import item_filter_sql
from .layer_codec import (ITEM_COLS, id_batches, item_from_row, items_lateral_sql, items_merged_sql, items_page_sql,
                          items_recent_sql, items_under_sql, live, marks, namespace_of, namespaces_below_sql, ns_path)
from .repositories import ItemCursor, Scored

#: most ids one ``IN (...)`` list holds: under SQLite's 32,766 and PostgreSQL's 65,535 bound parameters
IN_LIST_MAX = 30_000
#: most namespaces below a prefix whose pages a listing page merges (:meth:`LayerItems._deeper_page`):
#: a merged page seeks each (and SQLite's compound SELECT holds 500 parts at most)
MERGED_MAX = 100


def recent_scans(limit: int) -> tuple[int, int]:
    """How many of the newest rows a listing page reads, twice, before it sorts a prefix's range
    (pure): few for a prefix holding most items, then enough for one holding a small share; the
    second is a few milliseconds at most, against the hundreds a sort of 100,000 rows takes."""
    return min(max(8 * limit, 50), 20_000), min(max(64 * limit, 1000), 20_000)


def merged_at_once(limit: int) -> int:
    """How many namespaces below a prefix a listing page of ``limit`` merges without reading the
    newest rows first (pure): a namespace costs a merged page a seek, about what four of the
    newest rows cost their first read (:func:`recent_scans`; bench/item_listing.py)."""
    return recent_scans(limit)[0] // 4


class LayerItems:
    """The ``items`` reads of :class:`~.layer_store.LayerStore`, which binds the dialect."""

    dialect = ""
    #: whether a listing page merges the pages of the few namespaces below its prefix
    #: (:meth:`_deeper_page`) rather than read their range: SQLite keeps no range statistics and
    #: sorted the range; PostgreSQL read the whole range past a cursor for each page
    merges_namespaces = False
    #: whether they are merged as PostgreSQL plans it well (:func:`.items_lateral_sql`: its planner
    #: read the compound statement as an Append of every namespace's rows and a sort): a seek and
    #: up to ``limit`` rows a namespace, sorted. So it merges after the newest rows, which read
    #: fewer (a search's pages with an offset: 2.5 times faster), and only pages every row of which
    #: counts: a filter's few rows, spread, left each namespace read to its end, where the range's
    #: read of the newest rows first stops at the page (2-5 times faster; bench/item_listing.py)
    lateral_merge = False
    #: whether a GIN index of the values serves a filter's equalities said as containments
    #: (:func:`.item_filter_sql.contained`; PostgreSQL's ``items_value``): a page of an equality that
    #: keeps few rows read and parsed every row of the range (300 ms at 100,000 items)
    value_index = False

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def keyword(self, table: str, user_id: str, terms: Sequence[str], k: int, extra: str = "") -> Scored:
        raise NotImplementedError

    def _owners(self, table: str, ids: Sequence[str], key: str = "id") -> dict[str, str]:
        raise NotImplementedError

    # ---- items -----------------------------------------------------------------------
    def item(self, namespace: Sequence[str], key: str, live_at: float | None = None) -> Item | None:
        sql, params = live(f"SELECT {ITEM_COLS} FROM items WHERE ns_path=? AND key=?",
                           [ns_path(namespace), key], live_at)
        rows = self.query(sql, params)
        return item_from_row(rows[0]) if rows else None

    def items_under(self, prefix: Sequence[str], ids: Sequence[str] | None = None,
                    live_at: float | None = None, filter: Mapping[str, Any] | None = None) -> list[Item]:
        sql, params = items_under_sql(prefix, dialect=self.dialect)
        wanted: set[str] | None = None
        if ids is not None:
            if not ids:
                return []
            if len(ids) <= IN_LIST_MAX:
                sql += f" AND id IN ({marks(len(ids))})"
                params += list(ids)
            else:  # more than one statement's parameters may hold: the prefix's items, kept by id
                wanted = set(ids)
        where, args, _ = item_filter_sql(filter, self.dialect, self.value_index)
        sql, params = live(sql + where, [*params, *args], live_at)
        found = [item_from_row(r) for r in self.query(sql + " ORDER BY updated_at DESC, rowid DESC", params)]
        return found if wanted is None else [i for i in found if i.id in wanted]

    def items_page(self, prefix: Sequence[str], limit: int, after: ItemCursor | None = None,
                   live_at: float | None = None, filter: Mapping[str, Any] | None = None,
                   user_id: str | None = None) -> list[tuple[Item, ItemCursor]]:
        sql, params, _ = item_filter_sql(filter, self.dialect, self.value_index)
        if user_id is not None:
            sql, params = sql + " AND user_id = ?", [*params, user_id]
        if not prefix:  # every namespace: items_recent's order, no sort
            rows = self.query(*items_page_sql((), limit, after, live_at, self.dialect, (sql, params)))
        else:  # the namespace itself in items_listing's order (no sort), merged with those below it
            rows = [*self.query(*items_page_sql(prefix, limit, after, live_at, self.dialect, (sql, params), "exact")),
                    *self._deeper_page(prefix, limit, after, live_at, (sql, params))]
            rows.sort(key=lambda r: (float(r[-2]), int(r[-1])), reverse=True)
        return [(item_from_row(r), (float(r[-2]), int(r[-1]))) for r in rows[:limit]]

    def _deeper_page(self, prefix: Sequence[str], limit: int, after: ItemCursor | None, live_at: float | None,
                     where: tuple[str, list[Any]]) -> list[tuple[Any, ...]]:
        """The page of the namespaces below ``prefix``. SQLite keeps no range statistics: their
        range of items_listing, sorted for each page, was 84 ms at 100,000 rows (bench/item_listing.py),
        and the newest rows, read first, serve only the first pages of a prefix holding most of them.
        Below few namespaces (found by a seek each, :func:`merged_at_once`), their pages are merged
        (:func:`.items_merged_sql`): a seek each, wherever the page lies, whatever the filter or the
        rows' age. Below more, the newest rows are read first, then the pages merged while they
        are at most :data:`MERGED_MAX`, else the range read (:meth:`_range_page`). PostgreSQL reads
        the newest rows first below any number, and a filtered page from the range
        (:attr:`lateral_merge`)."""
        scans: Sequence[int] = recent_scans(limit)
        if not self.merges_namespaces or (self.lateral_merge and where[0]):
            return self._range_page(prefix, limit, after, live_at, where, scans)
        few = 0 if self.lateral_merge else merged_at_once(limit)
        paths = self._paths_below(prefix, few + 1)
        if not paths:
            return []
        if len(paths) > few:
            rows = self.query(*items_recent_sql(prefix, limit, after, live_at, self.dialect, where, scans[0]))
            if len(rows) >= limit:
                return rows
            paths, scans = self._paths_below(prefix, MERGED_MAX + 1), scans[1:]
        if len(paths) <= MERGED_MAX and len(paths) * (len(where[1]) + 8) <= IN_LIST_MAX:  # the parameters
            return self.query(*(items_lateral_sql(paths, limit, after, live_at) if self.lateral_merge
                                else items_merged_sql(paths, limit, after, live_at, self.dialect, where)))
        return self._range_page(prefix, limit, after, live_at, where, scans)

    def _range_page(self, prefix: Sequence[str], limit: int, after: ItemCursor | None, live_at: float | None,
                    where: tuple[str, list[Any]], scans: Sequence[int]) -> list[tuple[Any, ...]]:
        """The page of the namespaces below ``prefix`` read from the newest rows (``scans`` of
        them in turn, :func:`.items_recent_sql`) while the range holds more rows than the last,
        else from their range of items_listing, sorted unless the planner knows better."""
        range_sql, range_params = items_under_sql(prefix, "1", self.dialect, "deeper")
        held = int(self.query(f"SELECT count(*) FROM ({range_sql} LIMIT ?) AS deeper",
                              [*range_params, scans[-1]])[0][0])
        for scan in scans if held >= scans[-1] else ():
            rows = self.query(*items_recent_sql(prefix, limit, after, live_at, self.dialect, where, scan))
            if len(rows) >= limit:
                return rows
        return self.query(*items_page_sql(prefix, limit, after, live_at, self.dialect, where, "deeper"))

    def _paths_below(self, prefix: Sequence[str], most: int) -> list[str]:
        return [str(r[0]) for r in self.query(*namespaces_below_sql(prefix, most, self.dialect))]

    def item_rows(self, user_id: str | None, live_at: float | None = None
                  ) -> list[tuple[Item, float | None, float | None]]:
        sql, params = f"SELECT {ITEM_COLS}, ttl_minutes, expires_at FROM items WHERE 1=1", []
        if user_id is not None:
            sql, params = sql + " AND user_id=?", [user_id]
        sql, params = live(sql, params, live_at)
        return [(item_from_row(r), r[-2], r[-1]) for r in self.query(sql + " ORDER BY rowid", params)]

    def item_owners(self, ids: Sequence[str]) -> dict[str, str]:
        return self._owners("items", ids)

    def items_with_text(self) -> list[Item]:
        return [item_from_row(r) for r in self.query(f"SELECT {ITEM_COLS} FROM items WHERE text IS NOT NULL")]

    def item_namespaces(self, live_at: float | None = None, *, with_keys: bool = False
                        ) -> list[tuple[tuple[str, ...], str | None, str]]:
        columns = "namespace, user_id, key" if with_keys else "namespace, user_id"
        sql, params = live(f"SELECT DISTINCT {columns} FROM items WHERE 1=1", [], live_at)
        return [(namespace_of(r[0], "items", r[1]), r[2] if with_keys else None, str(r[1]))
                for r in self.query(sql, params)]

    def expired_items(self, now: float) -> list[str]:
        return [str(r[0]) for r in self.query(
            "SELECT id FROM items WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))]

    def expiring_items(self, ids: Sequence[str]) -> list[str]:
        return [str(r[0]) for part in id_batches(sorted(set(ids))) for r in self.query(
            f"SELECT id FROM items WHERE ttl_minutes IS NOT NULL AND id IN ({marks(len(part))})", part)]

    def count_items(self, user_id: str | None = None) -> int:
        sql, params = "SELECT COUNT(*) FROM items", []
        if user_id is not None:
            sql, params = sql + " WHERE user_id=?", [user_id]
        return int(self.query(sql, params)[0][0])

    def keyword_items(self, user_id: str, terms: Sequence[str], k: int) -> Scored:
        return self.keyword("items", user_id, terms, k) if terms else []
