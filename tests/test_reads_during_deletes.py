"""Reads and resolutions that race a delete in another thread: what was deleted is simply not
found, never an error. Each race is forced at the exact point between two steps of the read
(no sleeps): the SQLite store below runs a delete just before the statement that reads a hit's
session neighbours, as another thread's ``forget`` or ``clear_session`` can commit between
the statements of one ``neighbors()`` call."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from tiered_memory import TieredMemory
from tiered_memory.embedding import Embedder
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.types import StoredMessage

NEIGHBOUR_RANGES = "WITH t(sid, lo, hi)"  # the second statement of SQLiteRecordStore.neighbors


class DeletesBetweenStatements(SQLiteRecordStore):
    """The real SQLite store; ``between()`` runs once, just before the neighbour statement."""

    between: Callable[[], Any] | None = None

    def query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        if self.between is not None and sql.startswith(NEIGHBOUR_RANGES):
            run, self.between = self.between, None
            run()
        return super().query(sql, params)


def test_neighbours_of_a_message_deleted_meanwhile_are_none(tmp_path: Path) -> None:
    store = DeletesBetweenStatements(tmp_path / "records.sqlite3")
    rows = [StoredMessage(id=f"m{i}", user_id="u", session_id="s", role="user", content=f"turn {i}",
                          timestamp=1_700_000_000.0 + i) for i in range(3)]
    store.insert_messages(rows)
    store.between = lambda: store.delete_message("u", "m1")
    found = store.neighbors("u", ["m1"], 1)
    assert found == {"m1": []}  # gone: no neighbours, as for an id the store never held
    assert [m.id for m in store.neighbors("u", ["m0"], 1)["m0"]] == ["m0", "m2"]
    store.close()


def test_a_search_while_the_session_is_cleared_finds_nothing_of_it(tmp_path: Path, embedder: Embedder) -> None:
    (tmp_path / "mem").mkdir()
    store = DeletesBetweenStatements(tmp_path / "mem" / "records.sqlite3")
    with TieredMemory(tmp_path / "mem", record_store=store, embedder=embedder) as memory:
        memory.add_many([{"role": "user", "content": "I am moving to Lisbon in May"},
                         {"role": "assistant", "content": "Lisbon is lovely in spring"}], session_id="trip", user_id="u")
        store.between = lambda: memory.clear_session("trip", user_id="u")
        memory.search("when is the move to Lisbon?", user_id="u")
        assert store.between is None  # the clear ran inside the search
        assert memory.search("when is the move to Lisbon?", user_id="u") == []
