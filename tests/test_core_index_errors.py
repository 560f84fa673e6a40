"""A custom vector index (one the application hands in as ``vector_store=``) may raise anything: a
``RuntimeError``, an ``OSError``. The bundled indexes raise :class:`VectorIndexError`; a custom
one's error reaches the caller as that too, with its own as ``__cause__`` and what was stored and
what to do in the message, on ``end_session`` and the recalls (turns, sessions, context), sync and
async alike. And a store item whose vector write failed is ranked again after a clean reopen, as
a turn, a fact or an episode is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory, VectorIndexError
from tiered_memory.layers.item_vectors import MAX_OWED_IDS, changed
from tiered_memory.layers.items import ItemWrite
from tiered_memory.testing import FailingVectorIndex
from tiered_memory.embedding import embed
from tiered_memory.vector.base import VectorItem
from tiered_memory.vector.chroma import ChromaVectorIndex

# no fact the rules draw (no "I live in ...", "I like ..."): the only vectors end_session writes are
# the episode's key points
SMALL_TALK = [{"role": "user", "content": "Can you recommend a good book about lighthouses?"},
              {"role": "assistant", "content": "Try The Lighthouse Stevensons, a history of the family."}]


def failing(folder: Path) -> FailingVectorIndex:
    """Chroma in ``folder`` behind the fake, failing nothing until told (``times=None``: forever)."""
    folder.mkdir(parents=True, exist_ok=True)
    return FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), fail_on=[], times=None)


def test_end_session_with_a_custom_index_failing_is_typed_keeps_the_episode_once(tmp_path: Path) -> None:
    # the custom index's RuntimeError escaped end_session raw; the episode row and the session's
    # coverage commit before its key points' vectors, so they stay, and a retry returns that episode
    # (and writes the vectors it left pending: they waited for the next open)
    folder = tmp_path / "store"
    index = failing(folder)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
        m.add_many(SMALL_TALK, session_id="s", user_id="u")
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError, match="stored") as raised:
            m.end_session("s", user_id="u")
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert "simulated vector engine failure" in str(raised.value)
        assert "end_session" in str(raised.value)  # what to do: it says the retry is safe
        assert m.facts("u") == []
        [episode] = m.episodes("u")
        with pytest.raises(VectorIndexError):  # a retry while the index fails: still failing, nothing more
            m.end_session("s", user_id="u")
        assert [e.id for e in m.episodes("u")] == [episode.id]
        index.fail_on = set()
        assert not any(i.startswith("ep:") for i in m.index.ids("u"))
        assert m.end_session("s", user_id="u").id == episode.id  # covered: no second episode
        assert [e.id for e in m.episodes("u")] == [episode.id]
        assert any(i.startswith(f"ep:{episode.id}:") for i in m.index.ids("u"))  # the retry wrote its vectors
        m.add_many(SMALL_TALK, session_id="s2", user_id="u")
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError, match="stored") as raised:  # the async twin, alike
            asyncio.run(m.aend_session("s2", user_id="u"))
        assert isinstance(raised.value.__cause__, RuntimeError)
        [second] = m.episodes("u", session_id="s2")
        index.fail_on = set()
    with TieredMemory(folder, embedder=StaticEmbedder()) as again:  # the open writes the pending points
        assert {i.rpartition(":")[0] for i in again.index.ids("u") if i.startswith("ep:")} == {
            f"ep:{episode.id}", f"ep:{second.id}"}
        [hit] = again.search_episodes("a book about lighthouses", user_id="u", k=1)
        assert hit.episode.id in (episode.id, second.id)
        assert [e.id for e in again.episodes("u")] == [episode.id, second.id]


RECALLS: list[tuple[str, Callable[[TieredMemory], Any]]] = [
    ("search", lambda m: m.search("lighthouse book", user_id="u")),
    ("search in a session", lambda m: m.search("lighthouse book", user_id="u", session_id="s")),
    ("search_sessions", lambda m: m.search_sessions("lighthouse book", user_id="u")),
    ("build_context", lambda m: m.build_context("lighthouse book", user_id="u", session_id="s")),
    ("search_episodes", lambda m: m.search_episodes("lighthouse book", user_id="u")),
    ("asearch", lambda m: asyncio.run(m.asearch("lighthouse book", user_id="u"))),
    ("asearch_sessions", lambda m: asyncio.run(m.asearch_sessions("lighthouse book", user_id="u"))),
    ("abuild_context", lambda m: asyncio.run(m.abuild_context("lighthouse book", user_id="u", session_id="s"))),
]


def test_recall_with_a_custom_index_failing_is_typed_and_changes_nothing(tmp_path: Path) -> None:
    # the turn search (and the episodes' and facts' hybrid one) let the index's OSError out raw,
    # which the facade's edge then called a record store failure
    index = failing(tmp_path / "store")
    with TieredMemory(tmp_path / "store", embedder=StaticEmbedder(), vector_store=index) as m:
        m.add_many(SMALL_TALK, session_id="s", user_id="u")
        m.end_session("s", user_id="u")
        index.fail_on, index.error = {"query"}, OSError(5, "Input/output error")
        failed = []
        for name, recall in RECALLS:
            with pytest.raises(VectorIndexError) as raised:
                recall(m)
            failed.append(name)
            assert raised.value.__cause__ is index.error, name
            assert "Input/output error" in str(raised.value) and "nothing was changed" in str(raised.value), name
        assert len(failed) == len(RECALLS) and index.failures == len(RECALLS)
        index.fail_on = set()
        assert sorted(h.text for h in m.search("lighthouse book", user_id="u")) == sorted(
            t["content"] for t in SMALL_TALK)


def test_a_store_item_whose_vector_failed_is_ranked_after_a_clean_reopen(tmp_path: Path) -> None:
    # the item's row commits before its vectors (two engines); a failed upsert left them missing
    # until rebuild_index() or a full repair: a clean open repaired turns, facts and episodes only
    folder = tmp_path / "store"
    index = failing(folder)
    index.fail_on, index.times = {"upsert"}, 1
    tea = ItemWrite(namespace=("u", "notes"), key="tea", user_id="u", value={"text": "Drinks green tea"},
                    text="Drinks green tea")
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
        with pytest.raises(VectorIndexError, match="the next open"):
            m.item_store().write_many([tea])
        assert m.index.ids("u") == set()
    with TieredMemory(folder, embedder=StaticEmbedder()) as again:
        assert again.index.ids("u") == {f"item:{again.item_store().get(('u', 'notes'), 'tea').id}"}  # type: ignore[union-attr]
        [hit] = again.search("green tea", user_id="u", include_items=True)
        assert hit.layer == "item" and hit.text == "Drinks green tea"
    index = failing(folder)
    index.fail_on = {"upsert"}
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index):  # paid once: nothing owed now
        assert index.failures == 0


@pytest.mark.parametrize("raw, add, remove, record", [
    (None, ["b", "a"], [], ["a", "b"]),
    ('["a", "b"]', [], ["a"], ["b"]),
    ('["a"]', ["a"], [], ["a"]),  # each id once
    ('["*"]', ["a"], [], ["*"]),  # every item is owed already
    ('["*"]', ["a"], ["*"], ["a"]),  # a payment of every item: what was owed meanwhile stays
    ("not json", [], [], ["*"]),  # a record that cannot be read: every item, rather than none
    (None, [str(i) for i in range(MAX_OWED_IDS + 1)], [], ["*"]),  # too many to name
])
def test_the_record_of_unindexed_items(raw: str | None, add: list[str], remove: list[str],
                                       record: list[str]) -> None:
    assert json.loads(changed(raw, add=add, remove=remove)) == record


def test_end_session_whose_facts_meet_a_failing_custom_index_is_typed_and_a_retry_completes(tmp_path: Path) -> None:
    # the facts a session's turns state are resolved against the user's facts by vector, then
    # indexed: a custom index's RuntimeError there escaped end_session raw
    folder = tmp_path / "store"
    index = failing(folder)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
        m.add_many([{"role": "user", "content": "My name is Ana and I live in Lisbon."},
                    {"role": "assistant", "content": "Nice to meet you, Ana."}], session_id="s", user_id="u")
        for failing_call in ("query", "upsert"):
            index.fail_on = {failing_call}
            with pytest.raises(VectorIndexError) as raised:
                m.end_session("s", user_id="u")
            assert isinstance(raised.value.__cause__, RuntimeError), failing_call
        index.fail_on = set()
        m.end_session("s", user_id="u")
        assert any("Ana" in f.text for f in m.facts("u"))
        assert m.search_facts("Ana's name", user_id="u")


def test_end_session_called_again_after_a_facts_vector_failed_stores_it_once(tmp_path: Path) -> None:
    """A fact of no slot ("User is a violin teacher") stored, its vector refused: the retry's rules
    resolve against the user's facts by vector, found none, and stored it a second time (two valid
    copies till a consolidate merged them). A call pays what a failed one left first, as a write does."""
    folder = tmp_path / "store"
    index = failing(folder)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
        m.add("user", "I'm a violin teacher.", session_id="s", user_id="u")
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError):
            m.end_session("s", user_id="u")
        index.fail_on = set()
        m.end_session("s", user_id="u")
        assert [f.text for f in m.facts("u")] == ["User is a violin teacher"]
        assert [c.action for c in m.fact_history("u")] == ["add"]


@pytest.mark.parametrize("method", ["scans_exactly", "held_rows"])
def test_turn_search_whose_custom_index_fails_its_exact_scope_is_typed(tmp_path: Path, method: str) -> None:
    # the turn search asks an index that scans a user exactly whether it does (and how many rows it
    # holds) before its query: a custom index's error there escaped raw, unlike the query's own
    index = failing(tmp_path / "store")
    with TieredMemory(tmp_path / "store", embedder=StaticEmbedder(), vector_store=index) as m:
        m.add_many(SMALL_TALK, session_id="s", user_id="u")
        assert index.inner.scans_exactly("u", wait=True)  # the user's vectors held: held_rows is asked too
        index.fail_on, index.error = {method}, OSError(5, "Input/output error")
        with pytest.raises(VectorIndexError, match="nothing was changed") as raised:
            m.search("lighthouse book", user_id="u")
        assert raised.value.__cause__ is index.error and index.failures == 1
        index.fail_on = set()
        assert len(m.search("lighthouse book", user_id="u")) == len(SMALL_TALK)


@pytest.mark.parametrize(("method", "after"), [("ids", 1), ("ids", 2), ("delete", 1)])
def test_full_repair_at_open_whose_custom_index_fails_is_typed_and_the_next_open_finishes_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, method: str, after: int) -> None:
    # a full repair (the index lost a turn's vector) lists the vectors (the open's check listed them
    # first) and deletes strays (vectors no row holds), the turns' then the facts' and episodes': a
    # custom index's error there escaped the open raw, where a VectorIndexError leaves it open
    # (records kept, repaired next time; a stray the index refused to delete is owed, paid next time)
    folder = tmp_path / "store"
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=failing(folder)) as m:
        m.add_many(SMALL_TALK, session_id="s", user_id="u")
        m.add_fact("User keeps a lighthouse logbook", user_id="u")
        lost = m.get_messages("s", user_id="u")[0].id
        m.index.inner.delete([lost])
        if method == "delete":  # strays to delete (an empty list is not sent), with the store left open as a
            m.index.inner.upsert([VectorItem(id=i, vector=embed(m.embedder, ["no row"])[0], user_id="u", layer=layer)
                                  for i, layer in (("ghost", "turn"), ("fact:ghost", "fact"))])
    if method == "delete":  # crash leaves it (they hide the lost vector from the open's count)
        with contextlib.closing(sqlite3.connect(folder / "records.sqlite3")) as con, con:
            con.execute("UPDATE meta SET value='open' WHERE key='state'")
    index = FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), fail_on=[method], after=after, times=None)
    with caplog.at_level("WARNING", logger="tiered_memory"):
        with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
            assert index.failures == 1 if method == "ids" else index.failures >= 1  # and the open's payment
            assert [t["content"] for t in SMALL_TALK] == [x.content for x in m.get_messages("s", user_id="u")]
    assert any("could not be repaired at open" in r.getMessage() and "simulated vector engine failure"
               in r.getMessage() for r in caplog.records)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=failing(folder)) as m:
        ids = m.index.ids("u")
        assert lost in ids and any(i.startswith("fact:") for i in ids) and not {"ghost", "fact:ghost"} & ids


@pytest.mark.parametrize("pending", ["turn", "fact"])
def test_an_open_whose_custom_index_fails_the_pending_rows_is_typed_and_the_next_open_indexes_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, pending: str) -> None:
    # a turn or a fact stored pending (its vector write failed), then an open while the engine still
    # fails: the pending pass of turns and of facts let the custom index's RuntimeError escape the open
    # (the episodes' was typed, and a VectorIndexError leaves the memory open)
    folder = tmp_path / "store"
    index = failing(folder)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
        m.add_many(SMALL_TALK[:1], session_id="s", user_id="u")
        m.add_fact("User keeps a lighthouse logbook", user_id="u")
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError, match="not indexed|marked for indexing"):
            if pending == "turn":
                m.add_many(SMALL_TALK[1:], session_id="s", user_id="u")
            else:
                m.add_fact("User sails to the lighthouse on Sundays", user_id="u")
        index.fail_on = set()
        want = {f"fact:{f.id}" for f in m.facts("u")} | {t.id for t in m.get_messages("s", user_id="u")}
    index = FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), fail_on=["upsert"], times=None)
    with caplog.at_level("WARNING", logger="tiered_memory"):
        with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=index) as m:
            assert index.failures == 1
    assert any("could not be repaired at open" in r.getMessage() and f"1 {pending}" in r.getMessage()
               for r in caplog.records)
    with TieredMemory(folder, embedder=StaticEmbedder(), vector_store=failing(folder)) as m:
        assert want <= m.index.ids("u")


def test_an_import_whose_index_fails_on_the_store_items_says_the_next_open_indexes_them(tmp_path: Path) -> None:
    # the import's error said store items were restored by rebuild_index() only; the next open does it
    tea = ItemWrite(namespace=("u", "notes"), key="tea", user_id="u", value={"text": "Drinks green tea"},
                    text="Drinks green tea")
    with TieredMemory(tmp_path / "a", embedder=StaticEmbedder()) as m:
        m.item_store().write_many([tea])
        m.export_jsonl(tmp_path / "dump.jsonl")
    index = failing(tmp_path / "b")
    index.fail_on = {"upsert"}
    with TieredMemory(tmp_path / "b", embedder=StaticEmbedder(), vector_store=index) as m:
        with pytest.raises(VectorIndexError, match=r"the next open indexes \(store items too\)") as raised:
            m.import_jsonl(tmp_path / "dump.jsonl")
        assert "rebuild_index" not in str(raised.value)
    with TieredMemory(tmp_path / "b", embedder=StaticEmbedder(), vector_store=failing(tmp_path / "b")) as again:
        [hit] = again.search("green tea", user_id="u", include_items=True)
        assert hit.layer == "item" and hit.text == "Drinks green tea"
