"""The Supervisor: a Celery beat task (``sas.supervisor.sweep`` on ``sas.supervisor``).

It only decides and asks; the Scheduler and the agents do the work. Each sweep, in one transaction:

* every step still ``running`` past its complete-by counts one failure; under the step's threshold
  it goes back to ``pending`` with a back-off and a new complete-by, and the Scheduler is asked to
  retry it; at the threshold the step fails, the run goes to ``error`` and one alert is raised;
* every run or step left ``pending`` past its complete-by (the Scheduler's message was lost) gets a
  new complete-by and the Scheduler is asked again.

Expired rows are read with ``FOR UPDATE SKIP LOCKED``, so Supervisors running at once take
disjoint rows, and each transition is fenced on the step's attempt, so none is recovered twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import faults
from .agent import SCHEDULER_QUEUE
from .alerts import Alert, Alerts
from .notify import relay
from .scheduler import fail_run
from .settings import Settings, instance_id
from .store import EXPIRED, Store

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("sas.supervisor")

SUPERVISOR_QUEUE = "sas.supervisor"
#: At most this many batches per sweep, so one sweep never runs unbounded; the next takes the rest.
MAX_BATCHES = 20


@dataclass
class SweepReport:
    retried: list[tuple[str, int, float]] = field(default_factory=list)  # (run, position, backoff)
    failed: list[Alert] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    relayed: int = 0


class Supervisor:
    @property
    def instance_id(self) -> str:
        return instance_id()

    def __init__(
        self, store: Store, celery: Celery, settings: Settings, alerts: Alerts
    ) -> None:
        self.store = store
        self.celery = celery
        self.settings = settings
        self.alerts = alerts

        @celery.task(name="sas.supervisor.sweep", ignore_result=True, shared=False)
        def sweep() -> dict[str, int]:
            report = self.sweep()
            return {"retried": len(report.retried), "failed": len(report.failed),
                    "requeued": len(report.requeued)}

    def backoff(self, failure_count: int) -> float:
        """Seconds to wait before retry number ``failure_count``: doubling, capped."""
        s = self.settings
        return float(min(s.retry_backoff * 2 ** (failure_count - 1), s.retry_backoff_max))

    def sweep(self) -> SweepReport:
        report = SweepReport()
        for _ in range(MAX_BATCHES):
            if self._sweep_batch(report) < self.settings.sweep_batch:
                break
        # Notifications whose relayer died after its commit: sent now, under their own ids.
        stranded = self.store.unsent(older_than=self.settings.pickup_timeout, limit=self.settings.sweep_batch)
        relay(self.celery, self.store, stranded)
        report.relayed = len(stranded)
        return report

    def _sweep_batch(self, report: SweepReport) -> int:
        s = self.settings
        retried: list[tuple[str, int, float]] = []
        failed: list[Alert] = []
        with self.store.begin() as tx:
            expired = tx.expired_steps(s.sweep_batch)
            for step in expired:
                failures = step.failure_count + 1
                if failures < step.max_failures:
                    backoff = self.backoff(failures)
                    if tx.retry_step(step, backoff, s.pickup_timeout, self.instance_id):
                        retried.append((step.run_id, step.position, backoff))
                    continue
                reason = (
                    f"step {step.name!r} passed its complete-by {failures} times "
                    f"(threshold {step.max_failures})"
                )
                failed_step = tx.fail_step(step.run_id, step.position, step.attempt, EXPIRED,
                                           actor=self.instance_id, count_failure=True)
                run = tx.lock_run(step.run_id)
                if failed_step is not None and run is not None:
                    failed.append(fail_run(tx, self.alerts, self.settings, run, failed_step, reason,
                                           actor=self.instance_id))
            requeued = tx.requeue_stalled(s.pickup_timeout, s.sweep_batch, self.instance_id)
        faults.hit("supervisor.after_commit")
        relay(self.celery, self.store, tx.outbox)
        for run_id, position, backoff in retried:
            log.warning("run %s step %s passed complete-by; retry in %.1fs", run_id, position, backoff)
            self._ask_scheduler(run_id, backoff)
        for run_id in requeued:
            log.warning("run %s waited past complete-by for the Scheduler; asking again", run_id)
            self._ask_scheduler(run_id, 0.0)
        for alert in failed:
            self.alerts.emit(alert)
            self._ask_scheduler(alert.run_id, 0.0)  # to undo it, if it is being compensated
        report.retried += retried
        report.failed += failed
        report.requeued += requeued
        return len(expired)

    def _ask_scheduler(self, run_id: str, delay: float) -> None:
        try:
            self.celery.send_task(
                "sas.scheduler.advance", args=[run_id], queue=SCHEDULER_QUEUE,
                countdown=delay or None,
            )
        except Exception:
            # The state is committed: the step is pending with a complete-by, so the next sweep
            # asks again.
            log.exception("could not ask the Scheduler about run %s; next sweep retries", run_id)
