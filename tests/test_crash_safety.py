"""Crash safety: a writer killed with SIGKILL loses nothing it acknowledged.

A *zygote* process (this file run as a script) loads the real MiniLM model once,
then forks one writer per trial. The writer opens the store and calls
``add_many`` in a loop; only after ``add_many`` returns does it append the
batch's ids to an acknowledgement file. The test SIGKILLs the writer at a random
moment (sometimes while it is still opening and repairing the store), reopens
the store in this process and checks that:

* every acknowledged message is in the record store, byte for byte;
* no batch is partly stored (``add_many`` is all-or-nothing);
* every stored message is indexed again (the vector index is repaired on open)
  and every acknowledged message is found by ``search``.

All trials reuse one folder, so later writers also start on a store left
behind by a crash.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

TRIALS = 10
SEARCHED_PER_TRIAL = 4
BATCH = 6
USERS = ["alice", "bob", "carol"]
WORDS = ("harbour lantern orchard violin glacier pepper comet saddle meadow anchor walnut "
         "thunder ribbon canyon falcon marble tulip compass ember quartz").split()


def content_of(trial: int, batch: int, i: int) -> str:
    """Deterministic, distinct text; the tag makes each message findable by keyword."""
    rnd = random.Random(trial * 100_003 + batch * 101 + i)
    words = " ".join(rnd.sample(WORDS, 6))
    return f"note zq{trial}x{batch}y{i} about {words} and the number {rnd.randint(0, 10**6)}"


def batch_of(trial: int, batch: int) -> tuple[str, list[dict[str, Any]]]:
    user = USERS[(trial + batch) % len(USERS)]
    msgs = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": content_of(trial, batch, i),
         "metadata": {"trial": trial, "batch": batch, "i": i}}
        for i in range(BATCH)
    ]
    return user, msgs


# ---------------------------------------------------------------------------
# child side (runs in the zygote's forked children)
# ---------------------------------------------------------------------------
def _writer(path: str, ack_path: str, trial: int, embedder: Any) -> None:
    from tiered_memory import TieredMemory

    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    memory = TieredMemory(path, embedder=embedder)
    os.write(fd, b'{"opened": true}\n')
    batch = 0
    while True:
        user, msgs = batch_of(trial, batch)
        ids = memory.add_many(msgs, session_id=f"t{trial}", user_id=user)
        # acknowledged: add_many returned; only now report it
        os.write(fd, (json.dumps({"trial": trial, "batch": batch, "user": user, "ids": ids}) + "\n").encode())
        batch += 1


def _zygote() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    import torch

    # forked children inherit a single-threaded torch; no thread pool to deadlock on
    torch.set_num_threads(1)
    import chromadb  # noqa: F401  (pre-import so children start fast)

    from tiered_memory import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder()
    embedder.embed_query("warm up")
    print("ready", flush=True)
    for line in sys.stdin:
        path, ack_path, trial = line.split("\t")
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _writer(path, ack_path, int(trial), embedder)
            except BaseException as e:  # pragma: no cover - reported to the parent
                with open(ack_path, "a") as f:
                    f.write(json.dumps({"error": repr(e)}) + "\n")
                code = 1
            os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exited {status}", flush=True)


# ---------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------
class Zygote:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )
        self.ready = False  # awaited at the first start: the test's own model loads meanwhile

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"zygote died (exit {self.proc.wait()})")
        return line.strip()

    def start(self, path: Path, ack: Path, trial: int) -> int:
        assert self.proc.stdin is not None
        if not self.ready:
            assert self._line() == "ready"
            self.ready = True
        self.proc.stdin.write(f"{path}\t{ack}\t{trial}\n")
        self.proc.stdin.flush()
        kind, pid = self._line().split()
        assert kind == "pid"
        return int(pid)

    def reaped(self) -> int:
        kind, status = self._line().split()
        assert kind == "exited"
        return int(status)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def report(request: pytest.FixtureRequest, line: str) -> None:
    """Show a figure in pytest's output even without ``-s``."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:  # pragma: no cover
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("\n" + line)


