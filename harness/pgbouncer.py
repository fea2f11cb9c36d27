"""Debian's PgBouncer (scripts/test installs it) in transaction pooling mode, on a free loopback
port in front of a PostgreSQL server, as large fleets run it: for ``bench.throughput --pgbouncer``
and the integration tests marked ``pgbouncer_too``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

from sas_app.testing.processes import free_port, wait_until

CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
logfile = {dir}/pgbouncer.log
"""


@contextmanager
def pgbouncer(postgres_url: str) -> Iterator[int]:
    """Start a PgBouncer in transaction mode in front of ``postgres_url``'s server; yield its port."""
    tool = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(tool):
        raise RuntimeError("pgbouncer is missing: apt-get install pgbouncer (scripts/test does)")
    server = make_url(postgres_url)
    listen = free_port()
    with tempfile.TemporaryDirectory(prefix="sas-pgbouncer-") as where:
        home = Path(where)
        as_user = []
        if os.getuid() == 0:  # PgBouncer will not run as root: it runs as postgres, which reads and logs here
            shutil.chown(home, "postgres")
            as_user = ["-u", "postgres"]
        (home / "users.txt").write_text(f'"{server.username}" "{server.password or ""}"\n')
        (home / "pgbouncer.ini").write_text(CONFIG.format(host=server.host, port=server.port or 5432, listen=listen,
                                                          dir=home))
        log = home / "pgbouncer.log"  # its own log (logfile) and anything it says before it opens that
        with open(home / "pgbouncer.out", "wb") as out:
            proc = subprocess.Popen([tool, *as_user, str(home / "pgbouncer.ini")], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: _answers(listen) or proc.poll() is not None, 15, "PgBouncer to listen")
            if proc.poll() is not None:
                said = (home / "pgbouncer.out").read_text() + (log.read_text() if log.exists() else "")
                raise RuntimeError(f"pgbouncer exited: {said}")
            yield listen
        finally:
            proc.terminate()
            proc.wait(10)


def through(url: str, port: int) -> str:
    """``url`` (a database on the server behind the PgBouncer) by way of the PgBouncer on ``port``."""
    return make_url(url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
