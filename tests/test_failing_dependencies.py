"""Failing dependencies: the vector engine raising mid-write, a full disk, a failing LLM.

In every case the caller gets a typed :class:`TieredMemoryError`, what was
acknowledged stays, nothing is half-written, and the store heals (vectors are
re-derived from the records) once the dependency works again.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tiered_memory import (
    LLMError,
    MemoryConfig,
    StoreError,
    TieredMemory,
    TieredMemoryError,
    VectorIndexError,
)
from tiered_memory.config import LLMConfig
from tiered_memory.testing import FailingVectorIndex, ScriptedLLM, malformed, timeout
from tiered_memory.vector.chroma import ChromaVectorIndex


def integrity(m: TieredMemory) -> str:
    return str(m.store.query("PRAGMA integrity_check")[0][0])  # type: ignore[attr-defined]


def batch(tag: str, n: int = 4) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag} message {i} about the lighthouse keeper",
             "metadata": {"batch": tag}} for i in range(n)]


def batches_in(m: TieredMemory, user: str = "u") -> dict[str, int]:
    out: dict[str, int] = {}
    for msg in m.store.iter_messages(user):
        out[msg.metadata["batch"]] = out.get(msg.metadata["batch"], 0) + 1
    return out


def failing(folder: Path, **kwargs: Any) -> FailingVectorIndex:
    folder.mkdir(parents=True, exist_ok=True)
    return FailingVectorIndex(ChromaVectorIndex(str(folder / "chroma")), **kwargs)


# ---- the vector engine --------------------------------------------------------------
@pytest.mark.parametrize("error", [RuntimeError("engine exploded"), VectorIndexError("engine said no"),
                                   OSError(28, "No space left on device")])
def test_upsert_failing_mid_write_keeps_records_and_heals_on_reopen(
    tmp_path: Path, embedder: Any, error: BaseException,
) -> None:
    folder = tmp_path / "store"
    index = failing(folder, fail_on={"upsert"}, after=1, times=1, error=error)
    m = TieredMemory(folder, embedder=embedder, vector_store=index)
    first = m.add_many(batch("a"), session_id="s", user_id="u")
    with pytest.raises(VectorIndexError) as info:
        m.add_many(batch("b"), session_id="s", user_id="u")
    assert "stored but not indexed" in str(info.value)
    assert index.failures == 1
    # the records are committed, whole, and found by keyword while the vectors are missing
    assert batches_in(m) == {"a": 4, "b": 4}
    assert m.search("lighthouse keeper b message 2", user_id="u", k=8)
    third = m.add_many(batch("c"), session_id="s", user_id="u")  # the engine works again
    m.close()
    with TieredMemory(folder, embedder=embedder) as again:  # a clean open notices the missing vectors
        assert integrity(again) == "ok"
        pending = again.store.query("SELECT count(*) FROM messages WHERE indexed=0")[0][0]  # type: ignore[attr-defined]
        assert pending == 0
        stored = {r[0] for r in again.store.query(  # type: ignore[attr-defined]
            "SELECT id FROM messages WHERE duplicate_of IS NULL")}
        assert stored <= again.index.ids("u")
        assert set(first) | set(third) <= {r.id for r in again.store.iter_messages("u")}


def test_a_fact_whose_vector_failed_is_indexed_by_the_next_clean_open(tmp_path: Path, embedder: Any) -> None:
    """A fact is stored before its vector is written; the vector failing leaves it marked
    pending, and the next open (a clean one: nothing crashed) writes it, as it does a turn's."""
    folder = tmp_path / "store"
    index = failing(folder, fail_on={"upsert"}, times=None, error=VectorIndexError("engine said no"))
    with TieredMemory(folder, embedder=embedder, vector_store=index) as m:
        with pytest.raises(VectorIndexError):
            m.add_fact("User plays the cello", user_id="u")
        assert [f.text for f in m.facts("u")] == ["User plays the cello"]  # stored, found by its words
    with TieredMemory(folder, embedder=embedder) as again:
        fact = again.facts("u")[0]
        assert again.index.ids("u") == {f"fact:{fact.id}"}
        hit = again.search_facts("which instrument does the user play?", user_id="u", k=1)[0]
        assert hit.fact.id == fact.id and "vector" in hit.explanation["signals"]


