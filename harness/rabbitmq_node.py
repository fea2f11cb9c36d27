"""The chaos run's own RabbitMQ: a node of its own (Debian's rabbitmq-server) on free loopback
ports, with a user and password of its own, that the run SIGKILLs and restarts and whose queues it
purges. It shares the machine's epmd; its Erlang cookie lives in its own folder."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from harness.tls import TLSFiles
from sas_app.testing.processes import Stopped, free_port, wait_until

BIN = Path("/usr/lib/rabbitmq/bin")


def purge_queues(ctl: Callable[..., str], vhost: str) -> dict[str, int]:
    """Empty every queue of ``vhost`` through ``ctl`` (a rabbitmqctl that returns what it printed):
    what is delivered and unacknowledged stays with its consumer. How many messages each held."""
    purged = {}
    for line in ctl("list_queues", "-p", vhost, "name", "messages_ready").splitlines():
        name, _, ready = line.rpartition("\t")
        if name and ready.isdigit() and int(ready):
            ctl("purge_queue", "-p", vhost, name)
            purged[name] = int(ready)
    return purged


class RabbitNode:
    def __init__(self, home: Path, tls: TLSFiles | None = None) -> None:
        """``tls``: the node listens only with TLS, with that certificate (the TLS tests')."""
        if not (BIN / "rabbitmq-server").exists():
            raise SystemExit("RabbitMQ is missing: apt-get install rabbitmq-server (scripts/test does)")
        self.home = home
        self.port = free_port()
        self.dist_port = free_port()
        self.name = f"sas-chaos-{self.port}@localhost"
        self.password = secrets.token_hex(12)
        # Under the system's temp dir: Erlang wants short paths, and the logs are copied out at the end.
        self.root = Path(tempfile.mkdtemp(prefix="sas-chaos-rabbit-"))
        (self.root / "home").mkdir()
        self.tls = tls
        listen = f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
        if tls:
            listen = (f"listeners.tcp = none\nlisteners.ssl.default = 127.0.0.1:{self.port}\n"
                      f"ssl_options.cacertfile = {tls.ca}\nssl_options.certfile = {tls.cert}\n"
                      f"ssl_options.keyfile = {tls.key}\nssl_options.verify = verify_none\n"
                      "ssl_options.fail_if_no_peer_cert = false\n")
        (self.root / "rabbitmq.conf").write_text(listen + "loopback_users.guest = true\n")
        (self.root / "rabbitmq-env.conf").write_text("")
        (self.root / "enabled_plugins").write_text("[].\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()  # a start and stop() never interleave; none after stop()
        self.stopped = False
        self.created_user = False

    @property
    def url(self) -> str:
        return f"{'amqps' if self.tls else 'amqp'}://sas:{self.password}@127.0.0.1:{self.port}//"

    def env(self) -> dict[str, str]:
        r = self.root
        return {**os.environ, "HOME": str(r / "home"), "RABBITMQ_CONF_ENV_FILE": str(r / "rabbitmq-env.conf"),
                "RABBITMQ_NODENAME": self.name, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_CONFIG_FILE": str(r / "rabbitmq.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(r / "enabled_plugins"),
                "RABBITMQ_MNESIA_BASE": str(r / "mnesia"), "RABBITMQ_LOG_BASE": str(r / "log"),
                "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}"}

    def ctl(self, *args: str) -> str:
        done = subprocess.run([str(BIN / "rabbitmqctl"), "-q", "-n", self.name, *args], env=self.env(),
                              capture_output=True, text=True, timeout=90)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {args[0]}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def start(self) -> None:
        """Start the node (in the foreground of a process group of its own) and wait until it serves."""
        with self.lock:
            if self.stopped:
                raise Stopped(f"not starting RabbitMQ node {self.name}: the run has stopped it")
            with open(self.root / "node.log", "ab") as log:
                self.proc = subprocess.Popen([str(BIN / "rabbitmq-server")], env=self.env(), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        # await_startup fails at once until the node has registered with epmd: ask until it answers
        wait_until(self._started, 90, f"RabbitMQ node {self.name} to start", interval=0.3, not_yet=())
        if not self.created_user:
            self.ctl("add_user", "sas", self.password)
            self.ctl("set_permissions", "-p", "/", "sas", ".*", ".*", ".*")
            self.created_user = True

    def _started(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"RabbitMQ node {self.name} exited: {(self.root / 'node.log').read_text()[-2000:]}")
        try:
            self.ctl("await_startup", "--timeout", "30")
            return True
        except RuntimeError:
            return False

    def kill(self) -> None:
        """SIGKILL the node: what it confirmed it has on disk; what it had not, the publisher was told."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def purge(self) -> int:
        """Empty every queue; how many messages that took."""
        return sum(purge_queues(self.ctl, "/").values())

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
        self.kill()
        logs = self.home / "logs"
        for log in [self.root / "node.log", *sorted((self.root / "log").glob("*.log"))]:
            if log.exists() and logs.exists():
                shutil.copy(log, logs / f"rabbitmq-{log.name}")
        shutil.rmtree(self.root, ignore_errors=True)
