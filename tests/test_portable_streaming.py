"""An import holds a batch of the file, not the file: ``import_jsonl`` read and kept every
record of the dump before storing the first (a 3 MB dump held more than 3 MB of records), so a
dump larger than the memory of the machine could not be imported. It checks the whole file in
a first pass that keeps only what it must (on disk), then reads it back in batches of
``write_chunk``; its promises stay: nothing written when a line is invalid (a bad last line
too), a pipe is read once, a line repeated is refused."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc

import pytest

from tiered_memory import MemoryConfig, TieredMemory
from tiered_memory.errors import InvalidInputError
from tiered_memory.portable import ImportFormatError

N = 300


def _line(i: int) -> str:
    # 10 KB a line, in the metadata: a dump's size without the time embedding it takes
    return json.dumps({"type": "message", "id": f"m{i}", "user_id": "ana", "session_id": f"s{i // 100}",
                       "role": "user", "content": f"note {i}", "metadata": {"page": f"{i:05d}" * 2000},
                       "timestamp": 1_700_000_000 + i}) + "\n"


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("dump") / "big.jsonl"
    path.write_text("".join(_line(i) for i in range(N)), encoding="utf-8")
    return path


def _import_peak(memory, dump):
    """The import's report and the most memory it held at once (tracemalloc's peak)."""
    tracemalloc.start()
    try:
        return memory.import_jsonl(dump), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_import_holds_a_batch_not_the_file(tmp_path, dump):
    size = dump.stat().st_size
    assert size > 3_000_000
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=5)) as memory:
        warm = tmp_path / "one.jsonl"  # the embedder's table and what a first import loads: not this import's
        warm.write_text(_line(N).replace(f'"m{N}"', '"warm"'), encoding="utf-8")
        memory.import_jsonl(warm)
        report, peak = _import_peak(memory, dump)
        assert report.imported == N and memory.stats().messages == N + 1
        hit = memory.search("note 299", user_id="ana", k=1)[0]
        assert hit.id == "m299" and hit.session_id == "s2" and hit.metadata["page"][:5] == "00299"
    assert peak < size / 3, f"the import held {peak:,} bytes at its peak for a {size:,}-byte file"


def test_a_bad_last_line_still_writes_nothing_and_a_repeat_is_refused(tmp_path, dump):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(dump.read_bytes() + _line(5).encode() + b'{"type": "message"}\n')
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=50)) as memory:
        with pytest.raises(ImportFormatError) as e:
            memory.import_jsonl(bad)
        assert [n for n, _ in e.value.errors] == [N + 1, N + 2]
        assert "id 'm5' is also on line 6" in e.value.errors[0][1]
        assert memory.stats().messages == 0
        report = memory.import_jsonl(bad, skip_invalid=True)
        assert report.imported == N and [n for n, _ in report.invalid] == [N + 1, N + 2]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a named pipe")
def test_a_pipe_is_read_once_and_imported_whole(tmp_path):
    pipe = tmp_path / "dump.pipe"
    os.mkfifo(pipe)
    text = "".join(_line(i) for i in range(120))

    def feed() -> None:
        with open(pipe, "w", encoding="utf-8") as f:
            f.write(text)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=50)) as memory:
            report = memory.import_jsonl(pipe)
            assert report.imported == 120 and memory.stats().messages == 120
    finally:
        writer.join(5)


def test_a_file_changed_between_the_passes_stops_the_import_and_keeps_what_it_stored(tmp_path):
    dump = tmp_path / "dump.jsonl"
    dump.write_text("".join(_line(i) for i in range(30)), encoding="utf-8")
    done: list[int] = []

    def rewrite(n: int) -> None:  # the first chunk is stored: another writer replaces the file
        if not done:
            dump.write_text('{"type": "message"}\n' * 30, encoding="utf-8")
        done.append(n)

    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=10)) as memory:
        with pytest.raises(InvalidInputError, match="changed during the import: line 11"):
            memory.import_jsonl(dump, progress=rewrite)
        assert done == [10] and memory.stats().messages == 10


def test_checked_gives_the_lines_to_import_before_the_first_is_written(tmp_path):
    """The total a progress bar counts up to, from the first pass (the CLI read the file once
    more for it)."""
    dump = tmp_path / "dump.jsonl"
    dump.write_text("".join(_line(i) for i in range(12)) + "\n" + '{"type": "message"}\n', encoding="utf-8")
    calls: list[tuple[str, int]] = []
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=5)) as memory:
        report = memory.import_jsonl(dump, skip_invalid=True, checked=lambda n: calls.append(("checked", n)),
                                     progress=lambda n: calls.append(("progress", n)))
    assert report.imported == 12 and len(report.invalid) == 1
    assert calls == [("checked", 12), ("progress", 5), ("progress", 5), ("progress", 2)]


def _audit(i: int, at: float) -> str:
    return json.dumps({"format": "tiered-memory/1", "type": "audit", "audit": {
        "user_id": f"u{i % 2}", "layer": "working", "item_id": f"w{i}", "action": "evict", "at": at,
        "details": {"text": f"{i:05d}" * 3200}}}) + "\n"


def test_the_audit_log_is_restored_in_batches_in_the_order_of_its_times(tmp_path):
    """The audit log was held whole (every entry of the file at once) to be written in one
    transaction by time: now in batches of ``write_chunk``, read back in the order of their times."""
    n = 200
    dump = tmp_path / "audit.jsonl"  # later lines hold earlier times, and every tenth time is repeated
    dump.write_text("".join(_audit(i, 1_700_000_000.0 + (n - i) // 10 * 10) for i in range(n)), encoding="utf-8")
    size = dump.stat().st_size
    assert size > 3_000_000
    expected = {user: sorted(((1_700_000_000.0 + (n - i) // 10 * 10, f"w{i}") for i in range(n) if f"u{i % 2}" == user),
                             key=lambda e: e[0]) for user in ("u0", "u1")}
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=20)) as memory:
        warm = tmp_path / "warm.jsonl"  # the log the store held before the import: it stays first
        warm.write_text(_audit(n, 1_800_000_000.0).replace('"u0"', '"u1"'), encoding="utf-8")
        memory.import_jsonl(warm)
        report, peak = _import_peak(memory, dump)
        assert (report.audit_imported, report.audit_skipped) == (n, 0)
        assert [(e.at, e.item_id) for e in memory.audit_log("u0")] == expected["u0"]
        assert [(e.at, e.item_id) for e in memory.audit_log("u1")] == [(1_800_000_000.0, f"w{n}"), *expected["u1"]]
        again = memory.import_jsonl(dump)
        assert (again.audit_imported, again.audit_skipped) == (0, n) and len(memory.audit_log("u0")) == n // 2
    assert peak < size / 3, f"the import held {peak:,} bytes at its peak for a {size:,}-byte file"


def _fact(i: int, n: int) -> str:
    """A fact line, every tenth the history of a deleted fact; the history's places interleave the
    facts (every add first, then every edit), as a long-lived memory's do."""
    fact_id, at = f"f{i:04d}", 1_700_000_000.0 + i
    old, new = f"User likes tea number {i}", f"User likes green tea number {i}"
    history = [{"fact_id": fact_id, "action": action, "old_text": before, "new_text": after, "at": at + j,
                "details": {"page": f"{i:05d}" * 1600}, "seq": seq}
               for j, (action, before, after, seq) in enumerate((("add", None, old, i), ("edit", old, new, n + i)))]
    if i % 10 == 9:
        return json.dumps({"format": "tiered-memory/1", "type": "fact_history", "user_id": "u", "fact_id": fact_id,
                           "history": history}) + "\n"
    return json.dumps({"format": "tiered-memory/1", "type": "fact", "history": history, "fact": {
        "id": fact_id, "user_id": "u", "type": "preference", "text": new, "confidence": 1.0,
        "created_at": at, "updated_at": at + 1, "valid_from": at}}) + "\n"


