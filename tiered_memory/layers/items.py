"""Namespaced key-value items with hybrid search: the core side of the LangGraph store.

An *item* is a JSON object stored under a ``namespace`` (a tuple of labels) and a
``key``, owned by one ``user_id``. Items are not chat turns: they live in their own
table (``items``, added through the record store's ``migrate("items", ...)``, on
SQLite or PostgreSQL), never appear in turn recall or ``build_context``, and are
deleted with the user in the same transaction as the user's messages (like every
table with a ``user_id`` column).

An item may carry ``text`` (what to search it by). That text is indexed like a
turn: a keyword index next to the row (FTS5, or a PostgreSQL ``tsvector``), and a
vector in the shared vector index under ``item:<id>`` with layer ``"item"``, both
derived from the row and restored by :meth:`ItemStore.repair`. Search fuses vector, keyword and recency
ranks with the same weighted reciprocal-rank fusion as turn recall.

Items are not part of ``export_jsonl``/``import_jsonl`` (which carry messages) in
this version.

Filtering and namespace matching are pure functions (:func:`match_filter`,
:func:`match_namespace`) with table tests.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..embedding import embed, embed_query
from ..errors import InvalidInputError
from ..recall.query import keywords
from ..recall.scoring import recency_score, rrf_fuse
from ..parts import Parts
from ..store.layer_store import LayerStore
from ..store.postgres import TEXT_SEARCH_CONFIG
from ..validation import check_id, check_text
from ..vector.base import VectorIndex, VectorItem

SQLITE_ITEM_MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS items (
        rowid INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        ns_path TEXT NOT NULL,
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        text TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        UNIQUE (ns_path, key)
    );
    CREATE INDEX IF NOT EXISTS items_user ON items(user_id);
    CREATE VIRTUAL TABLE IF NOT EXISTS items_fts USING fts5(
        text, content='items', content_rowid='rowid', tokenize='porter unicode61'
    );
    CREATE TRIGGER IF NOT EXISTS items_ai AFTER INSERT ON items BEGIN
        INSERT INTO items_fts(rowid, text) VALUES (new.rowid, COALESCE(new.text, ''));
    END;
    CREATE TRIGGER IF NOT EXISTS items_ad AFTER DELETE ON items BEGIN
        INSERT INTO items_fts(items_fts, rowid, text) VALUES ('delete', old.rowid, COALESCE(old.text, ''));
    END;
    CREATE TRIGGER IF NOT EXISTS items_au AFTER UPDATE ON items BEGIN
        INSERT INTO items_fts(items_fts, rowid, text) VALUES ('delete', old.rowid, COALESCE(old.text, ''));
        INSERT INTO items_fts(rowid, text) VALUES (new.rowid, COALESCE(new.text, ''));
    END;
    """,
]

POSTGRES_ITEM_MIGRATIONS: list[str] = [
    f"""
    CREATE TABLE IF NOT EXISTS items (
        rowid BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        user_id TEXT NOT NULL,
        ns_path TEXT NOT NULL,
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        text TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}', COALESCE(text, ''))) STORED,
        UNIQUE (ns_path, key)
    );
    CREATE INDEX IF NOT EXISTS items_user ON items (user_id);
    CREATE INDEX IF NOT EXISTS items_tsv ON items USING GIN (tsv);
    """,
]

ITEM_MIGRATIONS = {"sqlite": SQLITE_ITEM_MIGRATIONS, "postgres": POSTGRES_ITEM_MIGRATIONS}

LAYER = "item"
_SEP = "\x1f"  # labels are stored as label + US, so a prefix of labels is a prefix of text


@dataclass(frozen=True, kw_only=True)
class Item:
    """One stored item. Times are epoch seconds."""

    id: str
    user_id: str
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    text: str | None
    created_at: float
    updated_at: float


@dataclass(frozen=True, kw_only=True)
class ItemHit:
    """A search result; ``score`` is ``None`` for items listed without ranking."""

    item: Item
    score: float | None
    explanation: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ItemWrite:
    """A put (``value`` set) or a delete (``value`` is ``None``) of one item."""

    namespace: tuple[str, ...]
    key: str
    user_id: str
    value: Mapping[str, Any] | None
    text: str | None = None


