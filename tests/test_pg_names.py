"""Schema names are names, not SQL: a store schema with capitals or a space (``schema="Tenant A"``)
and a pgvector extension installed in such a schema work like any other, ``forget_user``
included (it finds the user's tables by the schema's name in the catalog).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import psycopg
import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.store.postgres import PostgresRecordStore

pytestmark = pytest.mark.servers


@pytest.mark.parametrize("schema", ["Tenant_A", "tenant a", "Tenant-B"])
@pytest.mark.parametrize("vector_store", [None, "pgvector"])
def test_forget_user_works_in_a_schema_whose_name_needs_quoting(
        make_pgvector_url: Callable[[], str], tmp_path: Path, schema: str, vector_store: str | None) -> None:
    kwargs = {"vector_store": vector_store} if vector_store else {}
    with TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(make_pgvector_url(), schema=schema),
                      embedder=StaticEmbedder(), **kwargs) as m:
        for user in ("u1", "u2"):
            m.add("user", "I live in Lisbon", user_id=user, session_id="s")
            m.add_fact("User lives in Lisbon", user_id=user)
        assert m.forget_user("u1") == 1
        assert m.get_messages("s", user_id="u1") == [] and m.facts("u1") == []
        assert m.index.ids("u1") == set()
        assert len(m.get_messages("s", user_id="u2")) == 1 and len(m.facts("u2")) == 1
        assert [h.text for h in m.search("Lisbon", user_id="u2")] == ["I live in Lisbon"]


def test_pgvector_installed_in_a_schema_whose_name_needs_quoting(
        make_pgvector_url: Callable[[], str], tmp_path: Path) -> None:
    url = make_pgvector_url()
    with psycopg.connect(url, autocommit=True) as conn:  # as an administrator may have installed it
        conn.execute('CREATE SCHEMA "Extensions"')
        conn.execute('CREATE EXTENSION vector SCHEMA "Extensions"')
    with TieredMemory(tmp_path / "m", record_store=url, vector_store="pgvector", embedder=StaticEmbedder()) as m:
        m.add("user", "I live in Lisbon", user_id="u1", session_id="s")
        assert [h.text for h in m.search("Lisbon", user_id="u1")] == ["I live in Lisbon"]
        assert len(m.index.ids("u1")) == 1
