"""Shared by the episode tests: a short work conversation, a model's good episode of it, and
a config whose LLM calls time out fast."""

from __future__ import annotations

from typing import Any

from tiered_memory import MemoryConfig
from tiered_memory.config import LLMConfig
from tiered_memory.types import StoredMessage

CONVO = [
    {"role": "user", "content": "We need to migrate the billing service BILL-42 to PostgreSQL by 2025-03-01."},
    {"role": "assistant", "content": "Understood. Which region should the database run in?"},
    {"role": "user", "content": "Use eu-west-1. Maria from finance approved a budget of $4,000."},
    {"role": "assistant", "content": "Great, we decided to go with eu-west-1 and PostgreSQL 16."},
    {"role": "user", "content": "Not sure yet how to handle the archive of old invoices?"},
]
GOOD_EPISODE = {
    "summary": "Planned the PostgreSQL migration of BILL-42 in eu-west-1.",
    "entities": ["BILL-42", "PostgreSQL", "Maria", "eu-west-1"],
    "decisions": ["Use PostgreSQL 16 in eu-west-1"],
    "open_questions": ["How to archive old invoices"],
    "key_facts": ["Budget approved: $4,000"],
}
NO_FACTS: dict[str, list[Any]] = {"facts": []}


def fast_llm_config(**kw: Any) -> MemoryConfig:
    return MemoryConfig(llm=LLMConfig(timeout_s=kw.pop("timeout_s", 0.2), **kw))


def stored(rows: list[dict[str, str]]) -> list[StoredMessage]:
    """``rows`` as one session's stored messages, a second apart."""
    return [StoredMessage(id=f"m{n}", user_id="u", session_id="s", role=r["role"], content=r["content"],
                          timestamp=1000.0 + n, seq=n + 1) for n, r in enumerate(rows)]