def test_a_custom_index_failing_a_fact_write_is_a_typed_error_saying_what_was_stored(
        tmp_path: Path, embedder: Any) -> None:
    """A custom engine raises what it likes (here RuntimeError); add_fact and update_fact let it
    out as it was, where the bundled indexes raise VectorIndexError. Before the rows commit:
    nothing written; after: stored, and the next open writes the vector."""
    folder = tmp_path / "store"
    index = failing(folder, fail_on={"query"}, times=None)
    with TieredMemory(folder, embedder=embedder, vector_store=index) as m:
        with pytest.raises(VectorIndexError, match="wrote nothing.*write it again") as raised:
            m.add_fact("User plays the cello", user_id="u")
        assert isinstance(raised.value.__cause__, RuntimeError) and m.facts("u") == []
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError, match="was stored.*do not write it again") as raised:
            m.add_fact("User plays the cello", user_id="u")
        [fact] = m.facts("u")
        assert fact.id in str(raised.value)
        index.fail_on = {"delete"}  # an edit drops the old text's vector before its rows commit
        with pytest.raises(VectorIndexError, match="wrote nothing"):
            m.update_fact(fact.id, user_id="u", text="User plays the viola")
        assert [f.text for f in m.facts("u")] == ["User plays the cello"]
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError, match=f"fact {fact.id} was edited"):
            m.update_fact(fact.id, user_id="u", text="User plays the viola")
        assert [f.text for f in m.facts("u")] == ["User plays the viola"]
    with TieredMemory(folder, embedder=embedder) as again:
        assert again.index.ids("u") == {f"fact:{fact.id}"}
        assert again.search_facts("which instrument?", user_id="u", k=1)[0].fact.text == "User plays the viola"


def test_query_failing_is_a_typed_error_and_changes_nothing(tmp_path: Path, embedder: Any) -> None:
    folder = tmp_path / "store"
    # VectorIndex implementations wrap engine errors in VectorIndexError (Chroma and Qdrant do)
    index = failing(folder, fail_on={"query"}, after=10**6, error=VectorIndexError("engine timed out"))
    with TieredMemory(folder, embedder=embedder, vector_store=index) as m:
        m.add_many(batch("a"), session_id="s", user_id="u")
        index.after, index.times = 0, None
        with pytest.raises(VectorIndexError):
            m.search("lighthouse", user_id="u")
        with pytest.raises(VectorIndexError):
            m.build_context("lighthouse", user_id="u", session_id="s")
        assert batches_in(m) == {"a": 4}


def test_forget_user_with_a_failing_engine_can_be_retried_to_completion(tmp_path: Path, embedder: Any) -> None:
    folder = tmp_path / "store"
    index = failing(folder, fail_on={"delete_user"}, times=1, error=VectorIndexError("engine busy"))
    with TieredMemory(folder, embedder=embedder, vector_store=index) as m:
        m.add_many(batch("a"), session_id="s", user_id="leaver")
        m.add_many(batch("b"), session_id="s", user_id="stayer")
        with pytest.raises(VectorIndexError):
            m.forget_user("leaver")
        assert m.get_messages("s", user_id="leaver") == []  # the records went first
        assert m.search("lighthouse keeper", user_id="leaver") == []  # orphan vectors are never served
        m.forget_user("leaver")  # the retry finishes the job
        assert m.index.ids("leaver") == set()
        assert batches_in(m, "stayer") == {"b": 4}


@pytest.mark.parametrize("call", ["forget", "clear_session"])
def test_a_duplicate_a_deletion_could_not_index_again_is_indexed_by_the_next_write(
    tmp_path: Path, embedder: Any, call: str,
) -> None:
    """Deleting a message releases its duplicates, which are indexed at once. Should that
    fail, the deletion raises, and the next write indexes them (not only the next open)."""
    folder = tmp_path / "store"
    index = failing(folder, fail_on=set(), times=1, error=VectorIndexError("engine busy"))
    with TieredMemory(folder, embedder=embedder, vector_store=index) as m:
        original = m.add("user", "My sister Ana lives in Porto.", session_id="old", user_id="u")
        copy = m.add("user", "My sister Ana lives in Porto.", session_id="new", user_id="u")
        m.flush()
        assert m.index.ids("u") == {original}  # the copy is a duplicate, found by the original's vector
        index.fail_on = {"upsert"}
        with pytest.raises(VectorIndexError):
            if call == "forget":
                m.forget(original, user_id="u")
            else:
                m.clear_session("old", user_id="u")
        assert index.failures == 1 and m.index.ids("u") == set()
        later = m.add("user", "The ferry leaves at nine.", session_id="new", user_id="u")
        m.flush()
        assert m.index.ids("u") == {copy, later}
        assert [h.id for h in m.search("where does my sister live?", user_id="u", k=1)] == [copy]


