"""scripts/local_llm.py: pure decisions and the process helpers; the real server only under ``llm``."""

from __future__ import annotations

import signal
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
    assert cmd[0] == str(llm.VENV_PYTHON) and Path(cmd[1]) == Path(llm.__file__).resolve() and cmd[2] == "child"
    assert args["--port"] == "8123" and args["--threads"] == "3" and args["--n-ctx"] == str(llm.N_CTX)
    assert args["--model"].endswith("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert args["--alias"] == "qwen"


def test_the_child_command_line_reaches_the_server_with_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """What server_command writes is what ``child`` parses (the server itself is not started)."""
    seen: list[tuple[object, ...]] = []
    monkeypatch.setattr(llm, "run_child", lambda *a: seen.append(a) or 7)
    assert llm.main(llm.server_command(8123, n_threads=3)[2:]) == 7
    assert seen == [(str(llm.MODEL_FILE), "qwen", 8123, llm.N_CTX, 3)]


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
    """ensure_server marks the server it installed, is_set_up accepts exactly that mark, and a
    venv marked with another server (llama-cpp-python's source build of before) gets this one."""
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
    llm._mark("server", "llama-cpp-python[server]==0.3.36 CMAKE_ARGS=-DLLAVA_BUILD=OFF")  # the server of before
    assert not llm.is_set_up()
    llm.ensure_server()
    assert installs[-1] == (llm.SERVER_REQUIREMENT,) and llm.is_set_up()


@pytest.mark.llm
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_real_server_stops_on_a_signal_even_one_its_parent_ignored(sig: int) -> None:
    """The server (llama.cpp through xllamacpp) answers, then exits at once and cleanly on SIGTERM
    (stop_server's) or SIGINT (Ctrl-C), started with SIGINT ignored as a background job starts it."""
    if not llm.is_set_up():
        pytest.fail("the local LLM is not set up: run `make llm`", pytrace=False)
    port = llm.free_port()
    proc = subprocess.Popen(llm.server_command(port, n_threads=1), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        llm.wait_ready(f"http://127.0.0.1:{port}", 90, proc=proc)
        proc.send_signal(sig)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
