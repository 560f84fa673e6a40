"""scripts/local_llm.py without starting a server: pure decisions and the process helpers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llm_server import _local_llm

llm = _local_llm()


@pytest.mark.parametrize(("cpus", "load1", "threads"), [
    (2, 0.0, 2), (2, 1.4, 2),   # idle (the test process itself waits on the server)
    (2, 1.6, 1), (2, 11.0, 1),  # busy: one thread, or throughput collapses
    (1, 0.0, 1), (1, 9.0, 1),
    (8, 3.0, 8), (8, 8.0, 4),
    (0, 0.0, 1),
])
def test_choose_threads(cpus: int, load1: float, threads: int) -> None:
    assert llm.choose_threads(cpus, load1) == threads


def test_server_command_serves_the_checked_model_on_localhost() -> None:
    cmd = llm.server_command(8123, n_threads=3)
    args = dict(zip(cmd[3::2], cmd[4::2]))
    assert cmd[1:3] == ["-m", "llama_cpp.server"]
    assert args["--host"] == "127.0.0.1" and args["--port"] == "8123"
    assert args["--model"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert args["--model_alias"] == "qwen" and args["--n_threads"] == "3"


def test_free_port_is_bindable() -> None:
    import socket

    port = llm.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.mark.timeout(60)  # a wait that ignored its 0.5 s would hang here, not pass
def test_wait_ready_times_out_when_nothing_listens() -> None:
    with pytest.raises(TimeoutError, match="not ready"):
        llm.wait_ready(f"http://127.0.0.1:{llm.free_port()}", 0.5)


def test_wait_ready_fails_fast_when_the_server_died() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(10)
    with pytest.raises(llm.SetupError, match="exited with code 3"):
        llm.wait_ready(f"http://127.0.0.1:{llm.free_port()}", 30, proc=proc)


@pytest.mark.timeout(60)
def test_stop_server_kills_a_process_that_ignores_sigterm() -> None:
    # like llama.cpp's server while it generates
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    assert llm.stop_server(proc, grace=0.5) == -9  # killed after its grace, not waited for (60 s)
    proc.stdout.close()


def test_the_server_marker_setup_writes_is_the_one_is_set_up_reads(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """ensure_server marks the build it made (version and flags), is_set_up accepts exactly that
    mark, and a server built with other flags is built again, not taken from pip's cache."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    model = tmp_path / "model.gguf"
    model.write_text("weights")
    for name, value in (("LLM_DIR", tmp_path), ("VENV", venv), ("VENV_PYTHON", venv / "bin" / "python"),
                        ("MODEL_FILE", model)):
        monkeypatch.setattr(llm, name, value)
    installs: list[tuple[str, ...]] = []
    monkeypatch.setattr(llm, "_pip", lambda *args, env=None: installs.append(args))
    monkeypatch.setattr(llm.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
    llm._mark("model", llm.MODEL_SHA256)
    llm.ensure_server()
    assert installs == [(llm.SERVER_REQUIREMENT,)] and llm.is_set_up()
    llm.ensure_server()  # done: nothing installed again
    assert len(installs) == 1
    llm._mark("server", llm.SERVER_REQUIREMENT)  # a build of before, without the portable flags
    assert not llm.is_set_up()
    llm.ensure_server()
    assert installs[-1][:3] == ("--force-reinstall", "--no-deps", "--no-cache-dir") and llm.is_set_up()
