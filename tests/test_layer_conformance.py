"""Layer conformance: every layer (semantic, episodic, working, consolidation, items) on
every record store, through the public API.

A new backend proves itself by subclassing :class:`LayerConformance` and providing one
fixture, ``record_store``: a function returning the ``record_store`` argument of
:class:`TieredMemory` (a new object on the same data at each call, or ``None`` for the
embedded default). A record store the library does not know gets the layers by
implementing :class:`tiered_memory.store.repositories.LayerRepository` itself;
:class:`TestCustomRecordStore` shows one.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import (
    ConsolidationConfig,
    MemoryConfig,
    NotFoundError,
    TieredMemory,
    WorkingConfig,
)
from tiered_memory.backends import open_layer_store, supports_layers
from tiered_memory.layers.items import ItemWrite
from tiered_memory.records import Fact
from tiered_memory.store.repositories import LayerRepository
from tiered_memory.store.sqlite import SQLiteRecordStore

DAY = 86400.0
RecordStoreArg = Callable[[], Any]
OpenMemory = Callable[..., TieredMemory]


class LayerConformance:
    """Subclasses provide ``record_store`` (see the module docstring)."""

    @pytest.fixture
    def open_memory(self, make_memory: Callable[..., TieredMemory], record_store: RecordStoreArg) -> OpenMemory:
        """Opens the memory on the store under test (the same data each call); closed at teardown."""
        return lambda config=None: make_memory("mem", record_store=record_store(), config=config)

    @pytest.fixture
    def memory(self, open_memory: OpenMemory) -> TieredMemory:
        return open_memory()

    # ---- semantic ------------------------------------------------------------------
    def test_the_store_has_every_layer(self, memory: TieredMemory) -> None:
        assert supports_layers(memory.store)
        assert isinstance(open_layer_store(memory.store), LayerRepository)

    def test_facts_add_update_delete_history_and_search(self, memory: TieredMemory) -> None:
        tea = memory.add_fact("User drinks green tea", user_id="u1", type="preference")
        job = memory.add_fact("User works as a nurse in Lyon", user_id="u1", confidence=0.9)
        assert memory.add_fact("User drinks green tea", user_id="u1", type="preference").id == tea.id  # no-op
        assert [f.id for f in memory.facts("u1")] == [tea.id, job.id]  # oldest first
        assert [f.id for f in memory.facts("u1", type="preference")] == [tea.id]
        assert memory.search_facts("what is the user's job?", user_id="u1")[0].fact.id == job.id
        assert memory.search_facts("nurse", user_id="u1", type="preference")[0].fact.id == tea.id
        edited = memory.update_fact(job.id, user_id="u1", text="User works as a surgeon in Lyon", confidence=1.0,
                                    metadata={"by": "settings"})
        assert (edited.text, edited.confidence, edited.metadata["by"]) == ("User works as a surgeon in Lyon",
                                                                          1.0, "settings")
        assert memory.search_facts("surgeon", user_id="u1")[0].fact.id == job.id  # keyword and vector follow
        memory.delete_fact(tea.id, user_id="u1")
        assert [f.id for f in memory.facts("u1")] == [job.id]
        assert [(h.action, h.old_text, h.new_text) for h in memory.fact_history("u1", job.id)] == [
            ("add", None, "User works as a nurse in Lyon"),
            ("edit", "User works as a nurse in Lyon", "User works as a surgeon in Lyon")]
        assert [h.action for h in memory.fact_history("u1")] == ["add", "add", "edit", "delete"]
        with pytest.raises(NotFoundError):
            memory.delete_fact(tea.id, user_id="u1")
        with pytest.raises(NotFoundError):
            memory.update_fact(job.id, user_id="u2", text="x")

    def test_a_contradiction_invalidates_the_old_fact_and_keeps_it(self, memory: TieredMemory) -> None:
        memory.add("user", "I live in Lisbon.", session_id="s1", user_id="u1")
        memory.end_session("s1", user_id="u1")
        (lisbon,) = memory.facts("u1")
        memory.add("user", "I moved to Porto.", session_id="s2", user_id="u1")
        memory.end_session("s2", user_id="u1")
        (porto,) = memory.facts("u1")
        assert porto.text == "User lives in Porto"
        kept = {f.id: f for f in memory.facts("u1", include_invalid=True)}[lisbon.id]
        assert kept.invalid_at is not None and kept.superseded_by == porto.id
        assert [h.action for h in memory.fact_history("u1", lisbon.id)] == ["add", "invalidate"]
        assert [h.fact.id for h in memory.search_facts("where does the user live", user_id="u1")] == [porto.id]

    def test_the_valid_facts_of_a_slot_are_read_by_key(self, memory: TieredMemory) -> None:
        """FactRepository.facts_in_slot: what fact resolution compares a fact of a slot with,
        however many facts are nearer to its words."""
        rows = open_layer_store(memory.store)
        paris = memory.add_fact("User lives in Paris", user_id="u1")
        memory.add_fact("User lives in Rome", user_id="u2")  # another user's
        memory.add_fact("User likes Paris", user_id="u1")  # another slot
        at = time.time()
        with rows.unit() as u:  # a second valid fact of the slot (stored before slots were resolved)
            u.insert_fact(Fact(id="old", user_id="u1", type="fact", text="User lives in Oslo", confidence=0.5,
                               created_at=at, updated_at=at, valid_from=at, key="residence"), None)
        slot = rows.facts_in_slot("u1", "residence")
        assert [f.id for f, _ in slot] == [paris.id, "old"]  # oldest first
        stored = {f.id: v for f, v in rows.fact_vectors("u1")}
        assert [(v is None, v is not None and v.tolist() == stored[f.id].tolist()) for f, v in slot] == [
            (False, True), (True, False)]  # with the vector its row holds, or none
        berlin = memory.add_fact("User lives in Berlin", user_id="u1")  # invalidates one of them
        memory.delete_fact("old", user_id="u1")
        assert [f.id for f, _ in rows.facts_in_slot("u1", "residence")] == [berlin.id]
        assert [f.text for f, _ in rows.facts_in_slot("u2", "residence")] == ["User lives in Rome"]
        assert rows.facts_in_slot("u1", "employer") == []

    def test_reads_count_accesses_once_flushed(self, memory: TieredMemory) -> None:
        fact = memory.add_fact("User collects vinyl records", user_id="u1")
        memory.search_facts("music collection", user_id="u1")
        memory.search_facts("vinyl", user_id="u1")
        (listed,) = memory.facts("u1")  # listing flushes the access log first
        assert listed.id == fact.id and listed.access_count == 2 and listed.last_access is not None

    # ---- episodic --------------------------------------------------------------------
    def test_episodes_end_session_search_and_coverage(self, memory: TieredMemory) -> None:
        ids = memory.add_many([{"role": "user", "content": "We decided to use PostgreSQL for billing."},
                               {"role": "assistant", "content": "Noted: PostgreSQL, replicas in eu-west-1."}],
                              session_id="db", user_id="u1")
        first = memory.end_session("db", user_id="u1")
        assert first.source_ids == ids and first.session_id == "db" and first.turn_count == 1
        assert memory.end_session("db", user_id="u1") == first  # idempotent: nothing uncovered
        later = memory.add("user", "Also add monitoring with Grafana.", session_id="db", user_id="u1")
        second = memory.end_session("db", user_id="u1")
        assert second.source_ids == [later]
        assert [e.id for e in memory.episodes("u1", session_id="db")] == [first.id, second.id]
        memory.add("user", "I am planning a trip to Japan in April.", session_id="trip", user_id="u1")
        trip = memory.end_session("trip", user_id="u1")
        hits = memory.search_episodes("which database did we choose for billing?", user_id="u1", k=1)
        assert [h.episode.id for h in hits] == [first.id] and hits[0].matched
        assert memory.search_episodes("Japan trip", user_id="u1", k=1)[0].episode.id == trip.id
        counts = {e.id: e.access_count for e in memory.episodes("u1")}
        assert counts == {first.id: 1, second.id: 0, trip.id: 1}
        with pytest.raises(NotFoundError):
            memory.end_session("nope", user_id="u1")

    def test_session_cursors_are_listed_per_user(self, memory: TieredMemory) -> None:
        """An export reads every session's coverage cursor at once (``session_cursors``)."""
        for user in ("u1", "u2"):
            memory.add("user", f"{user} chose PostgreSQL.", session_id="db", user_id=user)
            memory.end_session("db", user_id=user)
        memory.add("user", "Not summarised yet.", session_id="open", user_id="u1")
        rows = open_layer_store(memory.store)
        mine = rows.session_cursors("u1")
        assert mine == {("u1", "db"): rows.cursor("u1", "db")} and mine[("u1", "db")] > 0
        assert set(rows.session_cursors(None)) == {("u1", "db"), ("u2", "db")}

    # ---- working -----------------------------------------------------------------------
    def test_working_memory_items_and_scratchpad(self, open_memory: OpenMemory) -> None:
        memory = open_memory(MemoryConfig(working=WorkingConfig(capacity=3, decay_per_hour=0.05)))
        wm = memory.working_memory("s1", user_id="u1")
        for n, imp in enumerate([0.9, 0.1, 0.5, 0.7]):
            wm.remember(f"note {n}", importance=imp)
        assert [i.text for i in wm.items()] == ["note 0", "note 3", "note 2"]  # note 1 evicted
        webhook = wm.remember("User is debugging the Stripe payment webhook", importance=0.95, type="goal")
        assert wm.items("why does the payment webhook fail?", k=1)[0].id == webhook.id
        assert wm.forget(webhook.id) and not wm.forget(webhook.id)
        wm.scratchpad["step"] = 2
        wm.scratchpad["plan"] = {"next": ["a", "b"]}
        del wm.scratchpad["step"]
        assert memory.working_memory("s1", user_id="u1").scratchpad.to_dict() == {"plan": {"next": ["a", "b"]}}
        assert memory.working_memory("s2", user_id="u1").items() == []
        assert memory.working_memory("s1", user_id="u2").scratchpad.to_dict() == {}
        assert wm.clear() == 2
        assert wm.items() == [] and len(wm.scratchpad) == 0

    # ---- consolidation -------------------------------------------------------------------
    def test_consolidate_runs_every_step(self, open_memory: OpenMemory) -> None:
        memory = open_memory(MemoryConfig(consolidation=replace(ConsolidationConfig(), promote_access_count=2)))
        now = time.time()
        old = memory.add_many([{"role": "user", "content": "Let's review the lighthouse budget.", "timestamp":
                                now - 60 * DAY}], session_id="old", user_id="u1")
        memory.add("user", "We planned the Berlin offsite for June.", session_id="recent", user_id="u1")
        recent = memory.end_session("recent", user_id="u1")
        for _ in range(2):
            memory.search_episodes("Berlin offsite", user_id="u1", k=1)
        stale_note = memory.working_memory("s1", user_id="u1").remember(
            "a passing remark", importance=0.06, now=now - 30 * DAY)
        rows = open_layer_store(memory.store)  # rows only a backend could hold: facts that escaped resolution
        with rows.unit() as u:
            for text, confidence, age in [("User drinks green tea", 0.8, 1), ("USER DRINKS GREEN TEA.", 0.7, 2),
                                          ("User once asked about kites", 0.1, 400)]:
                at = now - age * DAY
                u.insert_fact(Fact(id=uuid.uuid4().hex, user_id="u1", type="fact", text=text, confidence=confidence,
                                   created_at=at, updated_at=at, valid_from=at), None)

        report = memory.consolidate("u1")
        episodes = {e.session_id: e for e in memory.episodes("u1")}
        assert report.sessions == 1 and episodes["old"].source_ids == old  # the idle session
        assert report.merged == 1  # the shouted duplicate joined the first
        assert [f.text for f in memory.facts("u1") if "tea" in f.text.lower()] == ["User drinks green tea"]
        assert report.promoted == 1 and episodes["recent"].promoted_at is not None
        assert episodes["recent"].id == recent.id
        assert report.compressed == 1 and episodes["old"].compressed_at is not None
        assert report.archived_messages == 1 and memory.get_messages("old", user_id="u1") == []
        assert report.pruned == 2  # the stale fact and the faded working item
        assert "User once asked about kites" not in {f.text for f in memory.facts("u1")}
        assert stale_note.id not in {i.id for i in memory.working_memory("s1", user_id="u1").items()}
        assert {h.action for h in memory.fact_history("u1")} >= {"merge", "prune"}
        again = memory.consolidate("u1")  # idempotent
        assert (again.sessions, again.merged, again.promoted, again.compressed, again.pruned) == (0, 0, 0, 0, 0)

    # ---- items -----------------------------------------------------------------------------
    def test_item_store_put_get_search_list_delete(self, memory: TieredMemory) -> None:
        items = memory.item_store()
        items.write_many([
            ItemWrite(namespace=("u1", "prefs"), key="tea", user_id="u1", value={"v": 1},
                      text="Prefers green tea in the morning"),
            ItemWrite(namespace=("u1", "prefs"), key="city", user_id="u1", value={"v": "Porto"},
                      text="Lives in Porto"),
            ItemWrite(namespace=("u1", "notes", "x"), key="n", user_id="u1", value={"deep": True}),
            ItemWrite(namespace=("u2", "prefs"), key="tea", user_id="u2", value={"v": 2}, text="Hates tea"),
        ])
        got = items.get(("u1", "prefs"), "tea")
        assert got is not None and got.value == {"v": 1} and got.namespace == ("u1", "prefs")
        assert items.get(("u1", "prefs"), "missing") is None
        hits = items.search(("u1",), query="what does the user drink?", user_id="u1", limit=1)
        assert [h.item.key for h in hits] == ["tea"] and hits[0].score is not None
        assert {h.item.key for h in items.search(("u1", "prefs"))} == {"tea", "city"}
        assert items.namespaces(max_depth=2) == [("u1", "notes"), ("u1", "prefs"), ("u2", "prefs")]
        assert (items.count(), items.count("u1")) == (4, 3)
        items.write_many([ItemWrite(namespace=("u1", "prefs"), key="tea", user_id="u1", value={"v": 3}),
                          ItemWrite(namespace=("u1", "prefs"), key="city", user_id="u1", value=None)])
        updated = items.get(("u1", "prefs"), "tea")
        assert updated is not None and updated.value == {"v": 3} and updated.text is None
        assert updated.created_at == got.created_at and updated.id == got.id
        assert items.get(("u1", "prefs"), "city") is None and items.count("u1") == 2

    # ---- every layer -------------------------------------------------------------------------
    def test_users_are_isolated_and_forget_user_erases_every_layer(self, memory: TieredMemory) -> None:
        for user in ("u1", "u2"):
            memory.add_fact(f"User {user} likes chess", user_id=user)
            memory.add("user", f"{user} planned the chess club meeting.", session_id="s", user_id=user)
            memory.end_session("s", user_id=user)
            memory.working_memory("s", user_id=user).remember(f"{user} note")
            memory.item_store().write_many([ItemWrite(namespace=(user, "n"), key="k", user_id=user,
                                                      value={"u": user}, text=f"{user} chess")])
        assert {f.user_id for f in memory.facts("u1")} == {"u1"}
        assert {h.fact.user_id for h in memory.search_facts("chess", user_id="u1")} == {"u1"}
        assert {h.episode.user_id for h in memory.search_episodes("chess club", user_id="u1")} == {"u1"}
        def u2_rows() -> tuple[Any, ...]:  # working items by text: their decayed score moves with the clock
            return (memory.facts("u2"), memory.episodes("u2"), memory.fact_history("u2"),
                    [i.text for i in memory.working_memory("s", user_id="u2").items()], memory.item_store().count("u2"))

        u2 = u2_rows()
        memory.forget_user("u1")
        assert memory.facts("u1", include_invalid=True) == [] and memory.fact_history("u1") == []
        assert memory.episodes("u1") == [] and memory.working_memory("s", user_id="u1").items() == []
        assert memory.item_store().count("u1") == 0
        assert u2[0] and u2[1] and u2[2] and u2[3:] == (["u2 note"], 1)
        assert u2_rows() == u2

    def test_layers_survive_reopening_and_rebuild_index(self, open_memory: OpenMemory) -> None:
        memory = open_memory()
        fact = memory.add_fact("User collects vinyl records", user_id="u1")
        memory.add("user", "We planned the Berlin offsite for June.", session_id="s1", user_id="u1")
        ep = memory.end_session("s1", user_id="u1")
        memory.working_memory("s1", user_id="u1").scratchpad["k"] = "v"
        memory.close()
        memory = open_memory()
        assert [f.id for f in memory.facts("u1")] == [fact.id]
        assert [e.id for e in memory.episodes("u1")] == [ep.id]
        assert memory.working_memory("s1", user_id="u1").scratchpad["k"] == "v"
        report = memory.rebuild_index()
        assert report["facts"] == 1 and report["episodes"] == 1
        assert memory.search_facts("music collection", user_id="u1")[0].fact.id == fact.id
        assert memory.search_episodes("offsite in Berlin", user_id="u1")[0].episode.id == ep.id

    def test_a_failed_unit_of_work_writes_nothing(self, memory: TieredMemory) -> None:
        rows = open_layer_store(memory.store)
        at = time.time()
        with pytest.raises(RuntimeError, match="boom"):
            with rows.unit() as u:
                u.insert_fact(Fact(id="f1", user_id="u1", type="fact", text="half written", confidence=0.5,
                                   created_at=at, updated_at=at, valid_from=at), None)
                u.audit("u1", "fact", "f1", "add", {}, at)
                raise RuntimeError("boom")
        assert rows.fact("u1", "f1") is None and memory.facts("u1") == []


