"""A database that vanishes from the network — a failover that moved the primary's address, a host
gone — sends no reset: a statement sent to it is retransmitted unanswered, and without a limit the
worker slot waits for TCP's own timeout (about fifteen minutes). Here the client runs in a network
namespace of its own, reaching PostgreSQL across a veth pair, and the pair's far end is taken down
under it."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest

from tests.integration.stack import CHECKOUT_PATH, REPO

pytestmark = pytest.mark.integration

#: the client: one connection of the store's engine, a statement, then — once told — another
CLIENT = """
import sys, time
from sqlalchemy import text
from sas_app.store import make_engine
engine = make_engine(sys.argv[1])
with engine.connect() as conn:
    conn.execute(text("SELECT 1"))
    print("connected", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    try:
        conn.execute(text("SELECT 1"))
        print("answered", flush=True)
    except Exception as exc:
        print(f"failed {type(exc).__name__} {time.monotonic() - started:.1f}", flush=True)
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def far_host() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this one by a veth pair: ``(namespace, this side's address,
    this side's interface)``. Needs root, as `ip netns` does."""
    n = os.getpid() % 250 + 1
    name, near, far = f"sas-vanish-{os.getpid()}", f"sasv{os.getpid() % 100000}a", f"sasv{os.getpid() % 100000}b"
    ip("netns", "add", name)
    try:
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        ip("link", "set", far, "netns", name)
        ip("addr", "add", f"10.213.{n}.1/30", "dev", near)
        ip("link", "set", near, "up")
        ip("netns", "exec", name, "ip", "addr", "add", f"10.213.{n}.2/30", "dev", far)
        ip("netns", "exec", name, "ip", "link", "set", far, "up")
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield name, f"10.213.{n}.1", near
    finally:
        with suppress(subprocess.CalledProcessError):
            ip("link", "del", near)
        ip("netns", "del", name)


@contextmanager
def relay(listen: str, to: tuple[str, int]) -> Iterator[int]:
    """A TCP relay on ``listen`` (a port of its own) to ``to``, in a thread: the far host reaches
    PostgreSQL, which listens on this host's loopback only, through it."""
    server = socket.create_server((listen, 0))
    stop = threading.Event()

    def pump() -> None:
        sel = selectors.DefaultSelector()
        sel.register(server, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        while not stop.is_set():
            for key, _ in sel.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is server:
                    client, _ = server.accept()
                    upstream = socket.create_connection(to)
                    peers[client], peers[upstream] = upstream, client
                    sel.register(client, selectors.EVENT_READ)
                    sel.register(upstream, selectors.EVENT_READ)
                    continue
                data = b""
                with suppress(OSError):
                    data = sock.recv(1 << 16)
                if data:
                    peers[sock].sendall(data)
                    continue
                other = peers.pop(sock)
                peers.pop(other, None)
                for s in (sock, other):
                    sel.unregister(s)
                    s.close()
        for s in peers:
            s.close()
        server.close()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)


def test_a_statement_to_a_database_that_vanished_from_the_network_fails_within_half_a_minute(postgres_admin):
    """The store's connections tell libpq to give up on data unacknowledged for 30 s (and to probe
    idle connections): the statement fails as on any lost connection, and what it was doing is
    retried or recovered, instead of holding its worker slot for a quarter of an hour."""
    assert os.geteuid() == 0, "this test makes a network namespace (ip netns): run it as root, as CI does"
    url = postgres_admin.url
    with far_host() as (namespace, address, near), relay(address, (url.host or "127.0.0.1", url.port or 5432)) as port:
        through = url.set(host=address, port=port).render_as_string(hide_password=False)
        client = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", CLIENT, through],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=REPO, env={**os.environ, "PYTHONPATH": CHECKOUT_PATH})
        try:
            assert client.stdout is not None and client.stdin is not None
            assert client.stdout.readline() == "connected\n", client.stderr.read() if client.stderr else ""
            ip("link", "set", near, "down")  # the far side hears nothing more, and says nothing
            client.stdin.write("go\n")
            client.stdin.flush()
            deadline = time.monotonic() + 90
            while client.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert client.poll() is not None, "the statement still waited after 90 s"
            said = client.stdout.read()
        finally:
            if client.poll() is None:
                client.kill()
            client.communicate()  # waits, and closes its pipes
    verdict, error, took = said.split()
    assert (verdict, error) == ("failed", "OperationalError")
    assert 20 <= float(took) <= 45  # tcp_user_timeout's 30 s, give or take the retransmissions' spacing