# ---- a full disk --------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MB tmpfs (we run as root in CI); skipped where mounting is not allowed."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path) -> Path:
    """Fill the disk. Unbuffered: a buffered file kept the bytes its last flush could not write
    and raised ENOSPC again as it closed, whenever the space left was not a whole chunk."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


def test_full_disk_gives_typed_errors_and_keeps_acknowledged_writes(small_disk: Path, embedder: Any) -> None:
    folder = small_disk / "store"
    m = TieredMemory(folder, embedder=embedder)
    acknowledged: list[str] = []
    acknowledged += m.add_many(batch("before"), session_id="s", user_id="u")
    filler = fill(small_disk)
    errors: list[TieredMemoryError] = []
    for n in range(12):
        try:
            acknowledged += m.add_many(batch(f"full{n}", 8), session_id="s", user_id="u")
        except TieredMemoryError as e:
            errors.append(e)
    assert errors, "the disk never filled up"
    assert all(isinstance(e, (StoreError, VectorIndexError)) for e in errors), errors
    assert any("full" in str(e).lower() or "space" in str(e).lower() for e in errors), errors
    filler.unlink()
    try:  # reads still work, and nothing acknowledged is lost; no batch is partial
        have = {msg.id for msg in m.store.iter_messages("u")}
        assert set(acknowledged) <= have
        assert all(count in (4, 8) for count in batches_in(m).values()), batches_in(m)
        try:  # a background vector write that failed while the disk was full is reported once
            m.flush()  # (its rows are pending again, indexed on the next open), here or by a write
        except VectorIndexError as e:
            assert "full" in str(e).lower() or "space" in str(e).lower(), e
        m.add_many(batch("after"), session_id="s", user_id="u")  # space again: writes work again
    finally:
        m.close()
    with TieredMemory(folder, embedder=embedder) as again:
        assert integrity(again) == "ok"
        assert set(acknowledged) <= {msg.id for msg in again.store.iter_messages("u")}
        assert again.store.query("SELECT count(*) FROM messages WHERE indexed=0")[0][0] == 0  # type: ignore[attr-defined]
        assert again.search("after message 1 lighthouse", user_id="u", k=3)


def test_record_store_limit_reached_is_a_store_error(make_memory: Callable[..., TieredMemory]) -> None:
    """The same without a tmpfs: SQLite's own page limit stands in for the disk."""
    m = make_memory()
    m.add_many(batch("before"), session_id="s", user_id="u")
    pages = m.store.query("PRAGMA page_count")[0][0]  # type: ignore[attr-defined]
    m.store.query(f"PRAGMA max_page_count={pages}")  # type: ignore[attr-defined]
    with pytest.raises(StoreError) as info:
        m.add_many([{"role": "user", "content": "x" * 50_000 + str(uuid.uuid4())}] * 3, session_id="s", user_id="u")
    assert "full" in str(info.value)
    assert batches_in(m) == {"before": 4}
    assert integrity(m) == "ok"
    m.store.query("PRAGMA max_page_count=1073741823")  # type: ignore[attr-defined]


# ---- the LLM ----------------------------------------------------------------------
FAILURES = [RuntimeError("provider down"), timeout(), "this is not JSON at all", malformed(), ""]


def _llm_config(strict: bool) -> MemoryConfig:
    return MemoryConfig(llm=LLMConfig(timeout_s=0.2, retries=1, strict=strict))


@pytest.mark.parametrize("step", FAILURES, ids=["raises", "times-out", "prose", "malformed", "empty"])
def test_a_failing_llm_never_loses_turns_and_strict_mode_is_typed(
    make_memory: Callable[..., TieredMemory], step: Any,
) -> None:
    lenient = make_memory("lenient", llm=ScriptedLLM(default=step), config=_llm_config(False))
    ids = lenient.add_many(batch("a", 6), session_id="s", user_id="u")
    episode = lenient.end_session("s", user_id="u")
    assert episode.metadata["method"] == "extractive"
    lenient.consolidate("u")
    assert [msg.id for msg in lenient.get_messages("s", user_id="u")] == ids
    assert integrity(lenient) == "ok"

    strict = make_memory("strict", llm=ScriptedLLM(default=step), config=_llm_config(True))
    ids = strict.add_many(batch("a", 6), session_id="s", user_id="u")
    with pytest.raises(LLMError):
        strict.end_session("s", user_id="u")
    assert [msg.id for msg in strict.get_messages("s", user_id="u")] == ids
    assert strict.episodes("u") == []
    assert integrity(strict) == "ok"


def test_a_failed_chroma_write_gets_a_new_client_for_what_follows(tmp_path: Path) -> None:
    """Chroma's embedded client can be left unable to answer after a failed write (its next
    upsert, after "disk is full", waited forever): the index drops it and opens a new one."""
    import numpy as np

    from tiered_memory.vector.base import VectorItem

    index = ChromaVectorIndex(str(tmp_path / "chroma"))
    item = lambda i: VectorItem(id=f"m{i}", vector=np.eye(4, dtype=np.float32)[i % 4], user_id="u",  # noqa: E731
                                layer="turn", session_id="s", timestamp=0.0)
    try:
        index.upsert([item(0)])
        first = index.client

        def refuse(**_: Any) -> None:
            raise RuntimeError("database or disk is full")

        index.collection.upsert = refuse  # type: ignore[method-assign]
        with pytest.raises(VectorIndexError, match="disk is full"):
            index.upsert([item(1)])
        index.upsert([item(2)])
        assert index.client is not first
        assert index.ids("u") == {"m0", "m2"}  # the new client reads what the folder holds
    finally:
        index.close()
