"""The static embedder (the default): the shipped table, its pooling, its errors, and the
default path without torch."""

from __future__ import annotations

import io
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from extras import import_extra

from tiered_memory import (ConfigurationError, EmbeddingError, SentenceTransformerEmbedder, StaticEmbedder,
                           TieredMemory, default_embedder, embedder_name)
from tiered_memory.embedding import EMBEDDER_ENV, embed, embed_query
from tiered_memory.embedding.static import BUNDLED_DIR, BUNDLED_NAME, TABLE_FILE, TOKENIZER_FILE, pool

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def static() -> StaticEmbedder:
    return StaticEmbedder()


def test_vectors_are_unit_float32_rows_one_per_text(static):
    out = static.embed_array(["I live in Lisbon", "The tomatoes need watering twice a week.", ""])
    assert out.dtype == np.float32 and out.shape == (3, 256)
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)  # the empty text too: never zero
    assert static.embed_array([]).shape == (0, 0)


def test_the_list_methods_and_the_helpers_give_the_same_vectors(static):
    texts = ["my sister Ana moved to Porto", "we adopted a cat called Miso"]
    arrays = static.embed_array(texts)
    assert np.allclose(np.asarray(static.embed_documents(texts), dtype=np.float32), arrays, atol=1e-6)
    assert np.allclose(static.embed_query(texts[1]), arrays[1], atol=1e-6)
    assert np.allclose(embed(static, texts), arrays) and np.allclose(embed_query(static, texts[0]), arrays[0])


def test_related_texts_are_nearer_than_unrelated_ones(static):
    query, near, far = static.embed_array(["where does my sister live now?",
                                           "My sister moved to Porto last spring.",
                                           "The tomatoes need watering twice a week."])
    assert float(query @ near) > float(query @ far) + 0.05


def test_a_fact_late_in_a_long_text_still_counts(static):
    # a static table has no window: every token of a long text is in its vector
    filler = "We talked about the weather, the garden, compost and the lawnmower. " * 60
    with_fact, without = static.embed_array([filler + "My gym locker code is 4471.", filler])
    query = static.query_array("what is my gym locker code?")
    assert float(query @ with_fact) > float(query @ without)


@pytest.mark.parametrize("ids, expected", [
    ([[0]], [[1.0, 0.0]]),
    ([[0, 1]], [[0.6, 0.8]]),  # (3, 0) + (0, 4) -> (3, 4) / 5
    ([[0, 2, 1]], [[0.6, 0.8]]),  # the unknown token (2) is skipped
    ([[2], []], [[0.0, 1.0], [0.0, 1.0]]),  # nothing known: the unknown row, not a zero vector
])
def test_pool_is_the_unit_mean_of_known_token_rows(ids, expected):
    rows = np.asarray([[3.0, 0.0], [0.0, 4.0], [0.0, 2.0]], dtype=np.float32)
    assert np.allclose(pool(rows, ids, unknown_id=2), expected)


def test_the_constructor_reads_nothing_and_a_missing_table_says_how_to_rebuild(tmp_path):
    embedder = StaticEmbedder(tmp_path / "nowhere")  # no error yet: cheap constructor
    assert embedder.name.startswith("static:")
    with pytest.raises(EmbeddingError, match="build_static_embedder"):
        embedder.embed_array(["hello"])


def test_a_table_that_does_not_match_its_tokenizer_is_refused(tmp_path):
    shutil.copyfile(BUNDLED_DIR / TOKENIZER_FILE, tmp_path / TOKENIZER_FILE)
    np.savez(tmp_path / TABLE_FILE, rows=np.zeros((10, 4), dtype=np.float16))
    with pytest.raises(EmbeddingError, match="rebuild the table"):
        StaticEmbedder(tmp_path).embed_array(["hello"])


def test_a_rebuilt_float16_table_in_another_folder_loads(tmp_path, static):
    shutil.copyfile(BUNDLED_DIR / TOKENIZER_FILE, tmp_path / TOKENIZER_FILE)
    rows = static.table.rows.astype(np.float16)
    np.savez(tmp_path / TABLE_FILE, rows=rows)
    other = StaticEmbedder(tmp_path)
    assert other.name != static.name
    text = ["a float16 copy of the shipped table"]
    assert np.allclose(other.embed_array(text), static.embed_array(text), atol=2e-3)


def test_default_embedder_is_static_and_the_environment_can_choose_minilm(monkeypatch):
    monkeypatch.delenv(EMBEDDER_ENV, raising=False)
    assert isinstance(default_embedder(), StaticEmbedder)
    monkeypatch.setenv(EMBEDDER_ENV, "MiniLM")
    chosen = default_embedder(batch_size=4)
    assert isinstance(chosen, SentenceTransformerEmbedder) and chosen.batch_size == 4
    monkeypatch.setenv(EMBEDDER_ENV, "bert")
    with pytest.raises(ConfigurationError, match="static, minilm"):
        default_embedder()


