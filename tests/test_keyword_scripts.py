"""Keyword search on chat that is not English prose: Chinese, Japanese and Korean write words
without spaces (or glue particles to them), so a word of a CJK turn is found by the character
bigrams both the index and the query are read as; Turkish capital dotted I lower-cases to an
``i`` and a combining dot, which must not cut a query's word in two."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.embedding.base import MAX_QUERY_CHARS, query_text
from tiered_memory.testing import CountingEmbedder
from tiered_memory.backends import open_layer_store
from tiered_memory.store.sqlite_keywords import regram
from tiered_memory.layers.items import ItemWrite
from tiered_memory.records import Episode
from tiered_memory.recall.query import keywords
from tiered_memory.store.postgres import MIGRATIONS as PG_MIGRATIONS, PostgresRecordStore
from tiered_memory.store.postgres_db import PostgresDatabase
from tiered_memory.store.postgres_keywords import bigram_turn_keywords
from tiered_memory.store.postgres_layers import ITEM_MIGRATIONS, LAYER_MIGRATIONS, PostgresLayerStore
from tiered_memory.store.sqlite_layers import ITEM_MIGRATIONS as ITEM_SQLITE, LAYER_MIGRATIONS as LAYER_SQLITE
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from tiered_memory.store.text_search import keyword_text
from tiered_memory.types import StoredMessage

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

TEXTS = {
    "zh": "我下个月要去北京出差，然后去上海见客户。",
    "ja": "来週、京都でお寺を見に行きます。",
    "ko": "다음 주에 부산에 가서 회를 먹을 거예요",
    "en": "we are flying to Boston next week",
    "tr": "İstanbul'da yaşıyorum",
}
QUERIES = [("北京", "zh"), ("上海的客户", "zh"), ("我要去北京", "zh"), ("京都", "ja"), ("お寺", "ja"),
           ("部", None), ("부산", "ko"), ("Boston", "en"), ("İstanbul", "tr"), ("istanbul", "tr")]


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    m = make_memory()
    for key, text in TEXTS.items():
        m.add("user", text, user_id="u", session_id=key)
    m.add("user", "北京烤鸭很好吃", user_id="other", session_id="s")  # another user's: never found
    return m


@pytest.mark.parametrize("query, expected", QUERIES)
def test_a_word_of_a_turn_is_found_by_keywords_in_any_script(memory: TieredMemory, query: str,
                                                             expected: str | None) -> None:
    sessions = {x.id: x.session_id for x in memory.store.iter_messages("u")}
    terms = keywords(query)
    found = {sessions[i] for i, _ in memory.store.keyword_search("u", terms, k=10)} if terms else set()
    assert found == ({expected} if expected else set()), (query, terms)
    if expected:
        keyword_hits = [h.session_id for h in memory.search(query, user_id="u", k=3)
                        if "keyword" in h.explanation["signals"]]
        assert keyword_hits == [expected], query  # through search's own query words too


def test_a_cjk_term_passed_whole_to_the_store_matches_as_a_run_of_characters(memory: TieredMemory) -> None:
    """The store's terms are phrases: a CJK term matches the turns holding it as written."""
    sessions = {x.id: x.session_id for x in memory.store.iter_messages("u")}
    assert {sessions[i] for i, _ in memory.store.keyword_search("u", ["去北京出差"], k=10)} == {"zh"}
    assert memory.store.keyword_search("u", ["去上海出差"], k=10) == []  # its characters, not in that order


def test_a_sqlite_store_indexed_before_finds_its_cjk_words_when_it_opens(tmp_path: Path) -> None:
    """Keywords written before CJK text was read as bigrams (the run whole) are computed
    again on open, for the rows holding such a character only."""
    path = tmp_path / "s.sqlite3"
    texts = {"m1": TEXTS["zh"], "m2": "plain text"}
    store = SQLiteRecordStore(path)
    store.insert_messages([StoredMessage(id=i, user_id="u", session_id="s", role="user", content=t, metadata={},
                                         timestamp=float(n)) for n, (i, t) in enumerate(texts.items())])
    store.close()
    con = sqlite3.connect(path, isolation_level=None)  # the keywords as earlier versions wrote them
    for rowid, content in con.execute("SELECT rowid, content FROM messages").fetchall():
        old = " ".join(["1q"] * 3 + ["1q" + w for w in re.findall(r"[^\W_]+", content)])
        con.execute("UPDATE messages SET keywords=? WHERE rowid=?", (old, rowid))
    con.execute("DELETE FROM schema_migrations WHERE name='core' AND version>?",  # regram and after run again
                (SQLITE_MIGRATIONS.index(regram),))
    plain = con.execute("SELECT keywords FROM messages WHERE id='m2'").fetchone()[0]
    con.close()
    store = SQLiteRecordStore(path)
    try:
        assert [i for i, _ in store.keyword_search("u", keywords("北京"), k=3)] == ["m1"]
        assert store.query("SELECT keywords FROM messages WHERE id='m2'", ())[0][0] == plain
    finally:
        store.close()


