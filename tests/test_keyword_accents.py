"""Keyword search folds diacritics alike on both record stores: SQLite's FTS5 (``unicode61``)
and PostgreSQL (``fold_diacritics()``, store/postgres_keywords.py), so ``cafe`` finds
"Café" and ``café`` finds "Cafe" for turns, facts, episode key points and items, whether
the accent is typed precomposed (``é``, U+00E9) or decomposed (``e`` + U+0301, as macOS
often sends it), and a store of the previous schema is migrated on open."""

from __future__ import annotations

import sqlite3
import unicodedata
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import TieredMemory
from tiered_memory.backends import open_layer_store
from tiered_memory.layers.items import ItemWrite
from tiered_memory.records import Episode
from tiered_memory.store.postgres import MIGRATIONS, PostgresRecordStore
from tiered_memory.store.postgres_db import PostgresDatabase
from tiered_memory.store.postgres_layers import ITEM_MIGRATIONS, LAYER_MIGRATIONS, PostgresLayerStore
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.store.sqlite_keywords import recompose
from tiered_memory.store.sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from tiered_memory.store.text_search import _WORD, LENGTH_PAD, diacritic_fold
from tiered_memory.types import StoredMessage

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

TEXTS = {
    "cafe_accent": "Lunch at the Café de Flore",
    "cafe_plain": "Coffee at Cafe Nero",
    "naive": "a naïve question about taxes",
    "zurich": "the Zürich office moves",
    "sao_paulo": "flight to São Paulo on Monday",
    "greek": "ο λόγος του",
    "cyrillic": "встреча в москве",
    "cjk": "trip to 東京 soon",
    "danish": "a week in København",
}
CAFES = {"cafe_accent", "cafe_plain"}
QUERIES = [
    ("cafe", CAFES), ("café", CAFES), ("CAFÉ", CAFES), ("Cafe", CAFES),
    ("naive", {"naive"}), ("naïve", {"naive"}), ("NAÏVE", {"naive"}),
    ("zurich", {"zurich"}), ("Zürich", {"zurich"}), ("ZÜRICH", {"zurich"}),
    ("sao", {"sao_paulo"}), ("São Paulo", {"sao_paulo"}), ("SAO", {"sao_paulo"}),
    # other scripts match as before; FTS5 folds no Greek accent and no ø, so neither does PostgreSQL
    ("λόγος", {"greek"}), ("λογος", set()), ("москве", {"cyrillic"}), ("東京", {"cjk"}),
    ("København", {"danish"}), ("Kobenhavn", set()),
]


def test_the_fold_map_is_what_fts5_unicode61_folds() -> None:
    """Every letter outside ASCII, run through SQLite's own tokenizer: those it folds to
    another letter by removing a diacritic are exactly the map's letters, to the same base;
    and the marks the map deletes are those FTS5 drops from decomposed text."""
    con = sqlite3.connect(":memory:")
    con.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61')")
    con.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    letters = [chr(c) for c in range(0x80, 0x30000) if unicodedata.category(chr(c)).startswith("L")]
    marks = [chr(c) for c in range(0x300, 0x370)]
    con.executemany("INSERT INTO t (rowid, x) VALUES (?, ?)",
                    [(n, ch) for n, ch in enumerate(letters, 1)]
                    + [(len(letters) + n, "a" + m + "b") for n, m in enumerate(marks, 1)])
    terms: dict[int, list[str]] = {}
    for term, doc in con.execute("SELECT term, doc FROM v"):
        terms.setdefault(doc, []).append(term)
    # a diacritic removed: not a case fold (ſ -> s, and so ẛ, long s with a dot, -> s)
    nfd = {ch: unicodedata.normalize("NFD", ch) for ch in letters}
    by_fts5 = {ch: terms[n][0] for n, ch in enumerate(letters, 1)
               if n in terms and len(nfd[ch]) > 1 and terms[n][0] == nfd[ch][0].lower()}
    dropped = {m for n, m in enumerate(marks, 1) if terms.get(len(letters) + n) == ["ab"]}
    src, bases = diacritic_fold()
    assert {ch: b.lower() for ch, b in zip(src, bases)} == by_fts5
    assert set(src[len(bases):]) == dropped
    assert len(bases) == 375 and "ø" not in src and "ệ" not in src and "ά" not in src


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    m = make_memory()
    for key, text in TEXTS.items():
        m.add("user", text, user_id="u", session_id=key)
    m.add("user", "Café, café and more café", user_id="u", session_id="many")
    m.add("user", "Café for someone else", user_id="other", session_id="s")
    return m


def turn_keys(memory: TieredMemory, query: str) -> set[str]:
    sessions = {m.id: m.session_id for m in memory.store.iter_messages("u")}
    return {sessions[i] for i, _ in memory.store.keyword_search("u", [query], k=50)} - {"many"}


