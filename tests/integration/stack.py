"""Real processes for integration tests: the payment and warehouse services, Celery workers and
beat, each in its own process group so a test can SIGKILL one (and its pool children) and start
it again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support import wait_for

REPO = Path(__file__).resolve().parents[2]
SAS = str(Path(sys.executable).parent / "sas")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = {**os.environ, "PYTHONPATH": str(REPO), **env}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.ports = {name: int(self.env[f"{name.upper()}_SERVICE_URL"].rsplit(":", 1)[1])
                      for name in ("payment", "warehouse")}

    def start(self, name: str, argv: list[str], ready: str, env: dict[str, str] | None = None) -> None:
        log = self.home / f"{name}.log"
        self.logs[name] = log
        with open(log, "ab") as out:
            out.write(f"--- start {' '.join(argv)}\n".encode())
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
                cwd=self.home, start_new_session=True,
            )
        self.procs[name] = proc

        def is_ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")
            return ready in log.read_text(errors="replace").split("--- start")[-1]

        wait_for(is_ready, 60, f"{name} to be ready", interval=0.1)

    def services(self) -> None:
        """The example's remote services: payment and warehouse."""
        for name, port in self.ports.items():
            self.start(name, [SAS, f"{name}-service", "--port", str(port),
                              "--ledger", str(self.home / f"{name}-ledger.db")], f"{name} service listening")

    def worker(self, name: str, queues: str, concurrency: int = 2, env: dict[str, str] | None = None,
               pool: str = "prefork") -> None:
        self.start(name, [SAS, "worker", "-Q", queues, "-c", str(concurrency), "-P", pool, "-n", f"{name}@%h"],
                   "ready.", env)

    def scheduler(self, env: dict[str, str] | None = None) -> None:
        self.worker("scheduler", "sas.scheduler,sas.supervisor", env=env)

    def agents(self, name: str = "agents", concurrency: int = 2, env: dict[str, str] | None = None,
               pool: str = "prefork") -> None:
        self.worker(name, "sas.agent.payment,sas.agent.warehouse,sas.agent.orders", concurrency, env, pool)

    def beat(self, name: str = "beat") -> None:
        self.start(name, [SAS, "beat", "--schedule", str(self.home / f"{name}-schedule")], "beat: Starting")

    def up(self) -> None:
        self.services()
        self.scheduler()
        self.agents()
        self.beat()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name in list(self.procs):
            proc = self.procs.pop(name)
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def tail(self, name: str, lines: int = 40) -> str:
        return "\n".join(self.logs[name].read_text(errors="replace").splitlines()[-lines:])

    # -- the remote services' view -------------------------------------------------------------

    def _get(self, service: str, path: str) -> Any:
        return httpx.get(f"http://127.0.0.1:{self.ports[service]}{path}", timeout=5).json()

    def ledger(self, service: str = "payment") -> list[dict[str, Any]]:
        return self._get(service, "/ledger")  # type: ignore[no-any-return]

    def refused(self, service: str = "payment") -> dict[str, int]:
        return self._get(service, "/refused")  # type: ignore[no-any-return]

    def requests_seen(self, service: str = "payment") -> dict[str, int]:
        return self._get(service, "/requests")  # type: ignore[no-any-return]
