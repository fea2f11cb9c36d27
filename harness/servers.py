"""The chaos run's own servers: a Redis and a PostgreSQL (Debian's server binaries) on free
loopback ports, each with a password, that the run restarts, crashes and empties. Once stopped,
they refuse to start again (a fault's thread restarting one as the run ends, Ctrl-C say, would
leave it running)."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from harness.tls import TLSFiles
from sas_app.testing.processes import Stopped, free_port, wait_until


def _postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise SystemExit("PostgreSQL's server binaries are missing: apt-get install postgresql (scripts/test does)")
    return found[-1].parent


class Servers:
    """A Redis and a PostgreSQL of the run's own, each on a free loopback port with a password."""

    def __init__(self, home: Path, tls: TLSFiles | None = None) -> None:
        """``tls``: both servers speak only TLS, with that certificate (the TLS tests')."""
        self.home = home
        self.tls = tls
        self.redis_password = secrets.token_hex(12)
        self.pg_password = secrets.token_hex(12)
        self.redis_port = free_port()
        self.pg_port = free_port()
        self.redis_dir = home / "redis"
        # Its own folder under the system's temp dir: as root, PostgreSQL runs as the postgres
        # user, which must be able to reach it (a home under a private folder would not do).
        self.pg_root = Path(tempfile.mkdtemp(prefix="sas-chaos-pg-"))
        self.pg_data = self.pg_root / "data"
        self.redis_proc: subprocess.Popen[bytes] | None = None
        self.bin = _postgres_bin()
        # initdb and postgres refuse to run as root: as root, they run as the postgres user.
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            pwd.getpwnam("postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.lock = threading.RLock()  # a start and stop() never interleave
        self.stopped = False

    @property
    def redis_url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://:{self.redis_password}@127.0.0.1:{self.redis_port}/0"

    def redis_client(self, **options: Any) -> redis.Redis:
        tls = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(self.tls.ca)} if self.tls else {}
        return redis.Redis.from_url(self.redis_url, **tls, **options)

    @property
    def _pg_tls(self) -> str:
        """With TLS: the certificate verified, and its name (127.0.0.1) checked against the host's."""
        return f"?sslmode=verify-full&sslrootcert={self.tls.ca}" if self.tls else ""

    @property
    def database_url(self) -> str:
        """The stack's: a role that is not a superuser, so that a connection limit holds for it."""
        return f"postgresql+psycopg2://app:{self.pg_password}@127.0.0.1:{self.pg_port}/sas{self._pg_tls}"

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg2://sas:{self.pg_password}@127.0.0.1:{self.pg_port}/postgres{self._pg_tls}"

    def secrets(self) -> list[str]:
        return [self.redis_password, self.pg_password]

    # Redis ------------------------------------------------------------------------------------

    def refuse_if_stopped(self, what: str) -> None:
        if self.stopped:
            raise Stopped(f"not starting {what}: the run has stopped its servers")

    def start_redis(self) -> None:
        with self.lock:
            self.refuse_if_stopped("Redis")
            self.redis_dir.mkdir(parents=True, exist_ok=True)
            ports = ["--port", str(self.redis_port)]
            if self.tls:  # TLS only: no plain port
                ports = ["--port", "0", "--tls-port", str(self.redis_port), "--tls-cert-file", str(self.tls.cert),
                         "--tls-key-file", str(self.tls.key), "--tls-ca-cert-file", str(self.tls.ca),
                         "--tls-auth-clients", "no"]
            with open(self.redis_dir / "redis.log", "ab") as log:
                self.redis_proc = subprocess.Popen(
                    ["redis-server", *ports, "--bind", "127.0.0.1", "--requirepass",
                     self.redis_password, "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                     "--dir", str(self.redis_dir), "--protected-mode", "yes",
                     # its command line and environment kept: a test finds the run's processes by them
                     "--set-proc-title", "no"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
        client = self.redis_client(socket_timeout=1)
        wait_until(lambda: bool(client.ping()), 30, "Redis to answer")
        client.close()

    def kill_redis(self) -> None:
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            self.redis_proc.kill()
            self.redis_proc.wait(10)

    def flushall(self) -> None:
        client = self.redis_client(socket_timeout=5)
        client.flushall()
        client.close()

    # PostgreSQL ---------------------------------------------------------------------------------

    def _pg(self, *argv: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*self.as_user, *argv], check=True, capture_output=True, timeout=120, **kwargs)

    def init_postgres(self) -> None:
        self.pg_data.parent.mkdir(parents=True, exist_ok=True)
        pwfile = self.pg_data.parent / "pw"
        pwfile.write_text(self.pg_password + "\n")
        if self.as_user:
            account = pwd.getpwnam("postgres")
            self.pg_data.parent.chmod(0o755)
            os.chown(self.pg_data.parent, account.pw_uid, account.pw_gid)
            os.chown(pwfile, account.pw_uid, account.pw_gid)
        self._pg(str(self.bin / "initdb"), "-D", str(self.pg_data), "-U", "sas", f"--pwfile={pwfile}",
                 "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        with open(self.pg_data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {self.pg_port}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.pg_data.parent}'\nmax_connections = 300\n"
                       "logging_collector = off\n")
        if self.tls:
            self._pg_only_tls()
        self.start_postgres()
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE ROLE app LOGIN PASSWORD '{self.pg_password}'"))
            conn.execute(text("CREATE DATABASE sas OWNER app"))
        admin.dispose()

    def _pg_only_tls(self) -> None:
        """PostgreSQL with the TLS tests' certificate, refusing any connection over TCP without TLS."""
        assert self.tls is not None
        for name, source in (("server.crt", self.tls.cert), ("server.key", self.tls.key)):
            target = self.pg_data / name
            shutil.copy(source, target)
            target.chmod(0o600)
            if self.as_user:
                account = pwd.getpwnam("postgres")
                os.chown(target, account.pw_uid, account.pw_gid)
        with open(self.pg_data / "postgresql.conf", "a") as conf:
            conf.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
        hba = self.pg_data / "pg_hba.conf"
        lines = [line.replace("host ", "hostssl ", 1) if line.startswith("host ") else line
                 for line in hba.read_text().splitlines()]
        hba.write_text("\n".join(lines) + "\n")

    def refuse_connections(self, hold: float) -> int:
        """PostgreSQL refuses the stack every new connection for ``hold`` seconds (its role's
        connection limit set to 0, as when ``max_connections`` is reached) and drops half of those it
        has, so that their processes must ask for new ones meanwhile; how many it dropped."""
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with admin.connect() as conn:
                conn.execute(text("ALTER ROLE app CONNECTION LIMIT 0"))
                try:
                    dropped = conn.execute(text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE usename = 'app' AND pid % 2 = 0")).scalar_one()
                    time.sleep(hold)
                finally:
                    conn.execute(text("ALTER ROLE app CONNECTION LIMIT -1"))
        finally:
            admin.dispose()
        return int(dropped)

    def start_postgres(self) -> None:
        with self.lock:
            self.refuse_if_stopped("PostgreSQL")
            self._pg(str(self.bin / "pg_ctl"), "-D", str(self.pg_data), "-l",
                     str(self.pg_data.parent / "postgres.log"), "-w", "-t", "60", "start")

    def stop_postgres(self, mode: str = "immediate") -> None:
        self._pg(str(self.bin / "pg_ctl"), "-D", str(self.pg_data), "-m", mode, "-w", "-t", "60", "stop")

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
        self.kill_redis()
        try:
            self.stop_postgres("fast")
        except Exception:
            pass
        # the database's log is kept beside the others
        log = self.pg_data.parent / "postgres.log"
        if log.exists():
            shutil.copy(log, self.home / "logs" / "postgres.log")
        shutil.rmtree(self.pg_root, ignore_errors=True)