@pytest.mark.parametrize("query, expected", QUERIES)
def test_turns_match_with_or_without_diacritics(memory: TieredMemory, query: str, expected: set[str]) -> None:
    assert turn_keys(memory, query) == expected


def test_search_ranks_accented_and_plain_queries_alike(memory: TieredMemory) -> None:
    ranked = {q: memory.store.keyword_search("u", [q], k=10) for q in ("cafe", "café", "CAFÉ")}
    assert ranked["cafe"] == ranked["café"] == ranked["CAFÉ"] and len(ranked["cafe"]) == 3
    many = memory.store.keyword_search("u", ["cafe"], k=1)[0][0]
    assert memory.store.get_by_ids("u", [many])[many].content == "Café, café and more café"  # most matches first
    hits = memory.search("Zurich", user_id="u", k=3)
    keyword_hits = [h.text for h in hits if "keyword" in h.explanation["signals"]]
    assert keyword_hits == ["the Zürich office moves"]  # a keyword hit through search, not only by meaning


def test_facts_key_points_and_items_match_with_or_without_diacritics(memory: TieredMemory) -> None:
    rows = open_layer_store(memory.store)
    fact = memory.add_fact("User loves the Café de Flore", user_id="u")
    memory.add_fact("User lives in Zurich", user_id="u")
    with rows.unit() as unit:
        unit.insert_episode(Episode(id="e1", user_id="u", session_id="s", summary="Trip to Zürich"),
                            [("ep:e1:0", "Trip to Zürich"), ("ep:e1:1", "dinner at a cafe")])
    memory.item_store().write_many([
        ItemWrite(namespace=("u", "notes"), key="k1", user_id="u", value={}, text="São Paulo office"),
        ItemWrite(namespace=("u", "notes"), key="k2", user_id="u", value={}, text="Sao Tome trip")])
    ids_of = {h.item.text: h.item.id for h in memory.item_store().search(("u",))}
    assert {i for i, _ in rows.keyword_facts("u", ["CAFE"], 10)} == {fact.id}
    assert len(rows.keyword_facts("u", ["zürich"], 10)) == 1
    assert {i for i, _ in rows.keyword_points("u", ["zurich"], 10)} == {"ep:e1:0"}
    assert {i for i, _ in rows.keyword_points("u", ["café"], 10)} == {"ep:e1:1"}
    both = {ids_of["São Paulo office"], ids_of["Sao Tome trip"]}
    assert {i for i, _ in rows.keyword_items("u", ["são"], 10)} == both


# ---- precomposed and decomposed accents -----------------------------------------------------
ACCENTED = {"cafe": ("Lunch at the Café", "Café"), "naive": ("a naïve question", "naïve"),
            "zurich": ("the Zürich office", "Zürich"), "sao": ("flight to São Paulo", "São")}


def nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


@pytest.mark.parametrize("stored", ["precomposed", "decomposed"])
def test_a_decomposed_accent_matches_as_a_precomposed_one(make_memory: Callable[..., TieredMemory],
                                                          stored: str) -> None:
    """Each of the four: stored precomposed or decomposed, asked precomposed, decomposed or
    plain; the stored text itself stays byte for byte what was written."""
    m = make_memory()
    texts = {key: nfd(t) if stored == "decomposed" else t for key, (t, _) in ACCENTED.items()}
    for key, text in texts.items():
        m.add("user", text, user_id="u", session_id=key)
    m.add_fact(texts["naive"], user_id="u")
    sessions = {x.id: x.session_id for x in m.store.iter_messages("u")}
    rows = open_layer_store(m.store)
    for key, (_, word) in ACCENTED.items():
        for query in (word, nfd(word), key):
            assert {sessions[i] for i, _ in m.store.keyword_search("u", [query], k=10)} == {key}, (stored, ascii(query))
        assert [x.content for x in m.get_messages(key, user_id="u")] == [texts[key]]  # byte-identical
        keyword_hits = [h.text for h in m.search(nfd(word), user_id="u", k=4)
                        if "keyword" in h.explanation["signals"]]
        assert keyword_hits == [texts[key]], (stored, ascii(word))  # through search's own query words too
    for query in ("naïve", nfd("naïve"), "naive"):
        assert len(rows.keyword_facts("u", [query], 10)) == 1, (stored, ascii(query))


