"""Helpers shared by the unit and integration tests: bounded waits, an in-process message pump and
the processes a harness left running."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any, TypeVar

from sqlalchemy import Engine, event

from sas_app import SasApp
from sas_app.processes import wait_until

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


class FakeClock:
    """The state store's clock in unit tests (SQLite, injected through ``SasApp(clock=...)``): it
    stands still until a test moves it, so an expiry is a step forward, never a wait."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def move_past(self, moment: float) -> None:
        self.now = max(self.now, moment + 0.001)


def pass_time(sas: SasApp, moment: float, what: str) -> None:
    """Make the store's clock read later than ``moment``: at once on an injected clock; on a
    server database (whose clock is its own) by waiting for it, bounded."""
    clock = getattr(sas, "test_clock", None)
    if clock is not None:
        clock.move_past(moment)
    else:
        wait_for(lambda: sas.store.now() > moment, 5, what)


def look(sas: SasApp) -> list[Any]:
    """One at-risk look, as the lookout takes them: an interval after the last (a look sooner than half
    one after the last taken is skipped); the alerts it raised."""
    pass_time(sas, sas.store.now() + sas.settings.at_risk_interval, "an at-risk interval")
    return sas.supervisor.watch()


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


@dataclass(frozen=True)
class Message:
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    headers: dict[str, Any]
    #: the broker's priority it was published with (None: none)
    priority: int | None = None


class Pump:
    """Reads the app's queues on a real kombu broker (``memory://`` in unit tests) and runs each
    message's task body in this process: the real handlers, the real serialisation, no workers."""

    def __init__(self, sas: SasApp) -> None:
        self.sas = sas

    def queues(self) -> list[str]:
        return self.sas.queues()

    def take(self, queue: str) -> list[Message]:
        """Remove and return every message waiting on ``queue`` without running it."""
        taken: list[Message] = []
        with self.sas.celery.connection_for_read() as conn:
            simple = conn.SimpleQueue(queue, no_ack=True, accept=["json"])
            try:
                while True:
                    try:
                        raw = simple.get(block=False)
                    except Empty:
                        break
                    args, kwargs, _ = raw.decode()
                    taken.append(Message(raw.headers["task"], list(args), dict(kwargs), dict(raw.headers),
                                         raw.properties.get("priority")))
            finally:
                simple.close()
        return taken

    def purge(self) -> None:
        for queue in self.queues():
            self.take(queue)

    def execute(self, message: Message) -> None:
        self.sas.celery.tasks[message.task].run(*message.args, **message.kwargs)

    def run(self, queues: Iterable[str] | None = None, limit: int = 1000) -> int:
        """Run messages until the given queues (default: all) are empty; return how many ran."""
        chosen = list(queues or self.queues())
        ran = 0
        while ran < limit:
            batch = [m for q in chosen for m in self.take(q)]
            if not batch:
                return ran
            for message in batch:
                self.execute(message)
                ran += 1
        raise AssertionError(f"still busy after {limit} messages: a message loop?")


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
