"""Real processes for integration tests, through the project's process harness
(:class:`sas_app.testing.processes.Processes`): the payment and warehouse services, Celery workers and
beat, each in its own process group so a test can SIGKILL one (and its pool children) and start
it again. Workers and beat are ready when Celery says so (their ready file), services when they answer."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx

from sas_app.testing.processes import CELERY_READY, Processes, Ready, free_port

REPO = Path(__file__).resolve().parents[2]
#: what a process started from this checkout imports: its sas_app (src/), and its examples, tests
#: and benches
CHECKOUT_PATH = os.pathsep.join([str(REPO / "src"), str(REPO)])
SAS = str(Path(sys.executable).parent / "sas")
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")

__all__ = ["CELERY_READY", "CHECKOUT_PATH", "REPO", "SAS", "Ready", "Stack", "clock_off_by", "free_port"]


def clock_off_by(seconds: int) -> dict[str, str]:
    """The environment that makes a process's wall clock ``seconds`` off (Debian's libfaketime;
    scripts/test installs it)."""
    assert FAKETIME_LIB.exists(), f"{FAKETIME_LIB} is missing: apt-get install libfaketime (scripts/test does)"
    return {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": f"{seconds:+d}s"}


class Stack(Processes):
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        path = os.pathsep.join(filter(None, [CHECKOUT_PATH, os.environ.get("PYTHONPATH")]))
        super().__init__(home, {"PYTHONPATH": path, **env})
        self.ports = {name: int(self.env[f"{name.upper()}_SERVICE_URL"].rsplit(":", 1)[1])
                      for name in ("payment", "warehouse")}

    def services(self, wait: bool = True) -> None:
        """The example's remote services: payment and warehouse (as ``sas payment-service`` runs
        them, without loading the app first: harness/service.py)."""
        for name, port in self.ports.items():
            self.start(name, [sys.executable, "-m", "harness.service", "--name", name, "--port", str(port),
                              "--ledger", str(self.home / f"{name}-ledger.db")],
                       ready=Ready(url=f"http://127.0.0.1:{port}/health"), wait=False)
        if wait:
            self.wait_ready(*self.ports)

    def scheduler(self, env: dict[str, str] | None = None, wait: bool = True, name: str = "scheduler") -> None:
        self.worker(name, "sas.scheduler,sas.supervisor", env=env, wait=wait)

    def agents(self, name: str = "agents", concurrency: int = 2, env: dict[str, str] | None = None,
               pool: str = "prefork", wait: bool = True) -> None:
        self.worker(name, "sas.agent.payment,sas.agent.fraud,sas.agent.warehouse,sas.agent.orders", concurrency,
                    pool=pool, env=env, wait=wait)

    def up(self) -> None:
        """Every process of the example, started together."""
        self.services(wait=False)
        self.scheduler(wait=False)
        self.agents(wait=False)
        self.beat(wait=False)
        self.wait_ready()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """``sig`` (SIGKILL) to the process group; the process is forgotten (start it again by name)."""
        super().kill(name, sig)
        self.procs.pop(name)

    def stop_all(self, grace: float = 0.0) -> None:
        """After a test nothing of the stack is needed: kill every process group at once."""
        super().stop_all(grace)

    # -- the remote services' view -------------------------------------------------------------

    def _get(self, service: str, path: str) -> Any:
        return httpx.get(f"http://127.0.0.1:{self.ports[service]}{path}", timeout=5).json()

    def ledger(self, service: str = "payment") -> list[dict[str, Any]]:
        return self._get(service, "/ledger")  # type: ignore[no-any-return]

    def refused(self, service: str = "payment") -> dict[str, int]:
        return self._get(service, "/refused")  # type: ignore[no-any-return]

    def requests_seen(self, service: str = "payment") -> dict[str, int]:
        return self._get(service, "/requests")  # type: ignore[no-any-return]

    def set_faults(self, service: str, rates: dict[str, float]) -> None:
        """The service's process-wide fault rates (``{"down": 1}``: every request refused, 503)."""
        httpx.post(f"http://127.0.0.1:{self.ports[service]}/faults", json=rates, timeout=5).raise_for_status()