def test_a_memory_without_an_embedder_uses_the_static_one_and_records_it(tmp_path, monkeypatch):
    monkeypatch.delenv(EMBEDDER_ENV, raising=False)
    with TieredMemory(tmp_path / "m") as memory:
        assert embedder_name(memory.embedder) == BUNDLED_NAME
        memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")
        memory.add("user", "The tomatoes need watering twice a week.", user_id="u", session_id="s")
        assert memory.search("which city did my sister move to?", user_id="u", k=1)[0].text.startswith("My sister")
        assert memory.store.get_meta("embedder") == BUNDLED_NAME


def test_switching_embedders_on_a_store_re_embeds_it_and_says_so(tmp_path, caplog):
    import_extra("sentence_transformers")  # the [minilm] extra (absent in make test-notorch)
    embedder = SentenceTransformerEmbedder()
    path = tmp_path / "m"
    with TieredMemory(path, embedder=embedder) as memory:  # a store made by MiniLM (384 dims)
        memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")
        memory.add("user", "The tomatoes need watering twice a week.", user_id="u", session_id="s")
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        with TieredMemory(path, embedder=StaticEmbedder()) as memory:
            assert memory.store.get_meta("embedder") == BUNDLED_NAME
            assert memory.search("which city did my sister move to?", user_id="u", k=1)[0].text.startswith("My sister")
    assert any("embedder changed" in r.getMessage() and BUNDLED_NAME in r.getMessage() for r in caplog.records)



class _Words:
    """An application's own embedder (a bag of letters: no model), named as embedder_name reads it."""

    name = "app-embedder"

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return [1.0 + text.lower().count(c) for c in "aeiourstln"]


@pytest.mark.parametrize(("first", "then", "hint"), [
    ("static", "app", "TIERED_MEMORY_EMBEDDER=static"),  # it named minilm, which never made these vectors
    ("app", "static", "embedder=<the embedder 'app-embedder'>"),
])
def test_the_embedder_change_warning_names_how_to_keep_the_old_vectors(tmp_path, caplog, first, then, hint):
    def make(kind: str):
        return StaticEmbedder() if kind == "static" else _Words()

    path = tmp_path / "m"
    with TieredMemory(path, embedder=make(first)) as memory:
        memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        with TieredMemory(path, embedder=make(then)):
            pass
    [warning] = [r.getMessage() for r in caplog.records if "embedder changed" in r.getMessage()]
    assert hint in warning and "minilm" not in warning, warning


BLOCK_TORCH = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "sentence_transformers"):
            raise ImportError(f"{name} is blocked: the default path must not need it")
