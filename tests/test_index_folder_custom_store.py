"""An embedded index beside a record store object the caller made (a ``RecordStore`` of their
own, or ``SQLiteRecordStore`` at another file) serves one memory as the embedded store's does:
its folder is checked and locked (two record stores sharing one index would each take the
other's vectors for ones to repair away)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered_memory import ConfigurationError, StaticEmbedder, StoreLockedError, TieredMemory
from tiered_memory.store.sqlite import SQLiteRecordStore


def test_a_folder_of_other_files_does_not_get_the_index_of_a_store_object(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "thesis.tex").write_text("mine")
    store = SQLiteRecordStore(tmp_path / "records.db")
    try:
        with pytest.raises(ConfigurationError, match="not a tiered-memory store"):
            TieredMemory(tmp_path / "folder", record_store=store, embedder=StaticEmbedder())
    finally:
        store.close()
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["thesis.tex"]


def test_two_store_objects_do_not_share_one_embedded_index(tmp_path: Path) -> None:
    first = TieredMemory(tmp_path / "index", record_store=SQLiteRecordStore(tmp_path / "a.db"),
                         embedder=StaticEmbedder())
    other = SQLiteRecordStore(tmp_path / "b.db")
    try:
        first.add("user", "I live in Lisbon", user_id="ana", session_id="s1")
        with pytest.raises(StoreLockedError, match="already open in this process"):
            TieredMemory(tmp_path / "index", record_store=other, embedder=StaticEmbedder())
        assert [h.text for h in first.search("Lisbon", user_id="ana")] == ["I live in Lisbon"]
    finally:
        other.close()
        first.close()
