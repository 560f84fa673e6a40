"""The public surface, and the promise that the core imports no framework."""

from __future__ import annotations

import subprocess
import sys
from typing import Callable

import pytest

import tiered_memory

EXPECTED_CORE = {
    "TieredMemory", "MemoryConfig", "BufferConfig", "RetrievalConfig", "BudgetConfig",
    "MemoryHit", "Message", "StoredMessage", "Stats", "MemoryContext", "Section", "ContextItem",
    "Dropped", "Embedder", "SentenceTransformerEmbedder", "TieredMemoryError", "UsageError",
    "InvalidInputError", "ContentTooLargeError", "InvalidArgumentsError", "ConfigurationError", "MissingDependencyError",
    "EmbedderRequiredError",
    "NotFoundError", "RuntimeFailure", "StoreError", "StoreLockedError", "CorruptStoreError",
    "VectorIndexError", "EmbeddingError", "LLMError", "LLMOutputError", "__version__",
    "ImportReport", "ConsolidationReport",  # what import_jsonl and consolidate return
}


def test_all_lists_the_public_names_and_each_exists():
    names = set(tiered_memory.__all__)
    assert EXPECTED_CORE <= names
    assert len(names) == len(tiered_memory.__all__), "duplicates in __all__"
    for name in names:
        assert hasattr(tiered_memory, name), name
    assert not {n for n in names if n.startswith("_") and n != "__version__"}


def test_importing_the_core_imports_no_framework_and_loads_no_model():
    code = (
        "import sys, tiered_memory\n"
        "from tiered_memory import TieredMemory\n"
        "import tiered_memory.cli, tiered_memory.demo\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langchain_core', 'langchain', 'llama_index', 'langgraph', 'sentence_transformers', 'torch'))\n"
        "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""



def test_the_config_is_fixed_once_open(make_memory: Callable[..., tiered_memory.TieredMemory]) -> None:
    config = tiered_memory.MemoryConfig(dedup_threshold=0.9)
    memory = make_memory(config=config)
    assert memory.config == config and memory.parts.config is memory.config
    with pytest.raises(tiered_memory.UsageError, match="fixed when it opens"):
        memory.config = tiered_memory.MemoryConfig()
    assert memory.config == config  # search and build_context keep reading the same one


def test_the_config_s_tables_changed_after_open_change_nothing(
        make_memory: Callable[..., tiered_memory.TieredMemory]) -> None:
    """The dataclasses are frozen, but their tables (``BudgetConfig.shares``,
    ``RetrievalConfig.fusion_weights``) are dicts the caller still holds: a change made to them
    after open skipped every check and reached the open memory (a NaN share broke build_context)."""
    config = tiered_memory.MemoryConfig()
    memory = make_memory(config=config)
    memory.add("user", "I live in Lisbon", user_id="u", session_id="s1")
    config.budget.shares["turns"] = float("nan")
    assert memory.config.budget.shares["turns"] == 1.5
    assert "Lisbon" in memory.build_context("where do I live?", user_id="u", session_id="s2").to_messages()[0]["content"]


@pytest.mark.parametrize(("text", "key", "polarity"), [
    ("User lives in Lisbon", "residence", 1),
    ("User's sister is called Ana", "rel:sister", 1),
    ("User dislikes coffee", "pref:coffee", -1),
    ("User has two kids", None, 1),  # no slot's words
])
def test_a_fact_carries_the_slot_its_words_name(make_memory: Callable[..., tiered_memory.TieredMemory],
                                                text: str, key: str | None, polarity: int) -> None:
    """``Fact.key`` and ``Fact.polarity``, as the README (The layers: Facts) and the ``Fact``
    docstring describe them, on what ``add_fact`` returns and ``facts`` reads back; an edit
    that moves the text to another slot moves the key with it."""
    memory = make_memory()
    fact = memory.add_fact(text, user_id="u", type="preference" if "coffee" in text else "fact")
    assert (fact.key, fact.polarity) == (key, polarity)
    assert [(f.key, f.polarity) for f in memory.facts("u")] == [(key, polarity)]
    edited = memory.update_fact(fact.id, user_id="u", text="User works at Acme")
    assert (edited.key, edited.polarity) == ("employer", 1)
