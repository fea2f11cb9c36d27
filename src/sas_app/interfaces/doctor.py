"""``sas doctor``: what the chaos run checks after every fault, as a command an operator, a cron job
or a probe runs against a live deployment.

Each check counts what is wrong (0: healthy), names one example and says what to do:

* ``database``, ``schema``, ``broker`` — the state store and the broker answer; the schema is
  this sas_app's;
* ``supervisor`` — a Supervisor swept within the last ``late`` seconds (beat sends the sweeps);
* ``workers`` — a worker consumes the Scheduler's, the Supervisor's and each agent's queue;
* ``clocks`` — no worker's clock is further than SAS_CLOCK_SKEW from the database's;
* ``stranded_runs`` — no live run has nothing due (nothing would ever move it on: a bug to
  report; ``sas doctor --repair`` hands such runs to the Supervisor);
* ``overdue`` — nothing is more than ``late`` seconds past its due time (complete-by, deadline);
* ``unsent_notifications`` — no notification waits unrelayed for more than ``late`` seconds;
* ``attempts_ended_twice`` — no step attempt left ``running`` twice in the last ``since`` seconds.

The same counts are Prometheus gauges (``sas_doctor_problems{check}``, served by ``sas dashboard``).
Workers answer the remote control command ``sas_clock`` (registered here) with their clock and
queues.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from math import ceil
from typing import TYPE_CHECKING, Any

from celery.worker.control import inspect_command
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import NullPool

from sas_app.errors import one_line
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUPERVISOR_QUEUE
from sas_app.settings import Settings, redact_url
from sas_app.store import Store
from sas_app.store.connection import connection_limits
from sas_app.store.migrate import schema_problem

if TYPE_CHECKING:
    from celery import Celery

#: the checks, in the order they are made and shown
CHECKS = ("database", "schema", "broker", "supervisor", "workers", "clocks", "stranded_runs", "overdue",
          "unsent_notifications", "attempts_ended_twice")


@inspect_command()
def sas_clock(state: Any) -> dict[str, Any]:
    """This worker's wall clock and the queues it consumes (``sas doctor`` compares the clock with
    the database's)."""
    return {"time": time.time(), "queues": sorted(q.name for q in state.consumer.task_consumer.queues)}


@dataclass(frozen=True)
class Check:
    """One check's finding: how many problems (None: it could not be made, ``detail`` says why),
    an example (a run id, a worker, a queue) and what to do."""

    name: str
    count: int | None
    example: str | None = None
    detail: str = ""
    advice: str = ""

    @property
    def ok(self) -> bool:
        return self.count == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class Answers:
    """The workers' answers to ``sas_clock``, when they were asked and when the answers were in
    (this host's clock), and this host's clock's offset from the database's."""

    replies: list[dict[str, Any]]
    asked: float
    answered: float
    offset: float


