"""A PostgreSQL store on a network that goes silent (a NAT that forgot the connection, a pulled
cable, a failed-over server whose old address drops packets): its connections carry keepalive and
``tcp_user_timeout`` settings (``NETWORK_DEFAULTS``, or the URL's or its service file's own), so a
call fails with a ``StoreError`` instead of waiting for the OS's TCP timeout, hours away.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.errors import StoreError
from tiered_memory.store.postgres import PostgresRecordStore

pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]  # a hang fails instead of blocking the suite

OPTIONS = {"keepalives": (socket.SOL_SOCKET, socket.SO_KEEPALIVE),
           "keepalives_idle": (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
           "keepalives_interval": (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
           "keepalives_count": (socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
           "tcp_user_timeout": (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)}


def socket_options(conn: Any) -> dict[str, int]:
    """The settings the OS applies to a connection's socket (what libpq made of its parameters)."""
    sock = socket.socket(fileno=socket.dup(conn.pgconn.socket))  # closing a duplicate leaves it open
    try:
        return {name: sock.getsockopt(level, option) for name, (level, option) in OPTIONS.items()}
    finally:
        sock.close()


@pytest.mark.parametrize("query, expected", [
    ("", {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
          "tcp_user_timeout": 60000}),
    ("?keepalives_idle=7&tcp_user_timeout=0", {"keepalives": 1, "keepalives_idle": 7, "keepalives_interval": 10,
                                               "keepalives_count": 3, "tcp_user_timeout": 0}),  # 0: off
])
def test_connections_carry_the_network_defaults_and_the_urls_own_settings_win(
        make_postgres_url: Callable[[], str], query: str, expected: dict[str, int]) -> None:
    store = PostgresRecordStore(make_postgres_url() + query, connect_timeout=5)
    try:
        found = store.read(socket_options)
    finally:
        store.close()
    assert {name: found[name] for name in expected} == expected


class SilentProxy:
    """A TCP proxy to a server that can go silent after passing some more bytes of the client's:
    it then passes nothing either way and reads nothing, yet closes no socket.

    Why this is the honest stand-in for a dead network: a proxy cannot drop packets, its kernel
    acknowledges what reaches its socket and answers keepalive probes, so only a client with data
    still to send notices, and only through ``tcp_user_timeout``: once the proxy's small receive
    buffer is full the client's window is zero, and the OS keeps probing a zero window for as long
    as the peer answers, unless ``tcp_user_timeout`` ends it (as it ends data that a dead network
    never acknowledges). Keepalives, which cover a call waiting for a reply, are checked through
    the socket settings above.
    """

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.socket()
        # fixed, not autotuned to megabytes: the client's window closes after a few dozen KB
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.settimeout(0.05)
        self.port = int(self.listener.getsockname()[1])
        self.budget: int | None = None  # client bytes still passed before going silent; None: all
        self.closed = False
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def silent_after(self, n: int) -> None:
        self.budget = n

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            client.settimeout(None)
            self.sockets += [client, socket.create_connection(("127.0.0.1", self.target))]
            self.threads.append(threading.Thread(target=self._pass, args=self.sockets[-2:], daemon=True))
            self.threads[-1].start()

    def _pass(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while not self.closed:
                ready = select.select([client, server], [], [], 0.05)[0] if self.budget != 0 else []
                for source in ready:
                    if self.budget == 0:
                        break
                    size = 65536 if source is server or self.budget is None else min(65536, self.budget)
                    data = source.recv(size)
                    if not data:
                        return
                    if source is client and self.budget is not None:
                        self.budget -= len(data)
                    (server if source is client else client).sendall(data)
                if self.budget == 0:
                    time.sleep(0.05)
        except OSError:
            return  # closed under it

    def close(self) -> None:
        self.closed = True
        for thread in self.threads:
            thread.join(timeout=10)
        for sock in [self.listener, *self.sockets]:
            sock.close()


def test_a_write_to_a_server_gone_silent_fails_with_a_store_error_instead_of_hanging(
        make_postgres_url: Callable[[], str], tmp_path: Path) -> None:
    """With the network settings on the connection's socket, the OS ends the stalled call and the
    store turns that into a ``StoreError``. The URL sets short ones here, so the test takes seconds;
    with ``NETWORK_DEFAULTS`` it takes about a minute of waiting, and what those add is only that the
    defaults reach the socket, which the test above checks."""
    settings = "tcp_user_timeout=2000&keepalives_idle=1&keepalives_interval=1&keepalives_count=2"  # seconds
    direct = urlsplit(make_postgres_url())
    proxy = SilentProxy(int(direct.port or 5432))
    proxied = direct._replace(netloc=f"{direct.username}@127.0.0.1:{proxy.port}", query=settings).geturl()
    memory = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(proxied, connect_timeout=2),
                          embedder=StaticEmbedder())
    outcome: list[BaseException | None] = []

    def large_add() -> None:
        try:
            memory.add("user", "a long paste " * 12_000, session_id="s", user_id="u")  # 156 KB
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    try:
        memory.add("user", "before the network went silent", session_id="s", user_id="u")
        proxy.silent_after(16 * 1024)  # what the call sends before the message's text passes, not the text
        call = threading.Thread(target=large_add, daemon=True)
        call.start()
        call.join(timeout=150)  # the hang guard, not a timing assertion
        assert not call.is_alive(), "the call hung on a silent network"
        assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome
    finally:
        proxy.close()  # first: resets whatever the pool still tries through it
        memory.close()
    again = TieredMemory(tmp_path / "m", record_store=PostgresRecordStore(direct.geturl()), embedder=StaticEmbedder())
    try:
        assert [m.content for m in again.get_messages("s", user_id="u")] == ["before the network went silent"]
    finally:
        again.close()


@pytest.mark.parametrize("named_in", ["url", "PGSERVICE"])
def test_a_service_files_own_network_settings_win_over_the_defaults(
        make_postgres_url: Callable[[], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_in: str) -> None:
    direct = urlsplit(make_postgres_url())
    (tmp_path / "pg_service.conf").write_text(
        f"[tm]\nhost={direct.hostname}\nport={direct.port}\ndbname={direct.path.lstrip('/')}\n"
        f"user={direct.username}\nkeepalives_idle=7\ntcp_user_timeout=0\n")
    monkeypatch.setenv("PGSERVICEFILE", str(tmp_path / "pg_service.conf"))
    if named_in == "PGSERVICE":
        monkeypatch.setenv("PGSERVICE", "tm")
    store = PostgresRecordStore("service=tm" if named_in == "url" else "postgresql://", connect_timeout=5)
    try:
        found = store.read(socket_options)
    finally:
        store.close()
    assert found == {"keepalives": 1, "keepalives_idle": 7, "keepalives_interval": 10, "keepalives_count": 3,
                     "tcp_user_timeout": 0}