sys.meta_path.insert(0, Block())
"""


def test_the_default_path_works_with_torch_and_transformers_unimportable(tmp_path):
    """What ``make test-notorch`` proves with a virtualenv that has no torch at all."""
    code = BLOCK_TORCH + textwrap.dedent(f"""
        from tiered_memory import TieredMemory
        with TieredMemory({str(tmp_path / "m")!r}) as memory:
            memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")
            print(memory.search("where did my sister move?", user_id="u", k=1)[0].text)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))
    """)
    env = {k: v for k, v in os.environ.items() if k != EMBEDDER_ENV}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["My sister moved to Porto last spring.", "[]"]


def test_minilm_without_its_extra_names_the_extra(tmp_path):
    code = BLOCK_TORCH + textwrap.dedent("""
        from tiered_memory import SentenceTransformerEmbedder, MissingDependencyError
        try:
            SentenceTransformerEmbedder(".").embed_query("hello")
        except MissingDependencyError as e:
            print(e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert 'pip install "tiered-memory[minilm]"' in proc.stdout


def test_the_shipped_table_is_what_its_description_says(static):
    import json

    info = json.loads((BUNDLED_DIR / "static-minilm.json").read_text())
    assert static.table.rows.shape == (info["vocab"], info["dims"]) == (30522, 256)
    assert info["dtype"] == "int8" and info["license"].startswith("Apache-2.0")
    assert static.table.tokenizer.get_vocab_size() == info["vocab"]


def test_a_store_made_by_the_bundled_minilm_keeps_it_when_opened_without_an_embedder(tmp_path, monkeypatch, caplog):
    """Opened without embedder= (as the CLI always opens a memory), a MiniLM store was re-embedded
    whole with the static table, and the application that made it re-embedded it again on its
    next open. Now only an explicit embedder or TIERED_MEMORY_EMBEDDER changes a store's embedder."""
    import_extra("sentence_transformers")
    from tiered_memory.cli import main

    monkeypatch.delenv(EMBEDDER_ENV, raising=False)
    path = tmp_path / "m"
    with TieredMemory(path, embedder=SentenceTransformerEmbedder()) as memory:
        memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")
        memory.add("user", "The tomatoes need watering twice a week.", user_id="u", session_id="s")
        made = memory.store.get_meta("embedder")
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        with TieredMemory(path) as memory:
            assert embedder_name(memory.embedder) == made
            assert memory.search("which city did my sister move to?", user_id="u", k=1)[0].text.startswith("My sister")
        out = io.StringIO()
        assert main(["--path", str(path), "search", "which city did my sister move to?", "--user", "u"],
                    stdout=out, stderr=io.StringIO()) == 0
        assert "Porto" in out.getvalue()
    assert not [r for r in caplog.records if "embedder changed" in r.getMessage()]
    with TieredMemory(path, embedder=StaticEmbedder()) as memory:  # an explicit embedder still re-embeds
        assert memory.store.get_meta("embedder") == BUNDLED_NAME
    with TieredMemory(path) as memory:  # and a static store stays static
        assert embedder_name(memory.embedder) == BUNDLED_NAME


class _OwnEmbedder(StaticEmbedder):
    """An application's own embedder (a provider's, say), under a name of its own."""

    @property
    def name(self) -> str:
        return "acme-embed-v2"


def test_a_store_made_by_another_embedder_is_refused_without_one_not_re_embedded(tmp_path, monkeypatch, caplog):
    """Opened without embedder=, a store whose vectors an application's own embedder made was
    re-embedded whole with the static table (and by the application again, at its provider's
    cost, on its next open). Now it is a ConfigurationError saying how to open it, and the
    vectors stay; an explicit embedder or TIERED_MEMORY_EMBEDDER still re-embeds."""
    from tiered_memory.cli import main

    monkeypatch.delenv(EMBEDDER_ENV, raising=False)
    path = tmp_path / "m"
    with TieredMemory(path, embedder=_OwnEmbedder()) as memory:
        memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")
        vectors = memory.index.count()
    with pytest.raises(ConfigurationError, match="acme-embed-v2.*embedder="):
        TieredMemory(path)
    err = io.StringIO()  # the CLI: a search needs the embedder (a usage error); a read of rows does not
    assert main(["--path", str(path), "search", "Porto", "--user", "u"], stdout=io.StringIO(), stderr=err) == 2
    assert "acme-embed-v2" in err.getvalue() and "--embedder" in err.getvalue()
    assert main(["--path", str(path), "sessions", "--user", "u"], stdout=io.StringIO(), stderr=io.StringIO()) == 0
    with caplog.at_level(logging.WARNING, logger="tiered_memory"):
        with TieredMemory(path, embedder=_OwnEmbedder()) as memory:  # the vectors were kept
            assert memory.index.count() == vectors and memory.store.get_meta("embedder") == "acme-embed-v2"
            assert memory.search("which city did my sister move to?", user_id="u", k=1)[0].text.startswith("My")
    assert not [r for r in caplog.records if "embedder changed" in r.getMessage()]
    monkeypatch.setenv(EMBEDDER_ENV, "static")
    with TieredMemory(path) as memory:  # asked for: re-embedded with the default
        assert memory.store.get_meta("embedder") == BUNDLED_NAME


@pytest.mark.servers
def test_on_postgresql_a_changed_embedder_rebuilds_an_index_of_ones_own_and_warns_of_a_shared_one(
        tmp_path, make_postgres_url, make_pgvector_url, caplog):
    """README, Troubleshooting (a different embedder): a PostgreSQL store with the embedded
    Chroma (one process's index) is re-embedded at open, as a folder is; one whose vectors are
    shared (pgvector here, a vector server alike) is not: the open logs a warning naming
    ``rebuild_index()``, and that call re-embeds."""
    def opened(embedder, **where):
        with caplog.at_level(logging.WARNING, logger="tiered_memory"):
            caplog.clear()
            memory = TieredMemory(embedder=embedder, **where)
        return memory, [r.getMessage() for r in caplog.records]

    own = {"path": tmp_path / "own", "record_store": make_postgres_url()}
    shared = {"record_store": make_pgvector_url(), "vector_store": "pgvector"}
    for where in (own, shared):
        with TieredMemory(embedder=_OwnEmbedder(), **where) as memory:
            memory.add("user", "My sister moved to Porto last spring.", user_id="u", session_id="s")

    memory, logged = opened(StaticEmbedder(), **own)
    with memory:
        assert [m for m in logged if "rebuilding this process's vector index" in m]
        assert memory.store.get_meta("embedder") == BUNDLED_NAME
        assert memory.search("where did my sister move?", user_id="u", k=1)[0].text.startswith("My sister")

    memory, logged = opened(StaticEmbedder(), **shared)
    with memory:
        assert [m for m in logged if "differs from the shared store's acme-embed-v2" in m and "rebuild_index()" in m]
        assert memory.store.get_meta("embedder") == "acme-embed-v2"  # nothing re-embedded yet
        memory.rebuild_index()
        assert memory.store.get_meta("embedder") == BUNDLED_NAME
        assert memory.search("where did my sister move?", user_id="u", k=1)[0].text.startswith("My sister")
