"""Embedding: long texts are chunked instead of truncated; model loading is quiet."""

from __future__ import annotations

import numpy as np
import pytest

from tiered_memory.embedding import chunk_token_ids, embed, normalize


@pytest.mark.parametrize("n, window, overlap, expected", [
    (5, 10, 2, [[0, 1, 2, 3, 4]]),
    (10, 10, 2, [list(range(10))]),
    (12, 10, 2, [list(range(10)), [8, 9, 10, 11]]),
    (20, 8, 0, [list(range(8)), list(range(8, 16)), list(range(16, 20))]),
    (0, 4, 1, [[]]),
])
def test_chunk_token_ids(n, window, overlap, expected):
    assert chunk_token_ids(list(range(n)), window, overlap) == expected


FILLER = ("We talked about the weather, the garden, tomato seedlings, compost, watering schedules "
          "and the neighbour's noisy lawnmower. ") * 40
LATE_FACT = "Important: my gym locker code is 4471 and the locker is in the basement."


def test_text_longer_than_the_model_window_is_chunked_not_truncated(embedder):
    text = FILLER + LATE_FACT
    tokens = embedder.model.tokenizer.encode(text, add_special_tokens=False)
    assert len(tokens) > embedder.model.max_seq_length  # really longer than the window
    chunked = embedder.embed_array([text])[0]
    truncated = normalize(embedder.model.encode([text], convert_to_numpy=True))[0]  # model truncates
    query = np.asarray(embedder.embed_query("what is my locker code?"))
    assert float(np.linalg.norm(chunked)) == pytest.approx(1.0, abs=1e-4)
    # the fact at the end is only visible to the chunked embedding
    assert float(query @ chunked) > float(query @ truncated) + 0.05


def test_long_message_is_found_by_its_late_fact(memory):
    long_id = memory.add("user", FILLER + LATE_FACT, session_id="s", user_id="u")
    memory.add("user", "The tomatoes need watering twice a week.", session_id="s", user_id="u")
    hit = memory.search("basement locker combination", user_id="u", k=1)[0]
    assert hit.id == long_id


def test_any_embeddings_object_works_and_is_normalised():
    class Plain:
        def embed_documents(self, texts):
            return [[3.0, 4.0] for _ in texts]

        def embed_query(self, text):
            return [3.0, 4.0]

    out = embed(Plain(), ["a", "b"])
    assert out.dtype == np.float32 and out.shape == (2, 2)
    assert np.allclose(out, [[0.6, 0.8], [0.6, 0.8]])


def test_loading_the_model_is_quiet_and_restores_transformers_settings(embedder, capfd):
    import os

    from transformers.utils import logging as hf_logging

    from tiered_memory import SentenceTransformerEmbedder
    from tiered_memory.embedding import bundled_model_path

    capfd.readouterr()
    # another spelling of the bundled folder is another cache key: a real second load
    fresh = SentenceTransformerEmbedder(bundled_model_path() + os.sep)
    assert len(fresh.embed_query("hello")) == 384
    out, err = capfd.readouterr()
    assert "Loading weights" not in err + out
    assert err.strip() == ""
    assert hf_logging.is_progress_bar_enabled()  # the user's setting is put back


def test_repeated_queries_are_served_from_a_cache_with_the_same_vector(embedder):
    from tiered_memory.embedding import embed_query

    first = embed_query(embedder, "a query asked three times in one build_context")
    first[0] = 99.0  # callers get copies: the cache is not corrupted by them
    second = embed_query(embedder, "a query asked three times in one build_context")
    fresh = embedder.embed_array(["a query asked three times in one build_context"])[0]
    assert second[0] != 99.0
    assert np.allclose(second, fresh, atol=1e-6)


def test_short_but_token_dense_text_is_chunked_too(embedder):
    # 400 characters but 400 tokens: CJK text and punctuation are one token per character
    text = "東京" * 100 + "x," * 100
    assert len(text) < 2 * embedder.model.max_seq_length
    assert len(embedder.model.tokenizer.encode(text, add_special_tokens=False)) > embedder.model.max_seq_length
    chunked = embedder.embed_array([text])[0]
    truncated = normalize(embedder.model.encode([text], convert_to_numpy=True))[0]
    assert not np.allclose(chunked, truncated, atol=1e-3)


def test_long_texts_do_not_warn_about_the_window_they_are_chunked_to(capfd):
    """transformers warns "Token indices sequence length is longer than the specified
    maximum sequence length" once per tokenizer; the library chunks, so it must not."""
    import os

    from tiered_memory import SentenceTransformerEmbedder
    from tiered_memory.embedding import bundled_model_path

    # another spelling of the folder is a fresh model and tokenizer, which has not warned yet
    fresh = SentenceTransformerEmbedder(os.path.join(bundled_model_path(), "."))
    fresh.embed_query("warm up")
    capfd.readouterr()
    vector = fresh.embed_array([FILLER + LATE_FACT])[0]
    out, err = capfd.readouterr()
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-4)
    assert "sequence length" not in err + out
