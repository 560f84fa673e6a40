"""Chroma's settings as every client we open gets them (``client_settings``): built once and
copied while nothing they are read from changes (building them reads every field from the
environment and the ``.env`` file, a third of an open), read again when something does, and
never shared between two clients (Chroma's ``PersistentClient`` writes its folder into them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.vector.chroma_client import client_settings


def test_a_variable_set_or_removed_between_two_opens_is_read_by_the_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHROMA_CLIENT_AUTH_CREDENTIALS", raising=False)
    assert client_settings().chroma_client_auth_credentials is None
    monkeypatch.setenv("CHROMA_CLIENT_AUTH_CREDENTIALS", "first")
    assert client_settings().chroma_client_auth_credentials == "first"
    monkeypatch.setenv("CHROMA_CLIENT_AUTH_CREDENTIALS", "second")
    assert client_settings().chroma_client_auth_credentials == "second"
    monkeypatch.delenv("CHROMA_CLIENT_AUTH_CREDENTIALS")
    assert client_settings().chroma_client_auth_credentials is None


def test_a_dotenv_file_written_or_changed_between_two_opens_is_read_by_the_second(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pydantic's settings read ``.env`` in the working folder: its contents, not its name, count."""
    monkeypatch.delenv("CHROMA_CLIENT_AUTH_CREDENTIALS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert client_settings().chroma_client_auth_credentials is None
    (tmp_path / ".env").write_text("CHROMA_CLIENT_AUTH_CREDENTIALS=from-dotenv\n", encoding="utf-8")
    assert client_settings().chroma_client_auth_credentials == "from-dotenv"
    (tmp_path / ".env").write_text("CHROMA_CLIENT_AUTH_CREDENTIALS=changed-too\n", encoding="utf-8")
    assert client_settings().chroma_client_auth_credentials == "changed-too"
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)  # no .env here
    assert client_settings().chroma_client_auth_credentials is None


def test_given_settings_are_those_of_that_call_only() -> None:
    assert client_settings(chroma_client_auth_credentials="given").chroma_client_auth_credentials == "given"
    assert client_settings().chroma_client_auth_credentials != "given"


def test_what_a_client_writes_into_its_settings_reaches_no_other_client(tmp_path: Path) -> None:
    """``PersistentClient`` sets ``persist_directory`` and ``is_persistent`` on the settings it is given."""
    first = client_settings()
    first.persist_directory, first.is_persistent = str(tmp_path / "a"), True
    first.chroma_server_headers = {"X-Mine": "only"}
    again = client_settings()
    assert again is not first
    assert (again.persist_directory, again.is_persistent, again.chroma_server_headers) == ("./chroma", False, None)


def test_two_memories_on_two_folders_open_side_by_side_and_reopen(tmp_path: Path) -> None:
    """Each client gets its own copy of the settings: two folders open at once keep their own
    vectors, and each reopens after both closed."""
    embedder = StaticEmbedder()
    with TieredMemory(tmp_path / "a", embedder=embedder) as a, TieredMemory(tmp_path / "b", embedder=embedder) as b:
        a.add("user", "apples in folder a", session_id="s", user_id="u")
        b.add("user", "boats in folder b", session_id="s", user_id="u")
    for name, said in (("a", "apples in folder a"), ("b", "boats in folder b")):
        with TieredMemory(tmp_path / name, embedder=embedder) as m:
            assert [h.text for h in m.search("anything", user_id="u")] == [said]
