"""Several apps on one vector server, each with its own collection chosen by configuration
(``?collection=NAME`` on the server URL): what one app does to its vectors — add, rebuild_index,
forget_user, compaction, the full repair after an unclean close, the rebuild after an embedder
change — never touches another app's. A bad collection or URL query is a ConfigurationError
before anything is written, and no error shows a password or an API key."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

from tiered_memory import ConfigurationError, StaticEmbedder, TieredMemory
from tiered_memory.vector.chroma import ChromaVectorIndex
from tiered_memory.vector.qdrant import QdrantVectorIndex

from http_support import QuietHandler, serving
from servers import free_port

SECRET = "qk-s3cret-api-key"
NOTES = [
    {"role": "user", "content": "I grow chillies on my balcony in Valencia."},
    {"role": "assistant", "content": "Chillies love the Valencian sun."},
    {"role": "user", "content": "My partner Ines is a marine biologist."},
]
pytestmark = pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")


class RenamedStatic(StaticEmbedder):
    """The bundled static embedder under another name: to the store, another embedder."""

    @property
    def name(self) -> str:
        return "static-renamed"


def _unclean(folder: Path) -> None:
    """Make the next open of the SQLite store in ``folder`` see a crash (a full repair)."""
    con = sqlite3.connect(folder / "records.sqlite3")
    con.execute("UPDATE meta SET value='open' WHERE key='state'")
    con.commit()
    con.close()


def _churn_one_app(open_app1: Callable[..., TieredMemory], app2: TieredMemory, folder1: Path) -> None:
    """Everything app1 does that drops, deletes or rewrites vectors; app2's vectors, of the same
    user id, stay as they were after each step."""
    app2_ids = app2.add_many(NOTES, session_id="s", user_id="u1")
    app2.add_fact("Ines is a marine biologist", user_id="u1")
    kept = app2.index.ids()
    assert set(app2_ids) <= kept and any(i.startswith("fact:") for i in kept)

    app1 = open_app1()
    app1.add_many(NOTES, session_id="s", user_id="u1")
    app1.add_fact("Ines is a marine biologist", user_id="u1")
    assert app1.index.ids().isdisjoint(kept)
    app1.rebuild_index()
    assert app2.index.ids() == kept
    assert app1.forget_user("u1") == 3
    assert app2.index.ids() == kept
    app1.add_many(NOTES, session_id="s", user_id="u2")
    compact = getattr(app1.index, "compact", None)
    if compact is not None:  # Chroma: copies the live vectors into a new collection
        compact()
        assert app2.index.ids() == kept
    app1.close()
    _unclean(folder1)
    app1 = open_app1()  # the full repair deletes the vectors its own store does not hold
    assert app2.index.ids() == kept
    app1.close()
    app1 = open_app1(embedder=RenamedStatic())  # an embedder change: the index is rebuilt at open
    assert len(app1.index.ids()) == 3
    app1.close()
    assert app2.index.ids() == kept
    assert app2.search("what does my partner do?", user_id="u1", k=1)[0].id == app2_ids[2]


@pytest.mark.servers
def test_two_apps_on_one_chroma_server_keep_their_own_collections(
        tmp_path: Path, chroma_url: str, chroma_collection: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import chromadb

    first, second = f"{chroma_collection}-app1", f"{chroma_collection}-app2"
    monkeypatch.setenv("TIERED_MEMORY_VECTOR_STORE", f"{chroma_url}?collection={second}")
    app2 = TieredMemory(tmp_path / "app2", embedder=StaticEmbedder())  # configured by the environment

    def open_app1(embedder: Any = None) -> TieredMemory:
        return TieredMemory(tmp_path / "app1", embedder=embedder or StaticEmbedder(),
                            vector_store=f"{chroma_url}/?collection={first}")

    try:
        assert isinstance(app2.index, ChromaVectorIndex) and app2.index.collection.name == second
        _churn_one_app(open_app1, app2, tmp_path / "app1")
        host, port = chroma_url.removeprefix("http://").rsplit(":", 1)
        names = {c.name for c in chromadb.HttpClient(host=host, port=int(port)).list_collections()}
        assert {first, second} <= names
        assert app2.index.count() == len(app2.index.ids())
    finally:
        app2.close()


def test_two_apps_on_one_qdrant_keep_their_own_collections(tmp_path: Path) -> None:
    from qdrant_client import QdrantClient

    client = QdrantClient(location=":memory:")  # one engine, two apps (a server serves them alike)
    app2 = TieredMemory(tmp_path / "app2", embedder=StaticEmbedder(),
                        vector_store=QdrantVectorIndex(client=client, collection="app2"))

    def open_app1(embedder: Any = None) -> TieredMemory:
        return TieredMemory(tmp_path / "app1", embedder=embedder or StaticEmbedder(),
                            vector_store=QdrantVectorIndex(client=client, collection="app1"))

    try:
        _churn_one_app(open_app1, app2, tmp_path / "app1")  # (closing app1 leaves the shared client open)
        assert {c.name for c in client.get_collections().collections} == {"app1", "app2"}
    finally:
        app2.close()


@pytest.mark.parametrize(("setting", "problem"), [
    ("http://127.0.0.1:{port}?collection=a/b", "a Chroma collection name has 3-512 characters"),
    ("http://127.0.0.1:{port}?collection=ab", "a Chroma collection name has 3-512 characters"),
    ("http://127.0.0.1:{port}/?collection=app..one", "holds no '..'"),
    ("http://127.0.0.1:{port}?collection=10.0.0.1", "is not an IPv4 address"),
    ("https://127.0.0.1:{port}?collection=", "a Chroma collection name has 3-512 characters"),
    ("qdrant+http://127.0.0.1:{port}?collection=app:one", "a Qdrant collection name holds none of"),
    ("qdrant+https://127.0.0.1:{port}?collection=..", "a Qdrant collection name has 1-255 characters"),
    ("qdrant+http://127.0.0.1:{port}?collection=" + "q" * 256, "a Qdrant collection name has 1-255"),
    ("http://app:{secret}@127.0.0.1:{port}?collection=app1&api_key={secret}", "takes one query parameter"),
    ("qdrant+http://127.0.0.1:{port}?{secret}", "cannot be read"),
    ("qdrant+http://127.0.0.1:{port}?collection=app1&collection=app2", "takes one query parameter"),
    ("http://127.0.0.1:{port}?collection=app1#{secret}", "takes one query parameter"),
    ("redis://app:{secret}@127.0.0.1:{port}/0?key={secret}", "vector_store must be"),
])
@pytest.mark.parametrize("via", ["argument", "environment"])
def test_a_bad_server_url_or_collection_fails_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, problem: str, via: str) -> None:
    setting = setting.format(port=free_port(), secret=SECRET)  # nothing listens there
    kwargs: dict[str, Any] = {"vector_store": setting}
    if via == "environment":
        monkeypatch.setenv("TIERED_MEMORY_VECTOR_STORE", setting)
        kwargs = {}
    with pytest.raises(ConfigurationError, match="collection|vector server URL|vector_store") as info:
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), **kwargs)
    assert problem in str(info.value)
    assert SECRET not in str(info.value)
    assert not (tmp_path / "m").exists()  # no folder, no record store: nothing was written


def test_a_record_store_setting_of_another_engine_shows_no_password(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="record_store must be") as info:
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), record_store=f"mysql://app:{SECRET}@db/app")
    assert SECRET not in str(info.value) and "mysql://db/app" in str(info.value)


@pytest.mark.parametrize("open_index", [
    lambda url, **kw: ChromaVectorIndex.from_url(url, **kw),
    lambda url, **kw: QdrantVectorIndex.from_url(url, **kw),
], ids=["chroma", "qdrant"])
def test_from_url_takes_the_collection_from_the_url_or_the_argument_once(open_index: Any) -> None:
    url = f"http://127.0.0.1:{free_port()}?collection=app1"
    with pytest.raises(ConfigurationError, match="the URL names collection 'app1' and collection= names 'app2'"):
        open_index(url, collection="app2")
    with pytest.raises(ConfigurationError, match="collection .a/b. cannot be used"):
        open_index(url.replace("app1", "a/b"))


def test_an_index_built_with_a_bad_collection_name_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="a Chroma collection name has 3-512 characters"):
        ChromaVectorIndex(str(tmp_path / "c"), collection="x")
    with pytest.raises(ConfigurationError, match="a Qdrant collection name holds none of"):
        QdrantVectorIndex(str(tmp_path / "q"), collection="a/b")
    assert not (tmp_path / "c").exists() and not (tmp_path / "q").exists()


def test_an_index_with_the_longest_collection_name_compacts(tmp_path: Path) -> None:
    """Compaction copies into a scratch collection named after the index's: with a name of
    Chroma's longest, the scratch name must stay within Chroma's limit too."""
    import numpy as np

    from tiered_memory.vector.base import VectorItem

    name = "a" * 512
    index = ChromaVectorIndex(str(tmp_path / "v"), collection=name)
    try:
        index.upsert([VectorItem(id=f"m{i}", vector=np.eye(4, dtype=np.float32)[i], user_id="u1", session_id="s1")
                      for i in range(3)])
        index.delete(["m0"])
        assert index.compact() == 2
        assert index.collection.name == name and index.ids("u1") == {"m1", "m2"}
    finally:
        index.close()


@pytest.mark.servers
def test_a_shared_store_opened_on_another_collection_says_to_rebuild_it(
        make_postgres_url: Any, chroma_url: str, chroma_collection: str, caplog: Any) -> None:
    """README, Several apps on one vector server: a PostgreSQL app that moves to another
    collection calls rebuild_index() once; an open on a collection its records were not indexed
    into says so, and one on the collection it left behind (which still holds a forgotten turn
    and lacks a later one) says so again, as the index it is not in line with."""
    pg = make_postgres_url()
    first, second = f"{chroma_url}?collection={chroma_collection}", f"{chroma_url}?collection={chroma_collection}-b"

    def opened(url: str) -> tuple[TieredMemory, list[str]]:
        with caplog.at_level("WARNING", logger="tiered_memory"):
            caplog.clear()
            memory = TieredMemory(record_store=pg, vector_store=url, embedder=StaticEmbedder())
        return memory, [r.getMessage() for r in caplog.records if "rebuild_index()" in r.getMessage()]

    with TieredMemory(record_store=pg, vector_store=first, embedder=StaticEmbedder()) as memory:
        gone = memory.add("user", "I keep bees on the roof in Lisbon", user_id="u1", session_id="s")
    memory, told = opened(second)
    with memory:
        assert told and memory.index.ids() == set()
        memory.forget(gone, user_id="u1")
        kept = memory.add("user", "My sister plays the cello", user_id="u1", session_id="s")
        memory.rebuild_index()
        assert memory.index.ids() == {kept}
    memory, told = opened(second)
    with memory:
        assert not told
    memory, told = opened(first)  # left behind: the forgotten turn's vector, not the new one's
    with memory:
        assert told and memory.index.ids() == {gone}
        memory.rebuild_index()
        assert memory.index.ids() == {kept}


@pytest.mark.servers
def test_a_chroma_server_that_goes_away_is_named_in_every_error_without_its_password(
        chroma_url: str, chroma_collection: str) -> None:
    """Through a proxy to the real server, closed after the first write: each call fails with a
    VectorIndexError that says which server (a deployment may use several), password-free."""
    from urllib.parse import urlsplit

    import numpy as np

    from tiered_memory import VectorIndexError
    from tiered_memory.vector.base import VectorItem

    from test_pg_network import SilentProxy

    proxy = SilentProxy(int(urlsplit(chroma_url).port or 8000))
    index = ChromaVectorIndex.from_url(f"http://admin:{SECRET}@127.0.0.1:{proxy.port}/?collection={chroma_collection}")
    vector = np.ones(4, dtype=np.float32) / 2
    try:
        index.upsert([VectorItem(id="a", vector=vector, user_id="u1")])
        proxy.close()
        calls: dict[str, Callable[[], Any]] = {
            "query": lambda: index.query(vector[None, :], user_id="u1", k=1),
            "upsert": lambda: index.upsert([VectorItem(id="b", vector=vector, user_id="u1")]),
            "delete": lambda: index.delete(["a"]), "delete_user": lambda: index.delete_user("u1"),
            "ids": lambda: index.ids("u1"), "count": lambda: index.count("u1")}
        for name, call in calls.items():
            with pytest.raises(VectorIndexError) as failed:
                call()
            assert f"127.0.0.1:{proxy.port}" in str(failed.value) and SECRET not in str(failed.value), name
    finally:
        proxy.close()
        index.close()


class _OpensOnce(QuietHandler):
    """A Qdrant server as far as an open asks ("does the collection exist?": yes); the test
    then closes it, so every later call meets a closed port."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.reply_json({"result": {"exists": True}, "status": "ok", "time": 0})


