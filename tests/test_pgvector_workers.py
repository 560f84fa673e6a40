"""pgvector under two workers: one worker's ``rebuild_index()`` (which drops the vector table,
and writes it again at its embedder's dimension) must not make another worker's next call fail
with a raw engine error. Each worker's index remembers the table's dimension; when the table
changed under it, the call looks again: it goes on if it can (the table is gone: a read finds
nothing, a write creates it), and is refused with the typed error that names the way out when
the table now holds another embedder's vectors. Nothing of the wrong dimension is written.

Two ``TieredMemory`` objects on one schema, each with its own pool: two workers, as far as the
database can tell.
"""

from __future__ import annotations

from typing import Callable

import pytest

from tiered_memory import TieredMemory
from tiered_memory.errors import VectorIndexError

from test_pgvector import Truncated, batch, database, open_pg  # noqa: F401 (fixtures)

pytestmark = pytest.mark.servers


def test_a_rebuild_by_another_worker_that_drops_the_table_leaves_this_workers_next_calls_working(
        open_pg: Callable[..., TieredMemory]) -> None:
    worker = open_pg()
    worker.add("user", "the ferry leaves at nine", user_id="u1", session_id="s1")  # the table's dimension is noted
    other = open_pg()
    other.forget_user("u1")
    other.rebuild_index()  # an empty store: the table is dropped and not written again
    assert worker.search("ferry", user_id="u1") == []  # the first call after it, a read
    assert worker.index.ids() == set() and worker.index.count() == 0
    worker.forget_user("u1")  # a delete, on no table
    other.rebuild_index()
    ids = worker.add_many(batch("the bakery opens at seven"), user_id="u2", session_id="s1")  # a write
    assert worker.index.ids() == set(ids) and other.index.ids() == set(ids)
    assert worker.search("bakery", user_id="u2")[0].id == ids[0]


def test_a_rebuild_by_another_worker_with_another_embedder_is_the_typed_error_on_this_workers_first_call(
        open_pg: Callable[..., TieredMemory]) -> None:
    worker = open_pg()
    worker.add("user", "the ferry leaves at nine", user_id="u1", session_id="s1")
    other = open_pg(Truncated())
    other.rebuild_index()  # every vector again, at 16 dimensions
    for call in (lambda: worker.add("user", "the bakery opens at seven", user_id="u1", session_id="s1"),
                 lambda: worker.search_facts("ferry", user_id="u1")):
        with pytest.raises(VectorIndexError, match="16-dimensional vectors, but this embedder makes") as e:
            call()
        assert "same embedder" in str(e.value)
    assert worker.stats().messages == 1  # pgvector: the refused batch stored nothing
    assert other.index.count() == 1 and other.search("ferry", user_id="u1")[0].text == "the ferry leaves at nine"

