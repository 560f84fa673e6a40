"""Restart persistence, the default folder, and folders that are not ours."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from tiered_memory import (
    ConfigurationError,
    CorruptStoreError,
    StoreLockedError,
    TieredMemory,
)
from tiered_memory.memory import default_path


def test_reopening_the_folder_sees_everything(make_memory, tmp_path):
    m = make_memory("mem")
    ids = m.add_many(
        [{"role": "user", "content": "I keep bees on my roof in Ghent", "metadata": {"tags": ["bees"]}},
         {"role": "assistant", "content": "Urban beekeeping is a great hobby."}],
        session_id="s1", user_id="u1")
    m.close()

    again = make_memory("mem")
    assert [x.id for x in again.get_messages("s1", user_id="u1")] == ids
    assert again.get_messages("s1", user_id="u1")[0].metadata == {"tags": ["bees"]}
    hits = again.search("what animals do I keep?", user_id="u1", k=1)
    assert hits[0].id == ids[0]
    s = again.stats()
    assert (s.messages, s.vectors, s.users, s.sessions) == (2, 2, 1, 1)


def test_close_marks_the_store_clean_and_context_manager_closes(tmp_path, embedder):
    with TieredMemory(tmp_path / "m", embedder=embedder) as m:
        m.add("user", "hello there", session_id="s", user_id="u")
        assert m.store.get_meta("state") == "open"
    con = sqlite3.connect(tmp_path / "m" / "records.sqlite3")
    assert con.execute("SELECT value FROM meta WHERE key='state'").fetchone() == ("closed",)
    con.close()
    # the lock was released: the folder opens again
    with TieredMemory(tmp_path / "m", embedder=embedder) as m2:
        assert m2.stats().messages == 1


def test_no_path_uses_tiered_memory_home(tmp_path, monkeypatch, embedder):
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home-store"))
    assert default_path() == tmp_path / "home-store"
    with TieredMemory(embedder=embedder) as m:
        assert m.path == tmp_path / "home-store"
        m.add("user", "stored in the default folder", session_id="s", user_id="u")
    assert (tmp_path / "home-store" / "records.sqlite3").is_file()


def test_no_path_and_no_env_is_dot_tiered_memory_in_home(monkeypatch, tmp_path):
    monkeypatch.delenv("TIERED_MEMORY_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_path() == tmp_path / ".tiered-memory"


def test_path_that_is_a_file_is_a_configuration_error(tmp_path, embedder):
    f = tmp_path / "not-a-folder"
    f.write_text("hello")
    with pytest.raises(ConfigurationError, match="is a file"):
        TieredMemory(f, embedder=embedder)
    assert f.read_text() == "hello"


def test_foreign_sqlite_database_is_corrupt_store_and_left_untouched(tmp_path, embedder):
    folder = tmp_path / "foreign"
    folder.mkdir()
    db = folder / "records.sqlite3"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    con.execute("INSERT INTO invoices VALUES (1, 9.5)")
    con.commit()
    con.close()
    with pytest.raises(CorruptStoreError, match="did not create"):
        TieredMemory(folder, embedder=embedder)
    con = sqlite3.connect(db)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    journal = con.execute("PRAGMA journal_mode").fetchone()[0]
    con.close()
    assert tables == {"invoices"}
    assert journal == "delete"  # not switched to WAL: we changed nothing in a foreign file
    # the folder lock was released: a second attempt fails the same way, not with StoreLockedError
    with pytest.raises(CorruptStoreError):
        TieredMemory(folder, embedder=embedder)


def test_garbage_file_is_corrupt_store(tmp_path, embedder):
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "records.sqlite3").write_bytes(b"this is not a database\x00" * 200)
    with pytest.raises(CorruptStoreError, match="not a readable"):
        TieredMemory(folder, embedder=embedder)




def test_second_process_on_the_same_folder_gets_store_locked(make_memory, tmp_path):
    m = make_memory("locked")
    m.add("user", "held open by the test process", session_id="s", user_id="u")
    child = textwrap.dedent(f"""
        import sys
        from tiered_memory import StaticEmbedder, StoreLockedError, TieredMemory

        try:
            TieredMemory({str(tmp_path / "locked")!r}, embedder=StaticEmbedder())
        except StoreLockedError as e:
            print("LOCKED:", e)
            sys.exit(0)
        print("opened")
        sys.exit(1)
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "open in another process" in proc.stdout and "this process" not in proc.stdout
    # the holder is unaffected
    assert m.stats().messages == 1


def test_same_process_second_open_is_refused_too(make_memory):
    make_memory("twice")
    with pytest.raises(StoreLockedError):
        make_memory("twice")


def test_a_foreign_non_empty_folder_is_refused_and_left_as_it_was(tmp_path, embedder):
    folder = tmp_path / "my-documents"
    folder.mkdir()
    (folder / "thesis.docx").write_bytes(b"precious")
    with pytest.raises(ConfigurationError, match="not a tiered-memory store"):
        TieredMemory(folder, embedder=embedder)
    assert sorted(p.name for p in folder.iterdir()) == ["thesis.docx"]


def test_a_row_read_by_the_sqlite_store_is_the_stored_message_its_constructor_makes() -> None:
    # the store builds rows without the dataclass __init__ (for speed): a field added to
    # StoredMessage must be set there too, or reads would hand out objects without it
    from dataclasses import fields

    from tiered_memory.store.sqlite import _row
    from tiered_memory.types import StoredMessage

    for metadata in ("{}", '{"k": [1, "x"]}'):
        got = _row(("m1", "u", "s", "user", "hi", metadata, 1.5, 7))
        want = StoredMessage(id="m1", user_id="u", session_id="s", role="user", content="hi",
                             metadata={} if metadata == "{}" else {"k": [1, "x"]}, timestamp=1.5, seq=7)
        assert got == want
        assert set(vars(got)) == {f.name for f in fields(StoredMessage)}
