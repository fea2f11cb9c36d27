"""Scheduled starts: ``sas.schedule("nightly_settlement", cron="0 2 * * *", payload={...},
overlap="skip", catch_up=timedelta(hours=1))`` starts a run of a workflow at every tick of a cron
expression (five fields, or six with seconds last).

Celery beat sends ``sas.schedules.tick`` (on the Supervisor's queue) every
``SAS_SUPERVISOR_INTERVAL``. For each schedule, one transaction holds its row (its last tick
handled), finds the ticks since — those further back than ``catch_up`` are skipped, with a log
line — and starts one run per tick, whose business key is the schedule and the tick
(``nightly_settlement@2026-11-24T02:00:00Z``). Two beats, or a beat restarted mid-tick, handle a
tick once: the row is held, and the business key is unique besides. ``overlap`` says what a tick
does while a run the schedule started is still live: ``skip`` the tick, ``allow`` another run, or
``cancel_previous`` (cancel it, undoing what it did, then start). A run's payload is the
schedule's, plus ``scheduled_for`` (the tick, ISO 8601 UTC).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal

from croniter import croniter  # type: ignore[import-untyped]

from sas_app.definitions.workflow import Workflow, is_name, workflow_name
from sas_app.engine.recovery import cancel_run
from sas_app.errors import SasError, WorkflowDefinitionError
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import SUPERVISOR_QUEUE, TICK, Advance, Router, confirm_options
from sas_app.settings import Settings, instance_id
from sas_app.states import RunState, Word
from sas_app.store import Store, Tx, stored_object

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

class Overlap(Word):
    """What a tick does while its schedule's previous run is live."""

    SKIP = "skip"  # start nothing this tick
    ALLOW = "allow"  # start another run beside it
    CANCEL_PREVIOUS = "cancel_previous"  # cancel the live run, then start this tick's


OVERLAP = tuple(o.value for o in Overlap)
#: most ticks one schedule starts in one beat tick (a catch-up of many goes on at the next)
MAX_TICKS = 100


def tick_key(schedule: str, tick: float) -> str:
    """The business key of a schedule's run for ``tick``: the same whichever beat sends it."""
    return f"{schedule}@{datetime.fromtimestamp(tick, tz=timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True)
class Schedule:
    name: str
    workflow: str
    cron: str
    payload: dict[str, Any]
    overlap: str
    catch_up: float

    def ticks(self, after: float, until: float, limit: int = MAX_TICKS) -> list[float]:
        """The ticks strictly after ``after`` and at most ``until`` (epoch seconds), at most ``limit``."""
        found: list[float] = []
        cron = croniter(self.cron, after)
        while len(found) < limit:
            tick = float(cron.get_next(float))
            if tick > until:
                break
            found.append(tick)
        return found

    def next_tick(self, now: float) -> float:
        return float(croniter(self.cron, now).get_next(float))


