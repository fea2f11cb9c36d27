"""Real processes for integration tests: the payment and warehouse services, Celery workers and
beat, each in its own process group so a test can SIGKILL one (and its pool children) and start
it again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support import wait_for

REPO = Path(__file__).resolve().parents[2]
SAS = str(Path(sys.executable).parent / "sas")


FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def clock_off_by(seconds: int) -> dict[str, str]:
    """The environment that makes a process's wall clock ``seconds`` off (Debian's libfaketime;
    scripts/test installs it)."""
    assert FAKETIME_LIB.exists(), f"{FAKETIME_LIB} is missing: apt-get install libfaketime (scripts/test does)"
    return {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": f"{seconds:+d}s"}


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
        self.ready_marks: dict[str, str] = {}
        self.ports = {name: int(self.env[f"{name.upper()}_SERVICE_URL"].rsplit(":", 1)[1])
                      for name in ("payment", "warehouse")}

    def start(self, name: str, argv: list[str], ready: str, env: dict[str, str] | None = None,
              wait: bool = True) -> None:
        """Start a process; unless ``wait`` is False, return once its log shows ``ready``."""
        log = self.home / f"{name}.log"
        self.logs[name] = log
        with open(log, "ab") as out:
            out.write(f"--- start {' '.join(argv)}\n".encode())
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
                cwd=self.home, start_new_session=True,
            )
        self.procs[name] = proc
        self.ready_marks[name] = ready
        if wait:
            self.wait_ready(name)

    def wait_ready(self, *names: str) -> None:
        def is_ready(name: str) -> bool:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")
            return self.ready_marks[name] in self.logs[name].read_text(errors="replace").split("--- start")[-1]

        for name in names:
            wait_for(lambda name=name: is_ready(name), 60, f"{name} to be ready", interval=0.05)

    def services(self, wait: bool = True) -> None:
        """The example's remote services: payment and warehouse."""
        for name, port in self.ports.items():
            self.start(name, [SAS, f"{name}-service", "--port", str(port),
                              "--ledger", str(self.home / f"{name}-ledger.db")], f"{name} service listening",
                       wait=False)
        if wait:
            self.wait_ready(*self.ports)

    def worker(self, name: str, queues: str, concurrency: int = 2, env: dict[str, str] | None = None,
               pool: str = "prefork", wait: bool = True) -> None:
        self.start(name, [SAS, "worker", "-Q", queues, "-c", str(concurrency), "-P", pool, "-n", f"{name}@%h"],
                   "ready.", env, wait)

    def scheduler(self, env: dict[str, str] | None = None, wait: bool = True, name: str = "scheduler") -> None:
        self.worker(name, "sas.scheduler,sas.supervisor", env=env, wait=wait)

    def agents(self, name: str = "agents", concurrency: int = 2, env: dict[str, str] | None = None,
               pool: str = "prefork", wait: bool = True) -> None:
        self.worker(name, "sas.agent.payment,sas.agent.warehouse,sas.agent.orders", concurrency, env, pool, wait)

    def beat(self, name: str = "beat", wait: bool = True, env: dict[str, str] | None = None) -> None:
        self.start(name, [SAS, "beat", "--schedule", str(self.home / f"{name}-schedule")], "beat: Starting",
                   env=env, wait=wait)

    def up(self) -> None:
        """Every process of the example, started together."""
        self.services(wait=False)
        self.scheduler(wait=False)
        self.agents(wait=False)
        self.beat(wait=False)
        self.wait_ready(*self.procs)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(30)

    def stop_all(self) -> None:
        """After a test nothing of the stack is needed: kill every process group at once."""
        for name in list(self.procs):
            proc = self.procs.pop(name)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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