class Doctor:
    def __init__(self, store: Store, celery: Celery, settings: Settings, agent_queues: Callable[[], list[str]]) -> None:
        self.store = store
        self.celery = celery
        self.settings = settings
        self.agent_queues = agent_queues

    def examine(self, *, late: float | None = None, since: float = 86400.0, timeout: float = 2.0) -> list[Check]:
        """Every check (:data:`CHECKS`). ``late``: how far past its due time something may be before
        it counts (default: a pick-up time and ten sweep intervals); ``since``: how much of the
        history the attempts are read from; ``timeout``: how long the broker and workers may take."""
        s = self.settings
        late = s.pickup_timeout + 10 * s.supervisor_interval if late is None else late
        found = {"database": self._database()}
        up = found["database"].ok
        found["broker"], answers = self._broker(timeout, up)
        store_checks: dict[str, Callable[[], Check]] = {
            "schema": self._schema, "supervisor": lambda: self._supervisor(late), "stranded_runs": self._stranded,
            "overdue": lambda: self._overdue(late), "unsent_notifications": lambda: self._unsent(late),
            "attempts_ended_twice": lambda: self._twice(since)}
        broker_checks: dict[str, Callable[[], Check]] = {
            "workers": lambda: self._workers(answers), "clocks": lambda: self._clocks(answers)}
        for name, check in store_checks.items():
            found[name] = check() if up else Check(name, None, detail="not checked: the database does not answer")
        for name, check in broker_checks.items():
            found[name] = check() if found["broker"].ok else Check(name, None,
                                                                   detail="not checked: the broker does not answer")
        if not up:  # a worker's clock is judged against the database's
            found["clocks"] = Check("clocks", None, detail="not checked: the database does not answer")
        return [found[name] for name in CHECKS]

    def probe(self, worker: str | None = None, *, alive: bool = False, timeout: float = 5.0) -> Check:
        """One process's health, for a Kubernetes probe (``sas health``): the database answers and
        its schema is this sas_app's, the broker answers, and ``worker`` (a node name) answers and
        consumes a queue. The first problem found, or a check with count 0 saying what holds.

        ``alive`` (a liveness probe) asks only whether ``worker`` answers: a worker whose broker is
        down cannot be asked, and is not called dead for it (restarting it would not bring the
        broker back); the database is not its concern."""
        if not alive:
            engine = self._bounded(timeout)
            try:
                for check in (self._database, self._schema):
                    found = check(engine)
                    if not found.ok:
                        return found
            finally:
                if engine is not self.store.engine:
                    engine.dispose()
        where = redact_url(self.settings.broker_url)
        # Every wait on the broker bounded by ``timeout``: connecting, and each answer on Redis (a
        # broker that accepts connections and never answers would outlast the probe's own time-out).
        bounded = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
        try:
            conn = self.celery.connection_for_write(transport_options=bounded, connect_timeout=timeout)
        except Exception as exc:  # a URL the transport cannot even make a connection of
            return Check("broker", 1, where, one_line(exc), "check SAS_BROKER_URL")
        with conn:
            try:
                conn.ensure_connection(max_retries=1, timeout=timeout)
            except Exception as exc:
                if alive:
                    return Check("broker", 0, detail=f"the broker does not answer ({one_line(exc)}): not judged")
                return Check("broker", 1, where, one_line(exc), "start the broker, or point SAS_BROKER_URL at it")
            if worker is None:
                return Check("health", 0, detail="database, schema and broker answer")
            try:
                replies = self.celery.control.broadcast("sas_clock", destination=[worker], reply=True,
                                                        timeout=timeout, connection=conn)
            except Exception as exc:
                if alive:
                    return Check("broker", 0, detail=f"the broker does not answer ({one_line(exc)}): not judged")
                return Check("worker", 1, worker, f"could not ask it: {one_line(exc)}", "check the broker")
        queues = sorted({q for reply in replies or [] for answer in reply.values() for q in answer.get("queues", [])})
        if not replies:
            return Check("worker", 1, worker, f"did not answer within {timeout:g} s",
                         "look at its log; a worker that stays silent is restarted by its liveness probe")
        if not queues:
            return Check("worker", 1, worker, "consumes no queue", "check its -Q and the broker")
        return Check("health", 0, worker, f"{worker} consumes {', '.join(queues)}"
                     + ("" if alive else "; database, schema and broker answer"))

    def repair(self, by: str) -> list[str]:
        """Hand every live run with nothing due to the Supervisor (its next sweep asks the
        Scheduler about it); their ids."""
        with self.store.begin() as tx:
            return tx.operations.hand_over_stranded(by)

    # -- the checks ---------------------------------------------------------------------------

    def _bounded(self, timeout: float) -> Engine:
        """The store's database for a probe: through a libpq driver, connections with the store's
        own limits (:func:`~sas_app.store.connection.connection_limits`) but giving up connecting
        after ``timeout`` (whole seconds, at least 2), so that a database that never answers is
        reported instead of outlasting the kubelet's own timeout; the store's own engine elsewhere."""
        engine = self.store.engine
        limits = connection_limits(engine.url, connect_timeout=max(2, ceil(timeout)))
        return create_engine(engine.url, poolclass=NullPool, connect_args=limits) if limits else engine

    def _database(self, engine: Engine | None = None) -> Check:
        try:
            if engine is None:
                self.store.now()
            else:
                with engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
        except Exception as exc:
            return Check("database", 1, redact_url(self.settings.database_url), one_line(exc),
                         "start the state store, or point SAS_DATABASE_URL at it")
        return Check("database", 0, detail=redact_url(self.settings.database_url))

    def _schema(self, engine: Engine | None = None) -> Check:
        problem = schema_problem(engine or self.store.engine)
        return Check("schema", 1 if problem else 0, detail=problem or "current",
                     advice="run `sas migrate`" if problem else "")

    def _broker(self, timeout: float, database_up: bool) -> tuple[Check, Answers]:
        """The broker, and the workers' answers to ``sas_clock``."""
        where = redact_url(self.settings.broker_url)
        try:
            with self.celery.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, timeout=timeout)
            offset = self.store.now() - time.time() if database_up else 0.0
            asked = time.time()
            replies = self.celery.control.broadcast("sas_clock", reply=True, timeout=min(timeout, 1.0))
            answered = time.time()
        except Exception as exc:
            return (Check("broker", 1, where, one_line(exc), "start the broker, or point SAS_BROKER_URL at it"),
                    Answers([], 0.0, 0.0, 0.0))
        return Check("broker", 0, detail=where), Answers(replies or [], asked, answered, offset)

    def _workers(self, answers: Answers) -> Check:
        replies = answers.replies
        consumed = {q for reply in replies for answer in reply.values() for q in answer.get("queues", [])}
        wanted = [SCHEDULER_QUEUE, SUPERVISOR_QUEUE, *self.agent_queues()]
        missing = [q for q in wanted if q not in consumed]
        return Check("workers", len(missing), missing[0] if missing else None,
                     f"{len(replies)} worker(s) answered; queues without a consumer: {', '.join(missing) or 'none'}",
                     "start a worker on each queue named (`sas worker -Q ...`)" if missing else "")

    def _clocks(self, answers: Answers) -> Check:
        """A worker's clock was read between ``asked`` and ``answered`` (moved onto the database's
        clock): it is off by at least its distance from that interval."""
        skew = self.settings.clock_skew
        earliest, latest = answers.asked + answers.offset, answers.answered + answers.offset
        off = {}
        for reply in answers.replies:
            for worker, answer in reply.items():
                then = float(answer.get("time", 0.0))
                apart = max(earliest - then, then - latest, 0.0)
                if apart > skew:
                    off[worker] = apart
        worst = max(off, key=off.__getitem__, default=None)
        detail = f"{len(off)} worker clock(s) off the database's by more than SAS_CLOCK_SKEW ({skew:g} s)"
        if worst is not None:
            detail += f"; {worst} by {off[worst]:.0f} s"
        return Check("clocks", len(off), worst, detail, "set the host's clock right (NTP)" if off else "")

    def _supervisor(self, late: float) -> Check:
        age = self.store.last_sweep_age()
        if age is not None and age <= late:
            return Check("supervisor", 0, detail=f"last sweep {age:.1f} s ago")
        return Check("supervisor", 1, detail="no Supervisor ever swept" if age is None else
                     f"no Supervisor swept for {age:.0f} s", advice="run `sas beat` and a worker on sas.supervisor")

    def _stranded(self) -> Check:
        found = self.store.stranded_runs()
        return Check("stranded_runs", found.count, found.example, "live runs with nothing due in the store",
                     "`sas doctor --repair` hands them to the Supervisor; please report it as a bug"
                     if found.count else "")

    def _overdue(self, late: float) -> Check:
        found = self.store.overdue(late)
        return Check("overdue", found.count, found.example, f"due more than {late:g} s ago and not acted on",
                     "check that a worker consumes sas.supervisor and beat runs; a large backlog clears "
                     "over several sweeps (SAS_SWEEP_BATCH)" if found.count else "")

    def _unsent(self, late: float) -> Check:
        found = self.store.unsent_notifications(late)
        return Check("unsent_notifications", found.count, found.example, f"written more than {late:g} s ago",
                     "the Supervisor relays them: check the broker and the Supervisor" if found.count else "")

    def _twice(self, since: float) -> Check:
        found = self.store.attempts_ended_twice(since)
        return Check("attempts_ended_twice", found.count, found.example, f"in the last {since:g} s of the history",
                     "a fenced transition was not: please report it as a bug, with the run" if found.count else "")