class Schedules:
    def __init__(self, store: Store, settings: Settings, router: Router, workflows: Mapping[str, Workflow],
                 celery: Celery) -> None:
        self.store = store
        self.settings = settings
        self.router = router
        self.workflows = workflows
        self.celery = celery
        self.schedules: dict[str, Schedule] = {}

        @celery.task(name=TICK, shared=False, ignore_result=True)
        def tick() -> int:
            return len(self.tick())

    def add(self, name: str, *, cron: str, payload: Any = None, workflow: Workflow | str | None = None,
            overlap: Overlap | Literal["skip", "allow", "cancel_previous"] = Overlap.SKIP,
            catch_up: float | timedelta = timedelta(hours=1)) -> Schedule:
        """Declare a schedule (see the module's docstring); ``workflow`` defaults to ``name``.
        :class:`WorkflowDefinitionError` names the first mistake."""
        where = f"schedule {name!r}"
        if not is_name(name):
            raise WorkflowDefinitionError(f"schedule name {name!r} must be a name (letters, digits, '_', '-')")
        if name in self.schedules:
            raise WorkflowDefinitionError(f"a schedule named {name!r} is already declared")
        wanted = workflow_name(workflow or name)
        target = self.workflows.get(wanted)
        if target is None:
            raise WorkflowDefinitionError(f"{where}: workflow {wanted!r} is not registered; register it "
                                          f"first (registered: {sorted(self.workflows) or 'none'})")
        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise WorkflowDefinitionError(f"{where}: cron {cron!r} does not parse: five fields (minute hour day "
                                          "month weekday), or six with seconds last, e.g. '0 2 * * *'")
        if overlap not in OVERLAP:
            raise WorkflowDefinitionError(f"{where}: overlap must be one of {', '.join(OVERLAP)}, got {overlap!r}")
        window = catch_up.total_seconds() if isinstance(catch_up, timedelta) else catch_up
        longest = self.settings.max_sleep
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 <= window <= longest:
            raise WorkflowDefinitionError(f"{where}: catch_up must be from 0 to {self.settings.max_sleep:g} seconds "
                                          f"(SAS_MAX_SLEEP), got {catch_up!r}")
        try:
            body = stored_object({} if payload is None else payload, self.settings.max_payload_bytes,
                                 f"{where}: the payload")
        except ValueError as exc:
            raise WorkflowDefinitionError(str(exc)) from None
        try:  # a tick's payload is this one and the time it is for: checked as each tick's will be
            example = {**body, "scheduled_for": tick_key(name, time.time()).split("@", 1)[1]}
            target.slot_of(target.stored_input(example))
        except ValueError as exc:
            raise WorkflowDefinitionError(f"{where}: {exc}") from None
        schedule = Schedule(name, target.name, cron, body, str(overlap), float(window))
        self.schedules[name] = schedule
        interval = self.settings.supervisor_interval
        self.celery.conf.beat_schedule[TICK] = {
            "task": TICK, "schedule": timedelta(seconds=interval),
            "options": {"queue": SUPERVISOR_QUEUE, "expires": max(interval, 1.0), **confirm_options(self.celery)},
        }
        return schedule

    def tick(self) -> list[str]:
        """Start the runs of every schedule's ticks due since its last; the ids of those started."""
        return [run_id for schedule in self.schedules.values() for run_id in self._tick(schedule)]

    def _tick(self, schedule: Schedule) -> list[str]:
        started: list[str] = []
        with self.store.begin() as tx:
            last = tx.schedules.lock_schedule(schedule.name)
            now = tx.now()
            # a tick handled within SAS_PICKUP_TIMEOUT of its time is late, not missed, whatever catch_up says
            window = now - max(schedule.catch_up, self.settings.pickup_timeout)
            if last < window:  # beat was down longer than the catch-up window
                missed = len(schedule.ticks(last, window, limit=10_000))
                if missed:
                    log.warning("schedule %s: %s tick(s) before %s skipped: older than its catch-up window (%g s)",
                                schedule.name, missed, tick_key(schedule.name, window), schedule.catch_up)
                tx.schedules.set_last_tick(schedule.name, window)
                last = window
            ticks = schedule.ticks(last, now)
            for tick in ticks:
                run_id = self._start(tx, schedule, tick)
                if run_id is not None:
                    started.append(run_id)
            if ticks:
                tx.schedules.set_last_tick(schedule.name, ticks[-1])
        self.router.after_commit(tx.outbox, *(Advance(run_id, Publish.SCHEDULED) for run_id in started), *tx.follow_ups)
        return started

    def _start(self, tx: Tx, schedule: Schedule, tick: float) -> str | None:
        """The run for ``tick`` (its id), unless the overlap policy skips it or it exists already."""
        live = tx.schedules.live_runs_of(schedule.name)
        key = tick_key(schedule.name, tick)
        workflow = self.workflows[schedule.workflow]
        run_id = uuid.uuid4().hex
        try:  # before the overlap policy: a tick that cannot start cancels nothing
            payload = workflow.stored_input({**schedule.payload, "scheduled_for": key.split("@", 1)[1]})
            new = workflow.new_run(run_id, key, payload, schedule=schedule.name)
        except ValueError as exc:  # its workflow's input model or key changed since the schedule was declared
            log.warning("schedule %s: tick %s not started: %s", schedule.name, key, exc)
            return None
        if live and schedule.overlap == "skip":
            log.info("schedule %s: tick %s skipped, run %s is still %s", schedule.name, key, live[0].id,
                     live[0].process_state)
            return None
        if schedule.overlap == "cancel_previous":
            for run in live:
                locked = tx.runs.lock_run(run.id)
                if locked is not None and locked.process_state in (RunState.PENDING, RunState.PROCESSING):
                    state = cancel_run(tx, locked, f"cancelled by schedule {schedule.name}: tick {key}",
                                       self.settings, by=f"schedule:{schedule.name}")
                    if state == RunState.COMPENSATING:
                        tx.follow_ups.append(Advance(run.id, Publish.CANCELLED))
        if workflow.on_submit is None:
            run, created = tx.submission.insert_run(new, self.settings.pickup_timeout)
        else:
            # the workflow's on_submit writes its rows with the run, as for a submit; a run it
            # refuses is not started, and the tick is handled all the same (not asked again)
            try:
                with tx.savepoint():
                    run, created = tx.submission.insert_run(new, self.settings.pickup_timeout)
                    if created:
                        workflow.on_submit(tx.conn, run)
            except SasError as exc:
                log.warning("schedule %s: tick %s not started: %s", schedule.name, key, exc)
                return None
        if created:
            log.info("schedule %s: tick %s started run %s (%s)", schedule.name, key, run.id, instance_id())
        return run.id if created else None