def test_facts_and_their_history_are_restored_a_batch_at_a_time_in_the_history_order(tmp_path):
    """Facts with their history were held whole (every fact line of the file, and every vector) to
    be written in one transaction in the history's order: now read in batches of ``write_chunk``,
    held on disk and sorted there, into one transaction all the same."""
    n = 200
    dump = tmp_path / "facts.jsonl"
    dump.write_text("".join(_fact(i, n) for i in range(n)), encoding="utf-8")
    size = dump.stat().st_size
    assert size > 3_000_000
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=10)) as memory:
        kept = memory.add_fact("User lives in Lisbon", user_id="u")  # the store's history stays first
        report, peak = _import_peak(memory, dump)
        assert (report.facts_imported, report.histories_imported) == (n - n // 10, n // 10)
        history = [(c.fact_id, c.action) for c in memory.fact_history("u")]
        assert history == [(kept.id, "add"), *((f"f{i:04d}", "add") for i in range(n)),
                           *((f"f{i:04d}", "edit") for i in range(n))]
        assert memory.search_facts("green tea number 123", user_id="u", k=1)[0].fact.id == "f0123"
        again = memory.import_jsonl(dump)
        assert (again.facts_skipped, again.histories_skipped) == (n - n // 10, n // 10)
        assert len(memory.fact_history("u")) == 2 * n + 1
    assert peak < size / 3, f"the import held {peak:,} bytes at its peak for a {size:,}-byte file"


def test_a_history_without_places_is_restored_by_time_across_batches(tmp_path):
    """An export from before history entries said their place is written by time, stable, the
    entries of stored facts before those of deleted ones at one time: as it was held whole."""
    def line(i: int, times: tuple[float, float], gone: bool = False) -> str:
        history = [{"fact_id": f"f{i}", "action": action, "old_text": None, "new_text": f"User likes tea {i}",
                    "at": at, "details": {}} for action, at in zip(("add", "edit"), times)]
        if gone:
            return json.dumps({"type": "fact_history", "user_id": "u", "fact_id": f"f{i}", "history": history}) + "\n"
        return json.dumps({"type": "fact", "history": history, "fact": {
            "id": f"f{i}", "user_id": "u", "type": "preference", "text": f"User likes tea {i}", "confidence": 1.0,
            "created_at": times[0], "updated_at": times[1], "valid_from": times[0]}}) + "\n"

    dump = tmp_path / "old.jsonl"  # four lines: two batches of two
    dump.write_text(line(0, (30.0, 50.0)) + line(1, (10.0, 40.0), gone=True) + line(2, (10.0, 20.0))
                    + line(3, (20.0, 60.0), gone=True), encoding="utf-8")
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=2)) as memory:
        report = memory.import_jsonl(dump)
        assert (report.facts_imported, report.histories_imported) == (2, 2)
        assert [(c.fact_id, c.at) for c in memory.fact_history("u")] == [
            ("f2", 10.0), ("f1", 10.0), ("f2", 20.0), ("f3", 20.0), ("f0", 30.0), ("f1", 40.0), ("f0", 50.0),
            ("f3", 60.0)]