def test_cjk_runs_are_indexed_as_bigrams_and_other_words_whole() -> None:
    assert keyword_text("1q", "去北京 ok") == "1q 1q 1q 1q去北 1q北京 1qok"
    assert keyword_text("1q", "猫") == "1q 1q 1q 1q猫"  # a lone character is its own word
    assert keywords("東京2024年") == ["東京", "2024", "年"]


@pytest.mark.servers
def before_bigrams(steps: list[Any]) -> list[Any]:
    """The migrations before PostgreSQL's to CJK bigrams: its last step that writes cjk_bigrams()
    (a later migration, such as the pending-vector marks, must not be mistaken for it)."""
    last = max(n for n, step in enumerate(steps)
               if step is bigram_turn_keywords or isinstance(step, str) and "cjk_bigrams" in step)
    return steps[:last]


def test_a_postgres_store_indexed_before_finds_its_cjk_words_when_it_opens(make_postgres_url: Callable[[], str]) -> None:
    """A store whose keyword columns read a CJK run as one word (the schema before
    cjk_bigrams) is migrated: the columns are generated again, and no row changes."""
    url = make_postgres_url()
    db = PostgresDatabase(url)
    try:
        db.migrate("core", before_bigrams(PG_MIGRATIONS))
        db.migrate("layers", before_bigrams(LAYER_MIGRATIONS))
        db.migrate("items", before_bigrams(ITEM_MIGRATIONS))

        def as_before(c: Any) -> None:
            for table, source in (("messages", "content"), ("facts", "text"), ("episode_points", "text"),
                                  ("items", "COALESCE(text, '')")):
                c.execute(f"ALTER TABLE {table} DROP COLUMN tsv; ALTER TABLE {table} ADD COLUMN tsv TSVECTOR"
                          f" GENERATED ALWAYS AS (to_tsvector('english', fold_diacritics({source}))) STORED;"
                          f" CREATE INDEX {table}_tsv ON {table} USING GIN (tsv)")
            c.execute("DROP FUNCTION cjk_bigrams(TEXT)")
            c.execute("INSERT INTO messages (id, user_id, session_id, role, content, timestamp, created_at, indexed)"
                      " VALUES ('m1', 'u', 's', 'user', %s, 0, 0, TRUE)", (TEXTS["zh"],))
            c.execute("INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
                      " VALUES ('f1', 'u', 'fact', '用户住在北京', 1, 0, 0, 0)")
        db.write(as_before)
        assert db.query("SELECT count(*) FROM messages WHERE tsv @@ to_tsquery('english', '北京')")[0][0] == 0
    finally:
        db.close()
    store = PostgresRecordStore(url)
    try:
        rows = PostgresLayerStore(store)
        assert [i for i, _ in store.keyword_search("u", keywords("北京"), k=3)] == ["m1"]
        assert [i for i, _ in rows.keyword_facts("u", keywords("北京"), 3)] == ["f1"]
        assert [m.content for m in store.get_messages("u", "s")] == [TEXTS["zh"]]
    finally:
        store.close()


@pytest.mark.parametrize("query", ["부산", "부산에", "北京", "北京烤鸭"])
def test_a_facts_cjk_word_is_found_by_the_start_of_its_run(memory: TieredMemory, query: str) -> None:
    """Facts read their CJK runs as bigrams, as turns do: a Korean word with its particle and a
    Chinese run's first word are found by a query's bigrams."""
    rows = open_layer_store(memory.store)
    fact = memory.add_fact("부산에 살아요", user_id="u")
    food = memory.add_fact("北京烤鸭很好吃", user_id="u")
    expected = fact.id if query.startswith("부산") else food.id
    assert [i for i, _ in rows.keyword_facts("u", keywords(query), 10)] == [expected]


MIDDLE = [("烤鸭", "北京烤鸭很好吃"), ("好吃", "北京烤鸭很好吃"), ("烤鸭很好吃", "北京烤鸭很好吃"),
          ("お寺", "来週京都でお寺を見に行きます"), ("회를", "부산에서회를먹었어요")]