# ---- pure decisions ----------------------------------------------------------
def check_namespace(namespace: object, *, allow_empty: bool = False) -> tuple[str, ...]:
    """A namespace is a tuple of non-empty labels without control characters."""
    if not isinstance(namespace, (tuple, list)):
        raise InvalidInputError(f"namespace must be a tuple of str, got {type(namespace).__name__}")
    if not namespace and not allow_empty:
        raise InvalidInputError("namespace must have at least one label")
    for label in namespace:
        if not isinstance(label, str) or not label:
            raise InvalidInputError(f"namespace labels must be non-empty strings, got {label!r}")
        if any(ord(c) < 32 or ord(c) == 127 for c in label):
            raise InvalidInputError(f"namespace label {label!r} contains control characters")
    return tuple(namespace)


def ns_path(namespace: Sequence[str]) -> str:
    return "".join(label + _SEP for label in namespace)


def match_namespace(namespace: Sequence[str], pattern: Sequence[str], kind: str) -> bool:
    """``kind`` is ``"prefix"`` or ``"suffix"``; ``"*"`` in ``pattern`` matches any label."""
    if len(namespace) < len(pattern):
        return False
    if kind == "prefix":
        pairs = zip(namespace, pattern)
    elif kind == "suffix":
        pairs = zip(reversed(namespace), reversed(pattern))
    else:
        raise InvalidInputError(f"namespace match must be 'prefix' or 'suffix', got {kind!r}")
    return all(p == "*" or n == p for n, p in pairs)


_OPERATORS = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"}


def _compare(actual: Any, op: str, want: Any) -> bool:
    if op == "$eq":
        return bool(actual == want)
    if op == "$ne":
        return bool(actual != want)
    try:
        a, w = float(actual), float(want)
    except (TypeError, ValueError):
        return False
    if math.isnan(a) or math.isnan(w):
        return False
    return {"$gt": a > w, "$gte": a >= w, "$lt": a < w, "$lte": a <= w}[op]


def match_value(actual: Any, want: Any) -> bool:
    """JSONB-like matching: operators (``$eq`` ``$ne`` ``$gt`` ``$gte`` ``$lt`` ``$lte``),
    nested objects matched key by key, lists element by element, else equality."""
    if isinstance(want, Mapping):
        ops = [k for k in want if isinstance(k, str) and k.startswith("$")]
        if ops:
            unknown = set(ops) - _OPERATORS
            if unknown:
                raise InvalidInputError(f"unsupported filter operators {sorted(unknown)}")
            return all(_compare(actual, op, v) for op, v in want.items())
        return isinstance(actual, Mapping) and all(match_value(actual.get(k), v) for k, v in want.items())
    if isinstance(want, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(actual) == len(want)
                and all(match_value(a, w) for a, w in zip(actual, want)))
    return bool(actual == want)