def wait_for_open(ack: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ack.exists() and b'"opened"' in ack.read_bytes():
            return
        time.sleep(0.02)
    raise AssertionError(f"writer did not open the store within {timeout}s: {ack}")


def read_acks(ack: Path) -> tuple[bool, list[dict[str, Any]]]:
    opened, batches = False, []
    if not ack.exists():
        return opened, batches
    for line in ack.read_text().splitlines():
        rec = json.loads(line)  # a line is written by one write(2): never torn
        assert "error" not in rec, f"writer failed instead of being killed: {rec['error']}"
        if rec.get("opened"):
            opened = True
        else:
            batches.append(rec)
    return opened, batches


@pytest.mark.slow
def test_sigkill_loses_no_acknowledged_write(zygote: Zygote, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from tiered_memory import TieredMemory

    embedder = request.getfixturevalue("embedder")  # loads (if no test has yet) while the zygote loads its own

    rnd = random.Random(int(os.environ.get("CRASH_SEED", "1234")))
    path = tmp_path / "store"
    acknowledged: dict[str, tuple[int, int, int, str]] = {}  # id -> (trial, batch, i, user)
    searched = killed_while_opening = 0
    started = time.monotonic()
    for trial in range(TRIALS):
        ack = tmp_path / f"ack{trial}.jsonl"
        pid = zygote.start(path, ack, trial)
        if trial % 4 == 1:  # kill while the writer opens and repairs the store
            time.sleep(rnd.uniform(0.0, 1.5))
        else:  # kill somewhere in the stream of add_many calls
            wait_for_open(ack, timeout=120)
            time.sleep(rnd.uniform(0.05, 1.0))
        os.kill(pid, signal.SIGKILL)
        status = zygote.reaped()
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
            f"trial {trial}: writer ended on its own ({status}); see {ack}"
        opened, batches = read_acks(ack)
        killed_while_opening += not opened
        new_ids = []
        for b in batches:
            for i, mid in enumerate(b["ids"]):
                acknowledged[mid] = (b["trial"], b["batch"], i, b["user"])
                new_ids.append(mid)

        with TieredMemory(path, embedder=embedder) as memory:
            # 1. record store: every acknowledged write, exact; no partial batch
            con = memory.store.conn  # type: ignore[attr-defined]
            rows = {r[0]: r for r in con.execute(
                "SELECT id, user_id, session_id, content, metadata, indexed, duplicate_of FROM messages")}
            for mid, (t, b, i, user) in acknowledged.items():
                assert mid in rows, f"acknowledged message {mid} (trial {t} batch {b}) lost"
                _, r_user, r_session, r_content, r_meta, _, _ = rows[mid]
                assert (r_user, r_session, r_content) == (user, f"t{t}", content_of(t, b, i))
                assert json.loads(r_meta) == {"trial": t, "batch": b, "i": i}
            per_batch: dict[tuple[int, int], int] = {}
            for r in rows.values():
                meta = json.loads(r[4])
                per_batch[(meta["trial"], meta["batch"])] = per_batch.get((meta["trial"], meta["batch"]), 0) + 1
            partial = {k: n for k, n in per_batch.items() if n != BATCH}
            assert not partial, f"partly stored batches: {partial}"

            # 2. vector index repaired: every row indexed, every non-duplicate has its vector
            assert all(r[5] == 1 for r in rows.values()), "rows left unindexed after reopen"
            vectors = memory.index.ids()
            missing = [mid for mid, r in rows.items() if r[6] is None and mid not in vectors]
            assert not missing, f"{len(missing)} stored messages have no vector after reopen"
            ghosts = {v for v in vectors if ":" not in v} - set(rows)  # ":" marks fact/episode vectors
            assert not ghosts, "vectors without a record survived repair"

            # 3. findable: every new write by its keyword tag, a random sample by full search
            for mid in new_ids:
                t, b, i, user = acknowledged[mid]
                tagged = memory.store.keyword_search(user, f'"zq{t}x{b}y{i}"', k=2)
                assert [x[0] for x in tagged] == [mid], f"acknowledged {mid} not in the keyword index"
            for mid in rnd.sample(new_ids, min(len(new_ids), SEARCHED_PER_TRIAL)):
                t, b, i, user = acknowledged[mid]
                hits = memory.search(content_of(t, b, i), user_id=user, k=3)
                assert mid in [h.id for h in hits], f"acknowledged {mid} not found by search"
                searched += 1

    elapsed = time.monotonic() - started
    summary = (f"crash safety: {TRIALS} SIGKILL trials, {len(acknowledged)} acknowledged writes "
               f"checked (record store, keyword and vector index), {searched} also by search(), "
               f"{killed_while_opening} kills during open/repair, {elapsed:.0f}s")
    report(request, summary)
    assert len(acknowledged) > 0, "no write was acknowledged in any trial; kills are too early"


if __name__ == "__main__" and sys.argv[1:] == ["zygote"]:
    _zygote()