@pytest.mark.parametrize("query, text", MIDDLE)
def test_a_word_inside_a_cjk_run_is_found_in_facts_key_points_and_items(memory: TieredMemory, query: str,
                                                                      text: str) -> None:
    """Facts, key points and items read a CJK run as its bigrams, as the turns do: a word in
    the middle or at the end of a run is found by keywords, not only one that starts it."""
    rows = open_layer_store(memory.store)
    fact = memory.add_fact(text, user_id="u")
    memory.add_fact("用户住在上海", user_id="u")
    with rows.unit() as unit:
        unit.insert_episode(Episode(id="e1", user_id="u", session_id="s", summary=text),
                            [("ep:e1:0", "用户住在上海"), ("ep:e1:1", text)])
    memory.item_store().write_many([
        ItemWrite(namespace=("u", "notes"), key="k1", user_id="u", value={}, text=text),
        ItemWrite(namespace=("u", "notes"), key="k2", user_id="u", value={}, text="用户住在上海")])
    item = {h.item.text: h.item.id for h in memory.item_store().search(("u",))}[text]
    terms = keywords(query)
    assert [i for i, _ in rows.keyword_facts("u", terms, 10)] == [fact.id], terms
    assert [i for i, _ in rows.keyword_points("u", terms, 10)] == ["ep:e1:1"], terms
    assert [i for i, _ in rows.keyword_items("u", terms, 10)] == [item], terms
    hits = memory.search_facts(query, user_id="u", k=3)
    assert [h.fact.id for h in hits if "keyword" in h.explanation["signals"]] == [fact.id]  # through search too


def fts_terms(store: SQLiteRecordStore, table: str) -> set[str]:
    """The words a layer table's FTS5 index holds (its ``fts5vocab``, without the users' tags),
    each checked against the index's content (the rows' ``keywords``)."""
    store.conn.execute(f"INSERT INTO {table}_fts({table}_fts, rank) VALUES ('integrity-check', 1)")
    with store.transaction() as c:
        c.execute(f"CREATE VIRTUAL TABLE temp.{table}_vocab USING fts5vocab(main, {table}_fts, 'row')")
    try:
        return {re.sub(r"^[0-9]+q", "", r[0]) for r in store.query(f"SELECT term FROM temp.{table}_vocab")} - {""}
    finally:
        with store.transaction() as c:
            c.execute(f"DROP TABLE temp.{table}_vocab")


def first_step(steps: list[Any]) -> int:
    """Where SQLite's migrations to CJK bigrams start: the first step that is a function (a
    later migration, such as the slot index, must not be taken for one)."""
    return next(n for n, step in enumerate(steps) if callable(step))


def test_a_sqlite_store_of_the_previous_schema_indexes_its_facts_points_and_items_cjk_runs_as_bigrams(
        tmp_path: Path) -> None:
    """The layer tables' FTS5 indexes held a CJK run whole; on open they are built again with
    bigrams (English words as before), and a row deleted or changed afterwards leaves none
    of its words behind."""
    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    store.migrate("layers", LAYER_SQLITE[:first_step(LAYER_SQLITE)])  # up to the bigrams (a function)
    store.migrate("items", ITEM_SQLITE[:first_step(ITEM_SQLITE)])
    english = "User runs the Boston marathon every spring"
    with store.transaction() as c:
        for n, text in enumerate([TEXTS["zh"], english]):
            c.execute("INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
                      " VALUES (?, 'u', 'fact', ?, 1, 0, 0, 0)", (f"f{n}", text))
            c.execute("INSERT INTO episode_points (id, episode_id, user_id, text) VALUES (?, 'e1', 'u', ?)",
                      (f"ep:e1:{n}", text))
            c.execute("INSERT INTO items (id, user_id, ns_path, namespace, key, value, text, created_at, updated_at)"
                      " VALUES (?, 'u', 'u', '[\"u\"]', ?, '{}', ?, 0, 0)", (f"i{n}", f"k{n}", text))

    def facts_matching(match: str) -> list[tuple[str, float]]:  # LayerStore.keyword's query then
        return [(r[0], float(r[1])) for r in store.query(
            "SELECT t.id, -bm25(facts_fts) FROM facts_fts JOIN facts t ON t.rowid = facts_fts.rowid"
            " WHERE facts_fts MATCH ? AND t.user_id = 'u' ORDER BY bm25(facts_fts) LIMIT 3", [match])]
    before = facts_matching(" OR ".join(f'"{t}"' for t in keywords("marathons in Boston")))  # untagged then
    assert facts_matching('"出差"') == []  # the run held whole
    store.close()

    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    try:
        rows = open_layer_store(store)
        assert [i for i, _ in rows.keyword_facts("u", keywords("出差"), 3)] == ["f0"]
        assert [i for i, _ in rows.keyword_points("u", keywords("上海的客户"), 3)] == ["ep:e1:0"]
        assert [i for i, _ in rows.keyword_items("u", keywords("北京"), 3)] == ["i0"]
        # the same rows (the CJK row now holds more words, so BM25's average length moved)
        assert [i for i, _ in rows.keyword_facts("u", keywords("marathons in Boston"), 3)] == [i for i, _ in before]
        terms = fts_terms(store, "facts")
        assert {"北京", "出差", "boston", "marathon"} <= terms
        plain = {t for t in terms if t.isascii()}  # the English row's, stemmed
        with store.transaction() as c:
            c.execute("DELETE FROM facts WHERE id='f0'")
            c.execute("DELETE FROM episode_points WHERE id='ep:e1:0'")
            c.execute("UPDATE items SET text='东京见' WHERE id='i0'")
        assert fts_terms(store, "facts") == fts_terms(store, "episode_points") == plain
        assert fts_terms(store, "items") == plain | {"东京", "京见"}
    finally:
        store.close()


