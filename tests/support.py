"""Helpers shared by the unit and integration tests: bounded waits, an in-process message pump and
the processes a harness left running, and the objects a kustomization lists."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

from sas_app import SasApp
from sas_app.testing.clock import VirtualClock
from sas_app.testing.processes import wait_until
from sas_app.testing.pump import Pump

T = TypeVar("T")


@contextmanager
def statements_run(engine: Engine) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends inside the ``with`` block, in order."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


class FakeClock(VirtualClock):
    """The state store's clock in unit tests (SQLite, injected through ``SasApp(clock=...)``): the
    kit's virtual clock — it stands still until a test moves it, so an expiry is a step forward,
    never a wait, and agents' in-process retries wait on it — which these tests may also set to
    any moment (``clock.now = …``)."""

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, moment: float) -> None:
        self._now = float(moment)


def pass_time(sas: SasApp, moment: float, what: str) -> None:
    """Make the store's clock read later than ``moment``: at once on the test's clock (the
    ``sas`` fixture's); on an app with the database's own clock by waiting for it, bounded."""
    clock = getattr(sas, "test_clock", None)
    if clock is not None:
        clock.move_past(moment)
    else:
        wait_for(lambda: sas.store.now() > moment, 5, what)


def look(sas: SasApp) -> list[Any]:
    """One at-risk look, as the lookout takes them: an interval after the last (a look sooner than half
    one after the last taken is skipped); the alerts it raised."""
    pass_time(sas, sas.store.now() + sas.settings.at_risk_interval, "an at-risk interval")
    return sas.supervisor.forecast.look()


def expire(sas: SasApp, run_id: str) -> None:
    """Every live step of the run past its complete-by on the store's clock."""
    live = [s.complete_by for s in sas.store.get_steps(run_id) if s.state in ("running", "pending")]
    pass_time(sas, max(filter(None, live), default=0.0), "complete-by to pass")


def backoff_over(sas: SasApp, run_id: str) -> None:
    """Every back-off of the run's steps over on the store's clock."""
    pass_time(sas, max((s.not_before or 0.0 for s in sas.store.get_steps(run_id)), default=0.0),
              "the back-off to end")


def sweep_after_expiry(sas: SasApp, pump: Pump, run_id: str, times: int = 1) -> None:
    """``times`` rounds of: run every message, let the live steps expire, sweep, let the back-off end."""
    for _ in range(times):
        pump.run()
        expire(sas, run_id)
        sas.supervisor.sweep()
        backoff_over(sas, run_id)
    pump.run()


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy and return it; fail naming ``what``
    after ``timeout``. An exception it raises fails the test at once (the harness's wait, strict)."""
    try:
        return wait_until(predicate, timeout, what, interval, not_yet=())
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def live_processes_with(marker: str) -> list[int]:
    """Live processes (zombies aside) whose environment or command line holds ``marker`` (an
    ``ENV=value`` or a path): the processes a harness started with it, and their children."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            seen = (proc / "environ").read_bytes() + b"\0" + (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in seen and state != "Z":
            pids.append(int(proc.name))
    return pids


def kustomized(folder: Path) -> list[dict[str, Any]]:
    """Every object a kustomization lists, read as kustomize would: ours use ``resources`` only
    (asserted), so that reading them here is what ``kubectl apply -k`` applies."""
    [kustomization] = yaml.safe_load_all((folder / "kustomization.yaml").read_text())
    assert set(kustomization) == {"apiVersion", "kind", "resources"}, f"{folder}: resources only"
    found: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        path = folder / resource
        found += kustomized(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    return found


def through_psycopg_3(url: str) -> str:
    """``url``, a PostgreSQL database, reached through psycopg 3."""
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
