"""Values past PostgreSQL's own limits: a typed InvalidInputError that says what to shorten,
with nothing written and every later read working, never a StoreError (which tells the
caller the environment failed and a retry may help).

A store item's namespace and key form a unique b-tree key there, and a b-tree entry holds
at most 2,704 bytes (after compression): a long random key passes the adapter's checks
(SQLite takes it) but cannot be indexed by PostgreSQL.
"""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Callable

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.errors import InvalidInputError

pytestmark = pytest.mark.servers

LONG = "".join(random.Random(7).choices(string.ascii_letters, k=4000))  # does not compress


@pytest.mark.parametrize("vector_store", [None, "pgvector"])
@pytest.mark.parametrize(("namespace", "key"), [(("u1", "notes"), LONG), (("u1", LONG), "k")])
def test_a_store_item_key_too_long_to_index_is_invalid_input_and_writes_nothing(
        make_pgvector_url: Callable[[], str], tmp_path: Path, vector_store: str | None,
        namespace: tuple[str, ...], key: str) -> None:
    from langchain_tiered_memory import TieredMemoryStore

    kwargs = {"vector_store": vector_store} if vector_store else {}
    with TieredMemory(tmp_path / "m", record_store=make_pgvector_url(), embedder=StaticEmbedder(), **kwargs) as m:
        store = TieredMemoryStore(m)
        store.put(("u1", "notes"), "kept", {"text": "the garden is green"})
        with pytest.raises(InvalidInputError, match="too large for PostgreSQL"):
            store.put(namespace, key, {"text": "the pond is blue"})
        assert store.get(namespace, key) is None
        assert [i.key for i in store.search(("u1",))] == ["kept"]
        assert [i.key for i in store.search(("u1",), query="garden")] == ["kept"]
        assert m.item_store().count("u1") == 1
        if vector_store:
            assert len([i for i in m.index.ids("u1") if i.startswith("item:")]) == 1  # its vector went too


def test_a_message_whose_words_pass_the_keyword_index_limit_is_invalid_input_and_writes_nothing(
        make_pgvector_url: Callable[[], str], tmp_path: Path) -> None:
    """A message's words fill a keyword index entry (a tsvector) of at most 1 MB there: a run of
    199,000 rare Han characters (four bytes each in UTF-8), read as its bigrams, nearly all
    distinct, is within the 200,000 characters a message may hold by default (SQLite takes it)
    but cannot be indexed. The error names both limits it may be."""
    rng = random.Random(11)
    text = "".join(chr(0x20000 + rng.randrange(20_000)) for _ in range(199_000))
    with TieredMemory(tmp_path / "m", record_store=make_pgvector_url(), embedder=StaticEmbedder()) as m:
        m.add("user", "the garden is green", user_id="u1", session_id="s1")
        with pytest.raises(InvalidInputError, match="keyword index of at most 1 MB"):
            m.add("assistant", text, user_id="u1", session_id="s1")
        assert [t.content for t in m.get_messages("s1", user_id="u1")] == ["the garden is green"]
        assert [h.text for h in m.search("garden", user_id="u1")] == ["the garden is green"]