def test_a_qdrant_server_failing_after_the_open_is_named_without_its_secrets() -> None:
    """With several servers, an error says which one failed: its URL, with no password or API key."""
    import numpy as np
    from qdrant_client import QdrantClient

    with serving(_OpensOnce) as port:  # (closed after the open: the port then refuses)
        # (a URL's user part is refused: qdrant-client never sends it; a client made with one may still be passed)
        client = QdrantClient(url=f"http://app:{SECRET}@127.0.0.1:{port}", api_key=SECRET, check_compatibility=False)
        index = QdrantVectorIndex(client=client, collection="app1")
    from tiered_memory.errors import VectorIndexError
    from tiered_memory.vector.base import VectorItem

    item = VectorItem(id="m1", vector=np.ones(4, dtype=np.float32), user_id="u1", session_id="s1")
    calls: list[Callable[[], object]] = [
        lambda: index.count("u1"), lambda: index.ids("u1"), lambda: index.first_ids(2), lambda: index.owner(),
        lambda: index.query(np.ones((1, 4), dtype=np.float32), user_id="u1", k=2),
        lambda: index.delete(["m1"]), lambda: index.delete_user("u1"), lambda: index.upsert([item])]
    for call in calls:
        with pytest.raises(VectorIndexError) as info:
            call()
        assert f"http://127.0.0.1:{port}" in str(info.value) and "'app1'" in str(info.value)
        assert SECRET not in str(info.value)