def test_a_layer_row_another_writer_left_undecodable_is_indexed_and_forgotten(tmp_path: Path) -> None:
    """The triggers read a CJK text's bytes: a fact whose text is not valid UTF-8 (written by
    other means) is indexed, found, and forgotten without a word left in the index."""
    store = SQLiteRecordStore(tmp_path / "s.sqlite3")
    try:
        rows = open_layer_store(store)
        with store.transaction() as c:
            c.execute("INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
                      " VALUES ('f1', 'u', 'fact', CAST(? AS TEXT), 1, 0, 0, 0)",
                      ("北京烤鸭".encode() + b"\xff" + "很好吃".encode(),))
            c.execute("INSERT INTO items (id, user_id, ns_path, namespace, key, value, text, created_at, updated_at)"
                      " VALUES ('i1', 'u', 'u', '[\"u\"]', 'k', '{}', NULL, 0, 0)")
        assert [i for i, _ in rows.keyword_facts("u", keywords("烤鸭"), 3)] == ["f1"]
        assert [i for i, _ in rows.keyword_facts("u", keywords("好吃"), 3)] == ["f1"]
        store.forget_user("u")
        assert fts_terms(store, "facts") == fts_terms(store, "items") == set()
    finally:
        store.close()


def test_a_query_of_a_whole_cjk_document_is_answered_by_every_keyword_search(memory: TieredMemory) -> None:
    """Every two characters of a CJK run are a term: a document pasted as the query (here 30,000
    characters, some 30,000 terms) made PostgreSQL's tsquery too deep to run ('stack depth limit
    exceeded', a StoreError) and took seconds in both stores. A query's first terms are searched."""
    memory.add("user", "我喜欢喝绿茶", session_id="s", user_id="u")
    memory.add_fact("我喜欢喝绿茶", user_id="u")
    memory.item_store().write_many([ItemWrite(namespace=("u", "notes"), key="k", user_id="u", value={},
                                              text="我喜欢喝绿茶")])
    query = "绿茶" + "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(30_000))
    assert "我喜欢喝绿茶" in [h.text for h in memory.search(query, user_id="u", include_items=True)]
    assert [h.fact.text for h in memory.search_facts(query, user_id="u")] == ["我喜欢喝绿茶"]
    assert memory.search_episodes(query, user_id="u") == []


def test_a_query_of_a_whole_document_is_embedded_by_its_opening(tmp_path: Path) -> None:
    """The vector side of a pasted document: the model was asked to embed all of it (30,000
    characters, one pass per window: seconds per query on a CPU), though the keywords were
    already cut. The embedder now gets the query's first MAX_QUERY_CHARS characters, cut
    between two characters, and the search still finds the turn its opening names."""
    counting = CountingEmbedder(StaticEmbedder())
    with TieredMemory(tmp_path / "m", embedder=counting) as memory:
        memory.add("user", "我喜欢喝绿茶", session_id="s", user_id="u")
        query = "绿茶" + "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(30_000)) + "👍🏽" * 2000
        counting.queries.clear()
        assert "我喜欢喝绿茶" in [h.text for h in memory.search(query, user_id="u")]
        memory.build_context(query, user_id="u", session_id="s2")
    assert counting.queries and all(q == query[:len(q)] and 0 < len(q) <= MAX_QUERY_CHARS for q in counting.queries)
    assert query_text("👍🏽" * 3000)[-2:] == "👍🏽"  # never half an emoji with its skin tone
