"""pgvector, one engine: a step that deletes rows and their vectors commits both or neither.

README ("Running at scale", the multi-process model) says that with pgvector "there is nothing to
repair after a crash: rows and vectors commit together", and a shared store's open repairs only
what the rows mark pending, so a vector whose row is gone stays until ``rebuild_index()``. The
TTL sweep of the LangGraph store's items and consolidation's merge and prune steps committed
the rows first and deleted the vectors after: a failure (or a kill) between the two left the
vectors of items and facts that no longer exist. Here the vector delete fails inside PostgreSQL
(a trigger on the vectors table refuses it), as an engine failure after the rows' statements;
the step must then have deleted nothing, and, once deletes work again, deletes both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
import pytest

from tiered_memory import ConsolidationConfig, MemoryConfig, TieredMemory
from tiered_memory.errors import NotFoundError, StoreError, VectorIndexError

from test_forget_owed import draws_nothing
from test_pgvector import database, open_pg, vector_ids  # noqa: F401 (fixtures)

pytestmark = pytest.mark.servers

DAY = 86400.0


def refusing_vector_deletes(memory: TieredMemory) -> Iterator[None]:
    """While it runs, PostgreSQL refuses every delete of a row of the memory's vectors table."""
    store = memory.store
    with psycopg.connect(store.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute(f'SET search_path TO "{store.schema}"')  # type: ignore[attr-defined]
        conn.execute("CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$ BEGIN RAISE EXCEPTION 'the vector engine refuses this delete'; END $$")
        conn.execute("CREATE TRIGGER refuse_delete BEFORE DELETE ON vectors FOR EACH ROW"
                     " EXECUTE FUNCTION refuse_delete()")
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER refuse_delete ON vectors")
            conn.execute("DROP FUNCTION refuse_delete()")


def refused(memory: TieredMemory, step: Callable[[], Any]) -> None:
    """``step`` fails with the typed error while vector deletes are refused."""
    for _ in refusing_vector_deletes(memory):
        with pytest.raises(VectorIndexError, match="refuses this delete"):
            step()


def import_facts(memory: TieredMemory, tmp_path: Path, facts: list[dict[str, Any]], age_days: float) -> None:
    old = time.time() - age_days * DAY
    lines = [{"format": "tiered-memory/1", "type": "fact", "fact": {
        "user_id": "u", "type": "preference", "metadata": {}, "created_at": old, "updated_at": old,
        "valid_from": old, "source_ids": [], **f}} for f in facts]
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert memory.import_jsonl(path).facts_imported == len(facts)


def test_a_ttl_sweep_whose_vector_delete_fails_deletes_no_item(open_pg: Callable[..., TieredMemory]) -> None:
    from langchain_tiered_memory import TieredMemoryStore

    now = [time.time()]
    memory = open_pg(clock=lambda: now[0])
    store = TieredMemoryStore(memory, fields=["text"], ttl={"default_ttl": 10, "refresh_on_read": False})
    store.put(("u", "notes"), "brief", {"text": "the spare key is under the mat"})
    store.put(("u", "notes"), "kept", {"text": "the ferry leaves at nine"}, ttl=None)
    now[0] += 3600  # "brief" expired
    refused(memory, store.sweep_ttl)
    assert memory.item_store().count() == 2, "the expired item's row was deleted, its vector kept"
    assert len([i for i in vector_ids(memory, "u") if i.startswith("item:")]) == 2
    assert store.sweep_ttl() == 1
    assert memory.item_store().count() == 1
    assert len([i for i in vector_ids(memory, "u") if i.startswith("item:")]) == 1


def test_a_merge_whose_vector_delete_fails_merges_nothing(open_pg: Callable[..., TieredMemory],
                                                          tmp_path: Path) -> None:
    memory = open_pg()
    import_facts(memory, tmp_path, [
        {"id": "keep", "text": "User enjoys hiking in the mountains", "confidence": 0.9},
        {"id": "dup", "text": "User enjoys hiking in the mountains.", "confidence": 0.5},
    ], age_days=10)
    refused(memory, lambda: memory.consolidate("u"))
    assert sorted(f.id for f in memory.facts("u")) == ["dup", "keep"], "the duplicate was merged, its vector kept"
    assert {"fact:keep", "fact:dup"} <= vector_ids(memory, "u")
    assert memory.consolidate("u").details["merge"] == ["dup"]
    assert [f.id for f in memory.facts("u")] == ["keep"]
    assert "fact:dup" not in vector_ids(memory, "u")


def test_a_prune_whose_vector_delete_fails_prunes_nothing(open_pg: Callable[..., TieredMemory],
                                                          tmp_path: Path) -> None:
    memory = open_pg()
    import_facts(memory, tmp_path, [{"id": "faint", "text": "User once mentioned a blue kite", "confidence": 0.01}],
                 age_days=400)
    refused(memory, lambda: memory.consolidate("u"))
    assert [f.id for f in memory.facts("u")] == ["faint"], "the fact was pruned, its vector kept"
    assert "fact:faint" in vector_ids(memory, "u")
    assert memory.consolidate("u").pruned == 1
    assert memory.facts("u") == [] and "fact:faint" not in vector_ids(memory, "u")


def test_a_write_rolled_back_after_finishing_a_failed_forget_user_leaves_it_unfinished(
        open_pg: Callable[..., TieredMemory]) -> None:
    """A ``forget_user`` that failed is finished before the user's next write (``Parts.writing``),
    here inside that write's transaction: ``delete_fact`` finishes it, which deletes the fact, so
    the delete then finds no fact, raises, and the transaction rolls back, the finish with it. The
    deletion is unfinished again in the database: the process must not take it for finished, or
    the user's next ``add`` is stored beside the forgotten messages, and the next open, finishing
    the deletion, deletes that acknowledged message too."""
    memory = open_pg()
    old = memory.add("user", "My bank PIN is 4921, do not tell anyone", session_id="s", user_id="u")
    fact = memory.add_fact("User keeps bees on the roof", user_id="u")
    for _ in refusing_vector_deletes(memory):  # marked pending; nothing deleted (one transaction)
        with pytest.raises(StoreError, match="refuses this delete"):
            memory.forget_user("u")
    with pytest.raises(NotFoundError):
        memory.delete_fact(fact.id, user_id="u")
    new = memory.add("user", "I sail on Mondays", session_id="s2", user_id="u")
    assert [m.id for m in memory.get_messages("s", user_id="u")] == [], (
        "the forgotten user's messages outlived the deletion's finish the failed write rolled back")
    assert memory.facts("u") == [] and vector_ids(memory, "u") == {new}
    reopened = open_pg()  # an open finishes what is still pending: nothing
    assert [m.id for m in reopened.get_messages("s2", user_id="u")] == [new], (
        "the message stored after the failed write was deleted by the deletion's late finish")
    assert old not in vector_ids(reopened, "u")


def test_a_write_run_again_after_its_connection_dropped_finishes_a_failed_forget_user_again(
        open_pg: Callable[..., TieredMemory]) -> None:
    """The same finish, in a unit whose connection the server ends before the commit (here the
    fact's vector insert terminates its own backend, once): the store runs the unit again whole on
    a fresh connection, and that run must finish the deletion again, not store the fact beside the
    forgotten rows while the deletion stays pending in the database."""
    memory = open_pg()
    old = memory.add("user", "My bank PIN is 4921, do not tell anyone", session_id="s", user_id="u")
    for _ in refusing_vector_deletes(memory):
        with pytest.raises(StoreError, match="refuses this delete"):
            memory.forget_user("u")
    store = memory.store
    with psycopg.connect(store.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        conn.execute(f'SET search_path TO "{store.schema}"')  # type: ignore[attr-defined]
        conn.execute("CREATE SEQUENCE drops")  # not rolled back with the unit: the first run only
        conn.execute("CREATE FUNCTION drop_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                     " IF nextval('drops') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;"
                     " RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER drop_once BEFORE INSERT ON vectors FOR EACH ROW EXECUTE FUNCTION drop_once()")
    fact = memory.add_fact("User moved to Porto", user_id="u")  # run twice, stored once
    assert [m.id for m in memory.get_messages("s", user_id="u")] == [], "the run again did not finish the deletion"
    assert vector_ids(memory, "u") == {f"fact:{fact.id}"} and old not in vector_ids(memory, "u")
    reopened = open_pg()
    assert [f.id for f in reopened.facts("u")] == [fact.id], "the deletion's late finish deleted the fact"


@pytest.mark.parametrize("call", ["end_session", "consolidate"])
def test_a_call_after_a_failed_forget_user_draws_nothing_from_the_forgotten_rows(
        open_pg: Callable[..., TieredMemory], call: str) -> None:
    """A failed ``forget_user`` leaves every row in place here (one transaction); the rest as in
    ``test_forget_owed``'s test of the same name."""
    memory = open_pg(config=MemoryConfig(consolidation=ConsolidationConfig(promote_access_count=0)))
    memory.add("user", "I live in Lisbon and my bank PIN is 4921", session_id="s", user_id="u")
    if call == "consolidate":
        memory.end_session("s", user_id="u")  # an episode, promoted by any run
    for _ in refusing_vector_deletes(memory):
        with pytest.raises(StoreError, match="refuses this delete"):
            memory.forget_user("u")
    draws_nothing(memory, call, lambda: vector_ids(memory, "u"))
