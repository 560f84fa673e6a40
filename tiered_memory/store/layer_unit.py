"""The unit of work of the SQL layer repositories: every layer write, written once.

A :class:`LayerUnit` wraps one open transaction (a connection whose ``execute`` takes
``?`` placeholders, on SQLite or PostgreSQL) and implements
:class:`~.repositories.LayerWrites`: domain writes only, plus the few reads a write
decides on, inside the same transaction. It never outlives the ``with`` block of
:meth:`~.layer_store.LayerStore.unit` that made it, and never hands the connection out.
Where many rows are touched, ids are sorted first: one lock order for every worker, so
concurrent writers cannot deadlock.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from ..records import ArchivedTurn, Episode, Fact, FactChange, Item, SessionPad, WorkingItem
from .layer_codec import (
    ARCHIVE_COLS,
    EPISODE_COLS,
    FACT_COLS,
    ITEM_COLS,
    PAD_COLS,
    WORKING_COLS,
    archived_to_row,
    dumps,
    episode_from_row,
    episode_to_row,
    fact_from_row,
    fact_to_row,
    id_batches,
    live,
    marks,
    ns_path,
    to_blob,
    working_from_row,
    working_to_row,
)
from ..slots import stated_slot
from .base import pend_duplicates
from .pending_deletes import OwedVector, entries, owe_in
from .stored_values import count, json_dict, json_list, strings

#: The layer migration that marks a fact or an episode whose vectors are not yet written, as a
#: turn's ``indexed`` does: set false by the unit that stores the row (or changes a fact's text),
#: true once the vectors are in the index (``LayerStore.settle_facts``, ``settle_episodes``).
#: Rows stored before it count as indexed.
#: The partial indexes keep the start-up look for pending rows cheap on a store of any size.
PENDING_VECTORS = """
    ALTER TABLE facts ADD COLUMN indexed BOOLEAN NOT NULL DEFAULT TRUE;
    ALTER TABLE episodes ADD COLUMN indexed BOOLEAN NOT NULL DEFAULT TRUE;
    CREATE INDEX IF NOT EXISTS facts_pending ON facts (rowid) WHERE NOT indexed;
    CREATE INDEX IF NOT EXISTS episodes_pending ON episodes (rowid) WHERE NOT indexed;