def match_filter(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """True when ``value`` satisfies every condition of ``filter`` (``None`` matches all)."""
    return not filter or all(match_value(value.get(k), want) for k, want in filter.items())


def truncate_namespaces(namespaces: Sequence[tuple[str, ...]], max_depth: int | None) -> list[tuple[str, ...]]:
    """Distinct namespaces (cut to ``max_depth`` labels), sorted."""
    cut = {ns[:max_depth] if max_depth is not None else ns for ns in namespaces}
    return sorted(cut)


# ---- the shell -----------------------------------------------------------------
def _item(r: tuple[Any, ...]) -> Item:
    return Item(id=r[0], user_id=r[1], namespace=tuple(json.loads(r[2])), key=r[3],
                value=json.loads(r[4]), text=r[5], created_at=r[6], updated_at=r[7])


_COLS = "id, user_id, namespace, key, value, text, created_at, updated_at"


class ItemStore:
    """Items on the record store (SQLite or PostgreSQL) and vector index of a memory's parts.
    Get it with :meth:`TieredMemory.item_store`.

    Args:
        parts: the memory's :class:`~tiered_memory.parts.Parts`.
        db: the layer repositories of its record store.
    """

    def __init__(self, parts: Parts, db: LayerStore) -> None:
        self.parts = parts
        self.db = db  # ``?`` SQL and keyword search on SQLite or PostgreSQL
        db.migrate("items", ITEM_MIGRATIONS[db.dialect])

    @property
    def index(self) -> VectorIndex:
        return self.parts.index

    # ---- writes ------------------------------------------------------------
    def write_many(self, writes: Sequence[ItemWrite]) -> None:
        """Apply puts and deletes in order, in one transaction; texts embedded in one batch.

        For the same (namespace, key), the last write wins.
        """
        last: dict[tuple[tuple[str, ...], str], ItemWrite] = {}
        for w in writes:
            ns = check_namespace(w.namespace)
            check_id(w.user_id, "user_id")
            if not isinstance(w.key, str) or not w.key:
                raise InvalidInputError(f"item key must be a non-empty string, got {w.key!r}")
            if w.value is not None and not isinstance(w.value, Mapping):
                raise InvalidInputError(f"item value must be a mapping, got {type(w.value).__name__}")
            if w.text and w.text.strip():
                check_text(w.text, "item text")
            last[(ns, w.key)] = w
        if not last:
            return
        puts = [w for w in last.values() if w.value is not None]
        payload = {}
        for w in puts:
            try:
                payload[(tuple(w.namespace), w.key)] = json.dumps(w.value, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InvalidInputError(f"item value must be JSON-serialisable: {e}") from e
        with_text = [w for w in puts if w.text and w.text.strip()]
        vectors = embed(self.parts.embedder, [w.text for w in with_text]) if with_text else None  # type: ignore[misc]
        now = time.time()
        ids: dict[tuple[tuple[str, ...], str], str] = {}
        stale: list[str] = []
        with self.parts.lock, self.db.transaction() as c:
            for (ns, key), w in last.items():
                found = c.execute("SELECT id FROM items WHERE ns_path=? AND key=?",
                                  (ns_path(ns), key)).fetchone()
                if w.value is None:
                    if found:
                        c.execute("DELETE FROM items WHERE id=?", (found[0],))
                        stale.append(found[0])
                    continue
                item_id = found[0] if found else uuid.uuid4().hex
                ids[(ns, key)] = item_id
                text = w.text if w.text and w.text.strip() else None
                if found:
                    c.execute("UPDATE items SET user_id=?, value=?, text=?, updated_at=? WHERE id=?",
                              (w.user_id, payload[(ns, key)], text, now, item_id))
                    if text is None:
                        stale.append(item_id)
                else:
                    c.execute(
                        "INSERT INTO items (id, user_id, ns_path, namespace, key, value, text, created_at,"
                        " updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                        (item_id, w.user_id, ns_path(ns), json.dumps(list(ns), ensure_ascii=False), key,
                         payload[(ns, key)], text, now, now))
            # the rows are the truth; vectors follow (repair() restores them if this fails)
            self.index.delete([f"item:{i}" for i in stale])
            if vectors is not None:
                self.index.upsert([
                    VectorItem(id=f"item:{ids[(tuple(w.namespace), w.key)]}", vector=vectors[n],
                               user_id=w.user_id, layer=LAYER, timestamp=now)
                    for n, w in enumerate(with_text)])

    def repair(self) -> int:
        """Re-embed items whose vector is missing (after ``rebuild_index`` or a crash); drop
        vectors of items that no longer exist. Returns how many vectors were restored."""
        rows = self.db.query("SELECT id, user_id, text, updated_at FROM items WHERE text IS NOT NULL")
        want = {f"item:{r[0]}": r for r in rows}
        have = {i for i in self.index.ids() if i.startswith("item:")}
        self.index.delete(sorted(have - set(want)))
        todo = [want[i] for i in sorted(set(want) - have)]
        for start in range(0, len(todo), 256):
            part = todo[start:start + 256]
            vectors = embed(self.parts.embedder, [r[2] for r in part])
            self.index.upsert([VectorItem(id=f"item:{r[0]}", vector=vectors[n], user_id=r[1],
                                          layer=LAYER, timestamp=r[3]) for n, r in enumerate(part)])
        return len(todo)

    # ---- reads -------------------------------------------------------------
    def get(self, namespace: Sequence[str], key: str) -> Item | None:
        ns = check_namespace(tuple(namespace))
        rows = self.db.query(f"SELECT {_COLS} FROM items WHERE ns_path=? AND key=?", (ns_path(ns), key))
        return _item(rows[0]) if rows else None

    def _under(self, prefix: tuple[str, ...], ids: Sequence[str] | None = None) -> list[Item]:
        path = ns_path(prefix)
        sql = f"SELECT {_COLS} FROM items WHERE substr(ns_path, 1, ?) = ?"
        params: list[Any] = [len(path), path]
        if ids is not None:
            if not ids:
                return []
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            params += list(ids)
        return [_item(r) for r in self.db.query(sql + " ORDER BY updated_at DESC, rowid DESC", params)]

    def search(
        self, prefix: Sequence[str], *, query: str | None = None, user_id: str | None = None,
        filter: Mapping[str, Any] | None = None, limit: int = 10, offset: int = 0,
    ) -> list[ItemHit]:
        """Items under ``prefix`` that match ``filter``; ranked by hybrid recall for ``query``
        (which needs ``user_id``), else newest first. Unranked items fill a short page."""
        ns = check_namespace(tuple(prefix), allow_empty=True)
        if limit < 0 or offset < 0:
            raise InvalidInputError("limit and offset must be >= 0")
        if not query or not query.strip():
            listed = [i for i in self._under(ns) if match_filter(i.value, filter)]
            return [ItemHit(item=i, score=None) for i in listed[offset:offset + limit]]
        if user_id is None:
            raise InvalidInputError(
                "a search query needs the user: make the namespace prefix include the user id")
        check_id(user_id, "user_id")
        cfg = self.parts.config.retrieval
        n = max(cfg.candidates, (offset + limit) * 4)
        vec = self.index.query(embed_query(self.parts.embedder, query)[None, :], user_id=user_id,
                               k=n, layers=[LAYER])[0]
        terms = keywords(query)
        kw = self.db.keyword("items", user_id, terms, n) if terms else []
        vec = [(i.removeprefix("item:"), s) for i, s in vec]
        candidates = {i.id: i for i in self._under(ns, [i for i, _ in vec] + [i for i, _ in kw])
                      if i.user_id == user_id and match_filter(i.value, filter)}
        vec = [(i, s) for i, s in vec if i in candidates]
        kw = [(i, s) for i, s in kw if i in candidates]
        now = time.time()
        fused = rrf_fuse(
            {"vector": [i for i, _ in vec], "keyword": [i for i, _ in kw],
             "recency": sorted(candidates, key=lambda i: -candidates[i].updated_at)},
            {"vector": cfg.vector_weight, "keyword": cfg.keyword_weight, "recency": cfg.recency_weight},
            k=cfg.rrf_k,
            extras={"vector": dict(vec), "keyword": dict(kw),
                    "recency": {i: recency_score(c.updated_at, now, cfg.recency_half_life_days)
                                for i, c in candidates.items()}},
        )
        ranked = [ItemHit(item=candidates[f.id], score=f.score,
                          explanation={"method": "weighted reciprocal-rank fusion", "signals": f.parts})
                  for f in fused]
        if len(ranked) < offset + limit:  # like LangGraph's stores: fill with unranked items
            seen = set(candidates)
            ranked += [ItemHit(item=i, score=None) for i in self._under(ns)
                       if i.id not in seen and match_filter(i.value, filter)]
        return ranked[offset:offset + limit]

    def namespaces(
        self, *, conditions: Sequence[tuple[str, Sequence[str]]] = (), max_depth: int | None = None,
        limit: int = 100, offset: int = 0,
    ) -> list[tuple[str, ...]]:
        """Distinct namespaces matching every ``(kind, pattern)`` condition, sorted."""
        all_ns = [tuple(json.loads(r[0])) for r in self.db.query("SELECT DISTINCT namespace FROM items")]
        kept = [ns for ns in all_ns if all(match_namespace(ns, p, kind) for kind, p in conditions)]
        return truncate_namespaces(kept, max_depth)[offset:offset + limit]

    def count(self, user_id: str | None = None) -> int:
        sql, params = "SELECT COUNT(*) FROM items", []
        if user_id is not None:
            sql, params = sql + " WHERE user_id=?", [user_id]
        return int(self.db.query(sql, params)[0][0])