# ---------------------------------------------------------------------------------------
class TestSQLite(LayerConformance):
    @pytest.fixture
    def record_store(self) -> RecordStoreArg:
        return lambda: None  # the embedded default


@pytest.fixture(scope="module")
def _layer_database(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("make_postgres_url")())


@pytest.mark.servers
class TestPostgres(LayerConformance):
    @pytest.fixture
    def record_store(self, _layer_database: str) -> RecordStoreArg:
        from tiered_memory.store.postgres import PostgresRecordStore

        schema = "l_" + uuid.uuid4().hex[:12]  # one schema per test: cheaper than a database
        return lambda: PostgresRecordStore(_layer_database, schema=schema)


class ComposedStore:
    """A record store of a class the library does not know: it implements ``RecordStore``
    and ``LayerRepository`` itself (here by composing the SQLite parts), so the library
    uses it as its own layer repository."""

    def __init__(self, path: Path) -> None:
        self._records = SQLiteRecordStore(path)
        self._layers = open_layer_store(self._records)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._records if hasattr(self._records, name) else self._layers, name)


class TestCustomRecordStore(LayerConformance):
    @pytest.fixture
    def record_store(self, tmp_path: Path) -> RecordStoreArg:
        return lambda: ComposedStore(tmp_path / "custom.sqlite3")

    def test_the_library_uses_the_store_as_its_repository(self, memory: TieredMemory) -> None:
        assert not isinstance(memory.store, SQLiteRecordStore)
        assert open_layer_store(memory.store) is memory.store