def test_a_sqlite_store_indexed_before_finds_its_decomposed_accents_when_it_opens(tmp_path: Path) -> None:
    """Keywords written before words were composed (a mark split ``naïve`` in two) are
    computed again on open, for the rows whose text is not in NFC only."""
    path = tmp_path / "s.sqlite3"
    texts = {"m1": nfd("a naïve question"), "m2": "the Zürich office", "m3": "plain text"}
    store = SQLiteRecordStore(path)
    store.insert_messages([StoredMessage(id=i, user_id="u", session_id="s", role="user", content=t, metadata={},
                                         timestamp=float(n)) for n, (i, t) in enumerate(texts.items())])
    store.close()
    con = sqlite3.connect(path, isolation_level=None)  # the keywords as earlier versions wrote them
    for rowid, content in con.execute("SELECT rowid, content FROM messages").fetchall():
        old = " ".join(["1q"] * LENGTH_PAD + ["1q" + w for w in _WORD.findall(content)])
        con.execute("UPDATE messages SET keywords=? WHERE rowid=?", (old, rowid))
    con.execute("DELETE FROM schema_migrations WHERE name='core' AND version>=?",
                (SQLITE_MIGRATIONS.index(recompose) + 1,))
    con.close()
    store = SQLiteRecordStore(path)
    try:
        for query in ("naive", "naïve", nfd("naïve")):
            assert [i for i, _ in store.keyword_search("u", [query], k=3)] == ["m1"]
        assert [i for i, _ in store.keyword_search("u", ["zurich"], k=3)] == ["m2"]
        assert {i: m.content for i, m in store.get_by_ids("u", list(texts)).items()} == texts  # unchanged
    finally:
        store.close()


# ---- a PostgreSQL store of the previous schema -------------------------------------------------
def old_postgres(url: str) -> None:
    """A store as the code before folding wrote it: the earlier migrations, rows in each
    table with a keyword column."""
    db = PostgresDatabase(url)
    try:
        db.migrate("core", MIGRATIONS[:3])
        db.migrate("layers", LAYER_MIGRATIONS[:2])
        db.migrate("items", ITEM_MIGRATIONS[:2])

        def fill(c: Any) -> None:
            c.cursor().executemany(
                "INSERT INTO messages (id, user_id, session_id, role, content, timestamp, created_at, indexed)"
                " VALUES (%s, 'u', 's', 'user', %s, 0, 0, TRUE)",
                [("m1", "Lunch at the Café de Flore"), ("m2", "Coffee at Cafe Nero"), ("m3", "the Zürich office")])
            c.execute("INSERT INTO facts (id, user_id, type, text, confidence, created_at, updated_at, valid_from)"
                      " VALUES ('f1', 'u', 'fact', 'User loves the Café de Flore', 1, 0, 0, 0)")
            c.execute("INSERT INTO episode_points (id, episode_id, user_id, text)"
                      " VALUES ('ep:e1:0', 'e1', 'u', 'Trip to Zürich')")
            c.execute("INSERT INTO items (id, user_id, ns_path, namespace, key, value, text, created_at, updated_at)"
                      " VALUES ('i1', 'u', 'u', '[\"u\"]', 'k', '{}', 'São Paulo office', 0, 0)")
        db.write(fill)
        assert db.query("SELECT count(*) FROM messages WHERE tsv @@ to_tsquery('english', 'cafe')")[0][0] == 1
    finally:
        db.close()


@pytest.mark.servers
@pytest.mark.parametrize("server", ["make_postgres_url", "make_pgvector_url"])
def test_a_postgres_store_of_the_previous_schema_is_migrated_and_folds(request: pytest.FixtureRequest,
                                                                     server: str) -> None:
    url = request.getfixturevalue(server)()
    old_postgres(url)
    store = PostgresRecordStore(url)
    try:
        rows = PostgresLayerStore(store)
        assert store.schema_version("core") == len(MIGRATIONS)
        assert store.schema_version("layers") == len(LAYER_MIGRATIONS)
        assert store.schema_version("items") == len(ITEM_MIGRATIONS)
        assert [m.content for m in store.get_messages("u", "s")] == [
            "Lunch at the Café de Flore", "Coffee at Cafe Nero", "the Zürich office"]  # no row lost or changed
        for query in ("cafe", "café", "CAFÉ"):
            assert {i for i, _ in store.keyword_search("u", [query], k=10)} == {"m1", "m2"}
        assert [i for i, _ in store.keyword_search("u", ["zurich"], k=10)] == ["m3"]
        assert [i for i, _ in rows.keyword_facts("u", ["cafe"], 10)] == ["f1"]
        assert [i for i, _ in rows.keyword_points("u", ["zurich"], 10)] == ["ep:e1:0"]
        assert [i for i, _ in rows.keyword_items("u", ["sao"], 10)] == ["i1"]
        indexes = {r[0] for r in store.query("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
                                             " AND indexdef LIKE %s", ("%gin (tsv)%",))}
        assert indexes == {"messages_tsv", "facts_tsv", "episode_points_tsv", "items_tsv"}
    finally:
        store.close()