def test_facts_and_history_read_in_batches_are_still_one_write(tmp_path):
    """The facts and their history are read a batch at a time but written in one transaction: a
    write that fails at the last history entry (a trigger here) stores no fact of any batch, so
    the import run again writes them all, with their history in its order."""
    import sqlite3

    from tiered_memory.errors import StoreError

    n = 30
    dump = tmp_path / "facts.jsonl"
    dump.write_text("".join(_fact(i, n) for i in range(n)), encoding="utf-8")
    with TieredMemory(tmp_path / "mem", config=MemoryConfig(write_chunk=4)) as memory:
        assert memory.fact_history("u") == []  # the layers' tables made
        with sqlite3.connect(tmp_path / "mem" / "records.sqlite3") as db:
            db.execute("CREATE TRIGGER refuse BEFORE INSERT ON fact_history WHEN NEW.fact_id = 'f0029'"
                       " BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(StoreError, match="refused"):
            memory.import_jsonl(dump)
        assert memory.facts("u", include_invalid=True) == [] and memory.fact_history("u") == []
        with sqlite3.connect(tmp_path / "mem" / "records.sqlite3") as db:
            db.execute("DROP TRIGGER refuse")
        report = memory.import_jsonl(dump)
        assert (report.facts_imported, report.histories_imported) == (n - n // 10, n // 10)
        assert [(c.fact_id, c.action) for c in memory.fact_history("u")] == [
            *((f"f{i:04d}", "add") for i in range(n)), *((f"f{i:04d}", "edit") for i in range(n))]
        assert memory.search_facts("green tea number 17", user_id="u", k=1)[0].fact.id == "f0017"
