"""End to end with a real LLM: Qwen2.5-Coder-1.5B behind llama.cpp's OpenAI-compatible
server on 127.0.0.1, reached through ``ChatOpenAI`` (fixtures in ``tests/llm_server.py``).

Output varies between calls even at temperature 0, so these tests assert structure and
grounding (fields present, entities and facts that occur in the conversation), never
wording. Each LLM call takes 5-15 s on 2 cores: keep their number small.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from langchain_tiered_memory.llm import LangChainLLM
from llm_server import CALL_TIMEOUT_S
from tiered_memory import TieredMemory
from tiered_memory.config import LLMConfig, MemoryConfig

pytestmark = [pytest.mark.llm, pytest.mark.timeout(4 * CALL_TIMEOUT_S)]

USER, SESSION = "maria", "move-planning"
T0 = 1_767_000_000.0  # fixed timestamps: the time span is checked exactly

CONVERSATION = [
    ("user", "Hi! I'm Maria. I'm moving from Lisbon to Berlin in March to start a job at Siemens."),
    ("assistant", "Congratulations, Maria! How can I help with the move to Berlin?"),
    ("user", "I need a flat in Berlin near the Siemens office. I'm vegetarian and I cycle to work, "
             "so a quiet street with a bike lane would be ideal."),
    ("assistant", "Kreuzberg and Friedrichshain have many bike lanes and vegetarian restaurants. "
                  "Should I shortlist flats there?"),
    ("user", "Yes, Kreuzberg please. My budget is 1200 euros a month, no more."),
    ("assistant", "Noted: Kreuzberg, at most 1200 euros a month. I'll shortlist flats for you."),
]
TEXT = " ".join(content for _, content in CONVERSATION).lower()
# names any faithful summary of this conversation mentions as entities
KEY_ENTITIES = {"maria", "lisbon", "berlin", "siemens", "kreuzberg"}


def grounded(item: str) -> bool:
    """True when some word of ``item`` (3+ letters or a number) occurs in the conversation."""
    words = re.findall(r"[a-zà-ÿ]{3,}|\d+", item.lower())
    return any(w in TEXT for w in words)


async def test_json_mode_returns_parseable_json(chat_model: Any) -> None:
    llm = LangChainLLM(chat_model)
    text = await llm.complete([
        {"role": "system", "content": 'Reply with one JSON object: {"city": string, "country": string}.'},
        {"role": "user", "content": "The capital of France."},
    ], json_mode=True, max_tokens=64)
    obj = json.loads(text)  # JSON mode: the reply itself is JSON, no fences, no chatter
    assert isinstance(obj, dict)
    assert {"city", "country"} <= set(obj)
    assert "paris" in str(obj["city"]).lower()


@pytest.fixture
def llm_memory(chat_model: Any, tmp_path: Path, embedder: Any) -> Any:
    config = MemoryConfig(llm=LLMConfig(timeout_s=CALL_TIMEOUT_S, max_tokens=512))
    memory = TieredMemory(tmp_path / "mem", llm=chat_model, embedder=embedder, config=config)
    yield memory
    memory.close()


def test_end_session_compresses_the_session_and_extracts_facts(llm_memory: TieredMemory) -> None:
    ids = llm_memory.add_many(
        [{"role": r, "content": c, "timestamp": T0 + 60 * n} for n, (r, c) in enumerate(CONVERSATION)],
        user_id=USER, session_id=SESSION)

    episode = llm_memory.end_session(SESSION, user_id=USER)

    # the LLM path ran: a fallback to rules would say "extractive" and why
    assert episode.metadata.get("method") == "llm", episode.metadata
    # structure
    assert episode.user_id == USER and episode.session_id == SESSION
    assert isinstance(episode.summary, str) and len(episode.summary.split()) >= 5
    for field in (episode.entities, episode.decisions, episode.open_questions, episode.key_facts):
        assert isinstance(field, list) and all(isinstance(x, str) for x in field)
    assert episode.source_ids == ids
    assert episode.turn_count == 3
    assert (episode.start, episode.end) == (T0, T0 + 60 * (len(CONVERSATION) - 1))
    # grounding: the entities come from the conversation, and the main ones are there
    assert episode.entities, episode
    ungrounded = [e for e in episode.entities if not grounded(e)]
    assert len(ungrounded) <= len(episode.entities) // 3, f"invented entities: {ungrounded}"
    named = {e.lower() for e in episode.entities} | set(" ".join(episode.entities).lower().split())
    assert len(KEY_ENTITIES & named) >= 2, episode.entities
    assert any(w in episode.summary.lower() for w in KEY_ENTITIES), episode.summary

    # facts about the user, typed, sourced from the session's messages
    facts = llm_memory.facts(USER)
    assert facts, "no facts extracted"
    for fact in facts:
        assert fact.type in {"preference", "fact", "constraint", "relationship", "decision"}
        assert 0.0 <= fact.confidence <= 1.0
        assert fact.source_ids and set(fact.source_ids) <= set(ids)
        assert fact.metadata.get("method") == "llm", fact.metadata
    assert sum(grounded(f.text) for f in facts) >= max(1, len(facts) - len(facts) // 3), [f.text for f in facts]
    about = " ".join(f.text.lower() for f in facts)
    assert any(w in about for w in ("vegetarian", "berlin", "siemens", "kreuzberg", "1200", "lisbon")), about

    # the episode is recalled whole by a related query (local embeddings, no LLM call)
    hits = llm_memory.search_episodes("Where is Maria moving to?", user_id=USER)
    assert [h.episode.id for h in hits][:1] == [episode.id]