"""

#: The layer migration for ``LayerStore.facts_in_slot``, which resolution asks for each fact of a
#: slot it writes: the valid facts of a user's slot, whatever the user's other facts (partial:
#: invalidated facts, most of a slot's rows over time, are left out). Beside PENDING_VECTORS and
#: :func:`fill_slots`, the other migrations both dialects share.
SLOT_INDEX = ("CREATE INDEX IF NOT EXISTS facts_slot ON facts (user_id, key)"
              " WHERE deleted_at IS NULL AND invalid_at IS NULL")


def fill_slots(c: Any) -> None:
    """The layer migration that puts each valid fact stored without a key in the slot its words
    name (:func:`~tiered_memory.slots.stated_slot`), as every write of a fact's text has stored
    it since: a judge's rewrite of a fact of no slot into "User lives in Paris" (an update kept
    the key, none), the model's and an application's facts from before they were given slots.
    ``LayerStore.facts_in_slot`` reads a slot by key, so the next fact of the slot now replaces
    them however many facts are nearer to its words. ``c`` takes ``?`` placeholders (a text
    another writer left undecodable is read leniently there, as SQLite's transactions read).
    Invalid facts, history, are left as they were written."""
    found = c.execute("SELECT rowid, text FROM facts WHERE key IS NULL AND deleted_at IS NULL"
                      " AND invalid_at IS NULL").fetchall()
    slots = [(*slot, rowid) for rowid, said in found if (slot := stated_slot(str(said))) is not None]
    if slots:
        c.executemany("UPDATE facts SET key=?, polarity=? WHERE rowid=?", slots)


SESSION_WORKING = (f"SELECT {WORKING_COLS} FROM working_items WHERE user_id=? AND session_id=? AND deleted_at IS NULL"
                   " ORDER BY created_at")  # a session's live working items, oldest first


class Dialect(Protocol):
    """What a unit needs of its repository's dialect."""

    greatest: str
    message_order: str
    row_lock: str

    def lock_session(self, c: Any, user_id: str, session_id: str) -> None: ...


class LayerUnit:
    """Domain writes inside one transaction of a SQL layer repository."""

    def __init__(self, dialect: Dialect, c: Any) -> None:
        self._dialect = dialect
        self._c = c

    def _run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._c.execute(sql, params)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._c.executemany(sql, rows)

    # ---- what the vector index owes (pending_deletes.py) ---------------------------------
    def owe_vectors(self, user_id: str, *, turns: Sequence[str] = (),
                    vectors: Sequence[str] = ()) -> list[OwedVector]:
        owed = entries(user_id, turns=turns, vectors=vectors)
        owe_in(self._c, owed, time.time())
        return owed

    # ---- audit ---------------------------------------------------------------------
    def audit(self, user_id: str, layer: str, item_id: str, action: str, details: Mapping[str, Any],
              at: float) -> None:
        self._run("INSERT INTO audit_log (user_id, layer, item_id, action, at, details) VALUES (?,?,?,?,?,?)",
                  (user_id, layer, item_id, action, at, dumps(dict(details))))

    # ---- facts ---------------------------------------------------------------------
    def insert_fact(self, fact: Fact, vector: np.ndarray | None) -> None:
        # pending (its vector to write) unless invalid: an invalid fact has none
        self._run(f"INSERT INTO facts ({FACT_COLS}, vector, indexed) VALUES ({marks(18)})",
                  (*fact_to_row(fact), to_blob(vector), fact.invalid_at is not None))

    def revise_fact(self, user_id: str, fact_id: str, *, text: str, confidence: float, source_ids: Sequence[str],
                    metadata: Mapping[str, Any], updated_at: float, vector: np.ndarray, key: str | None,
                    polarity: int) -> None:
        self._run("UPDATE facts SET text=?, confidence=?, source_ids=?, metadata=?, updated_at=?, vector=?,"
                  " indexed=FALSE, key=?, polarity=? WHERE user_id=? AND id=?",
                  (text, confidence, dumps(list(source_ids)), dumps(dict(metadata)), updated_at, to_blob(vector),
                   key, polarity, user_id, fact_id))

    def edit_fact(self, user_id: str, fact_id: str, *, text: str, type: str, confidence: float,
                  metadata: Mapping[str, Any], key: str | None, polarity: int, updated_at: float,
                  vector: np.ndarray | None) -> None:
        keep_vector = vector is None
        self._run("UPDATE facts SET text=?, type=?, confidence=?, metadata=?, key=?, polarity=?, updated_at=?"
                  + ("" if keep_vector else ", vector=?, indexed=FALSE") + " WHERE user_id=? AND id=?",
                  (text, type, confidence, dumps(dict(metadata)), key, polarity, updated_at,
                   *([] if keep_vector else [to_blob(vector)]), user_id, fact_id))

    def invalidate_fact(self, user_id: str, fact_id: str, *, at: float, superseded_by: str,
                        updated_at: float) -> None:
        self._run("UPDATE facts SET invalid_at=?, superseded_by=?, updated_at=? WHERE user_id=? AND id=?",
                  (at, superseded_by, updated_at, user_id, fact_id))

    def absorb_facts(self, fact_id: str, *, source_ids: Sequence[str], access_count: int,
                     last_access: float | None, updated_at: float, metadata: Mapping[str, Any] | None = None,
                     confidence: float | None = None) -> None:
        # the later of the two last accesses, in the UPDATE: an access flushed since the read counts
        self._run("UPDATE facts SET source_ids=?, access_count=access_count+?, updated_at=?,"
                  " last_access=CASE WHEN last_access IS NULL OR last_access < ? THEN COALESCE(?, last_access)"
                  " ELSE last_access END" + ("" if metadata is None else ", metadata=?")
                  + ("" if confidence is None else ", confidence=?") + " WHERE id=?",
                  (dumps(list(source_ids)), access_count, updated_at, last_access, last_access,
                   *([] if metadata is None else [dumps(dict(metadata))]),
                   *([] if confidence is None else [confidence]), fact_id))

    def held_facts(self, user_id: str, ids: Sequence[str]) -> list[Fact]:
        # in id order: one lock order for every worker (PostgreSQL locks each row it returns)
        found = self._run(f"SELECT {FACT_COLS} FROM facts WHERE user_id=? AND deleted_at IS NULL"
                          f" AND id IN ({marks(len(ids))}) ORDER BY id{self._dialect.row_lock}",
                          [user_id, *ids]).fetchall() if ids else []
        return [fact_from_row(r) for r in found]

    def delete_fact(self, user_id: str, fact_id: str) -> None:
        self._run("DELETE FROM facts WHERE user_id=? AND id=?", (user_id, fact_id))

    def soft_delete_fact(self, user_id: str, fact_id: str, at: float) -> str | None:
        old = self._run("SELECT text FROM facts WHERE user_id=? AND id=? AND deleted_at IS NULL",
                        (user_id, fact_id)).fetchone()
        # the UPDATE decides, not the SELECT: a worker that hid it meanwhile leaves nothing to hide (and log)
        if old is None or not self._run("UPDATE facts SET deleted_at=? WHERE user_id=? AND id=? AND deleted_at IS NULL",
                                        (at, user_id, fact_id)).rowcount:
            return None
        return str(old[0])

    def record_history(self, user_id: str, change: FactChange) -> None:
        self._run("INSERT INTO fact_history (fact_id, user_id, action, old_text, new_text, at, details)"
                  " VALUES (?,?,?,?,?,?,?)", (change.fact_id, user_id, change.action, change.old_text,
                                              change.new_text, change.at, dumps(change.details)))

    def set_fact_vectors(self, vectors: Sequence[tuple[str, np.ndarray]]) -> None:
        self._many("UPDATE facts SET vector=? WHERE id=?", [(to_blob(v), i) for i, v in vectors])

    def touch_facts(self, user_id: str, ids: Sequence[str], now: float) -> None:
        self._many("UPDATE facts SET access_count=access_count+1, last_access=? WHERE user_id=? AND id=?",
                   [(now, user_id, i) for i in sorted(ids)])

    # ---- episodes and sessions -----------------------------------------------------------
    def lock_session(self, user_id: str, session_id: str) -> None:
        self._dialect.lock_session(self._c, user_id, session_id)

    def cursor(self, user_id: str, session_id: str) -> int:
        found = self._run("SELECT last_seq FROM session_cursor WHERE user_id=? AND session_id=?",
                          (user_id, session_id)).fetchone()
        return count(found[0], "session_cursor", session_id, "last_seq") if found else 0

    def latest_episode(self, user_id: str, session_id: str) -> Episode | None:
        found = self._run(f"SELECT {EPISODE_COLS} FROM episodes WHERE user_id=? AND session_id=?"
                          " ORDER BY end_ts DESC, rowid DESC LIMIT 1", (user_id, session_id)).fetchone()
        return episode_from_row(found) if found else None

    def insert_episode(self, episode: Episode, points: Sequence[tuple[str, str]]) -> None:
        self._run(f"INSERT INTO episodes ({EPISODE_COLS}, indexed) VALUES ({marks(15)}, FALSE)",
                  episode_to_row(episode))
        self._many("INSERT INTO episode_points (id, episode_id, user_id, text) VALUES (?,?,?,?)",
                   [(pid, episode.id, episode.user_id, text) for pid, text in points])

    def delete_episode(self, user_id: str, episode_id: str) -> list[str] | None:
        found = self._run("SELECT session_id FROM episodes WHERE user_id=? AND id=?", (user_id, episode_id)).fetchone()
        if found is None:
            return None
        session_id = found[0]
        self.lock_session(user_id, session_id)  # an end_session of another worker saves after the release
        points = [str(r[0]) for r in self._run("SELECT id FROM episode_points WHERE user_id=? AND episode_id=?",
                                               (user_id, episode_id)).fetchall()]
        self._run("DELETE FROM episode_points WHERE user_id=? AND episode_id=?", (user_id, episode_id))
        self._run("DELETE FROM episodes WHERE user_id=? AND id=?", (user_id, episode_id))
        self.release_cursor(user_id, session_id)
        return points

    def release_cursor(self, user_id: str, session_id: str) -> None:
        """Move the session's coverage cursor back to the last live turn one of its episodes
        cites (0: none), never forward: the turns after it are uncovered again. Turns an episode
        cites are a prefix of those the cursor covers, so a deleted episode's turns are released
        when no later episode of the session stands (one that does keeps them covered)."""
        cited = sorted({i for r in self._run("SELECT id, source_ids FROM episodes WHERE user_id=? AND session_id=?",
                                             (user_id, session_id)).fetchall()
                        for i in strings(json_list(r[1], "episodes", r[0], "source_ids"), "episodes", r[0],
                                         "source_ids")})
        last = 0
        order = self._dialect.message_order
        for part in id_batches(cited):
            found = self._run(f"SELECT MAX({order}) FROM messages WHERE user_id=? AND session_id=?"
                              f" AND id IN ({marks(len(part))})", [user_id, session_id, *part]).fetchone()
            if found is not None and found[0] is not None:  # NULL: none of them is live
                last = max(last, count(found[0], "messages", session_id, order))
        self._run("UPDATE session_cursor SET last_seq=? WHERE user_id=? AND session_id=? AND last_seq > ?",
                  (last, user_id, session_id, last))

    def advance_cursor(self, user_id: str, session_id: str, seq: int) -> None:
        self._run("INSERT INTO session_cursor (user_id, session_id, last_seq) VALUES (?,?,?)"
                  " ON CONFLICT (user_id, session_id) DO UPDATE"
                  f" SET last_seq={self._dialect.greatest}(session_cursor.last_seq, excluded.last_seq)",
                  (user_id, session_id, seq))

    def mark_promoted(self, episode_id: str, at: float) -> bool:
        return bool(self._run("UPDATE episodes SET promoted_at=? WHERE id=? AND promoted_at IS NULL",
                              (at, episode_id)).rowcount > 0)

    def mark_compressed(self, episode_id: str, at: float) -> bool:
        return bool(self._run("UPDATE episodes SET compressed_at=? WHERE id=? AND compressed_at IS NULL",
                              (at, episode_id)).rowcount > 0)

    def archive_messages(self, user_id: str, ids: Sequence[str], episode_id: str, at: float, *,
                         delete: bool) -> int:
        moved = 0
        for part in id_batches(ids):
            if not delete:
                self._run(
                    "INSERT INTO messages_archive (id, user_id, session_id, role, content, metadata,"
                    " timestamp, episode_id, archived_at) SELECT id, user_id, session_id, role, content, metadata,"
                    f" timestamp, ?, ? FROM messages WHERE user_id=? AND id IN ({marks(len(part))})"
                    " ON CONFLICT DO NOTHING", [episode_id, at, user_id, *part])
            self._run(pend_duplicates(marks(len(part))), [user_id, *part])  # their duplicates pending
            self.owe_vectors(user_id, turns=[str(r[0]) for r in self._run(
                f"SELECT id FROM messages WHERE user_id=? AND id IN ({marks(len(part))})", [user_id, *part]).fetchall()])
            moved += self._run(f"DELETE FROM messages WHERE user_id=? AND id IN ({marks(len(part))})",
                               [user_id, *part]).rowcount
        return moved

    def restore_archived(self, turns: Sequence[ArchivedTurn]) -> int:
        return sum(self._run(f"INSERT INTO messages_archive ({ARCHIVE_COLS}) VALUES ({marks(9)})"
                             " ON CONFLICT DO NOTHING", archived_to_row(t)).rowcount for t in turns)

    def forget_archived(self, user_id: str, *, ids: Sequence[str] = (), session_id: str | None = None) -> int:
        if session_id is not None:
            return int(self._run("DELETE FROM messages_archive WHERE user_id=? AND session_id=?",
                                 (user_id, session_id)).rowcount)
        gone = 0
        for part in id_batches(ids):
            gone += self._run(f"DELETE FROM messages_archive WHERE user_id=? AND id IN ({marks(len(part))})",
                              [user_id, *part]).rowcount
        return gone

    def touch_episodes(self, user_id: str, ids: Sequence[str], now: float) -> None:
        self._many("UPDATE episodes SET access_count=access_count+1, last_access=? WHERE user_id=? AND id=?",
                   [(now, user_id, i) for i in sorted(ids)])

    # ---- working memory -----------------------------------------------------------------
    def working_items(self, user_id: str, session_id: str) -> list[WorkingItem]:
        return [working_from_row(r) for r in self._run(SESSION_WORKING, (user_id, session_id)).fetchall()]

    def insert_working_item(self, item: WorkingItem, vector: np.ndarray | None) -> None:
        self._run(f"INSERT INTO working_items ({WORKING_COLS}, vector) VALUES ({marks(10)})",
                  (*working_to_row(item), to_blob(vector)))

    def set_working_vectors(self, vectors: Sequence[tuple[str, np.ndarray]]) -> None:
        self._many("UPDATE working_items SET vector=? WHERE id=? AND deleted_at IS NULL",
                   [(to_blob(v), i) for i, v in sorted(vectors, key=lambda p: p[0])])

    def evict_working_item(self, item_id: str) -> bool:
        return bool(self._run("DELETE FROM working_items WHERE id=? AND deleted_at IS NULL", (item_id,)).rowcount > 0)

    def retire_working_item(self, item_id: str, at: float) -> bool:
        return bool(self._run("UPDATE working_items SET deleted_at=? WHERE id=? AND deleted_at IS NULL",
                              (at, item_id)).rowcount > 0)

    def forget_working_item(self, user_id: str, session_id: str, item_id: str) -> bool:
        return bool(self._run("DELETE FROM working_items WHERE user_id=? AND session_id=? AND id=?",
                              (user_id, session_id, item_id)).rowcount > 0)

    def clear_working(self, user_id: str, session_id: str) -> int:
        self._run("DELETE FROM scratchpads WHERE user_id=? AND session_id=?", (user_id, session_id))
        return int(self._run("DELETE FROM working_items WHERE user_id=? AND session_id=?",
                             (user_id, session_id)).rowcount)

    def scratchpad(self, user_id: str, session_id: str) -> dict[str, Any]:
        found = self._run("SELECT data FROM scratchpads WHERE user_id=? AND session_id=?",
                          (user_id, session_id)).fetchone()
        return json_dict(found[0], "scratchpads", session_id, "data") if found else {}

    def save_scratchpad(self, user_id: str, session_id: str, data: Mapping[str, Any], at: float) -> None:
        self._run("INSERT INTO scratchpads VALUES (?,?,?,?) ON CONFLICT(user_id, session_id) DO UPDATE"
                  " SET data=excluded.data, updated_at=excluded.updated_at",
                  (user_id, session_id, dumps(dict(data)), at))

    def restore_scratchpad(self, pad: SessionPad) -> bool:
        return bool(self._run(f"INSERT INTO scratchpads ({PAD_COLS}) VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
                              (pad.user_id, pad.session_id, dumps(pad.data), pad.updated_at)).rowcount > 0)

    def touch_working(self, user_id: str, ids: Sequence[str], now: float) -> None:
        self._many("UPDATE working_items SET access_count=access_count+1 WHERE user_id=? AND id=?",
                   [(user_id, i) for i in sorted(ids)])

    # ---- items -----------------------------------------------------------------------------
    def item_id(self, namespace: Sequence[str], key: str, live_at: float | None = None) -> str | None:
        sql, params = live("SELECT id FROM items WHERE ns_path=? AND key=?", [ns_path(namespace), key], live_at)
        found = self._run(sql, params).fetchone()
        return str(found[0]) if found else None

    def insert_item(self, item: Item, *, ttl_minutes: float | None = None, expires_at: float | None = None) -> str:
        # another worker may insert the same namespace and key between item_id() and here: then
        # its row is updated, as a put is an upsert, and that row's id is returned
        row = self._run(
            f"INSERT INTO items (ns_path, {ITEM_COLS}, ttl_minutes, expires_at) VALUES ({marks(11)})"
            " ON CONFLICT (ns_path, key) DO UPDATE SET user_id=excluded.user_id, value=excluded.value,"
            " text=excluded.text, updated_at=excluded.updated_at, ttl_minutes=excluded.ttl_minutes,"
            " expires_at=excluded.expires_at RETURNING id",
            (ns_path(item.namespace), item.id, item.user_id, dumps(list(item.namespace)), item.key,
             dumps(item.value), item.text, item.created_at, item.updated_at, ttl_minutes, expires_at)).fetchone()
        return str(row[0])

    def update_item(self, item_id: str, *, user_id: str, value: Mapping[str, Any], text: str | None,
                    updated_at: float, ttl_minutes: float | None = None, expires_at: float | None = None) -> None:
        self._run("UPDATE items SET user_id=?, value=?, text=?, updated_at=?, ttl_minutes=?, expires_at=?"
                  " WHERE id=?", (user_id, dumps(dict(value)), text, updated_at, ttl_minutes, expires_at, item_id))

    def refresh_items(self, ids: Sequence[str], now: float) -> None:
        self._many("UPDATE items SET expires_at = ? + ttl_minutes * 60 WHERE id=? AND ttl_minutes IS NOT NULL",
                   [(now, i) for i in sorted(set(ids))])

    def delete_item(self, item_id: str) -> str | None:
        found = self._run("DELETE FROM items WHERE id=? RETURNING user_id", (item_id,)).fetchone()
        return None if found is None else str(found[0])
