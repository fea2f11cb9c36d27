"""The Supervisor: the sweep, a Celery beat task on ``sas.supervisor`` (``sas.supervisor.sweep``,
every SAS_SUPERVISOR_INTERVAL), and the at-risk forecast (:mod:`sas_app.supervision.forecast`),
looked at every SAS_AT_RISK_INTERVAL by each worker that consumes ``sas.supervisor``.

It only decides and asks; the Scheduler and the agents do the work. Each sweep, in one transaction:

* every step still ``running`` past its complete-by whose message still waits in its agent's queue
  (by the queue's depth: nobody has taken it) is left alone for up to SAS_QUEUE_WAIT_MAX, and the
  agent that takes it late starts it then: waiting in a queue spends no attempt;
* every other step still ``running`` past its complete-by counts one failure; under the step's threshold
  it goes back to ``pending`` with a back-off and a new complete-by, and the Scheduler is asked to retry
  it — or, when its agent's queue is backed up, the retry waits its turn in the store and a later sweep
  asks (:mod:`sas_app.supervision.forecast.pacing`); at the threshold the step fails with one alert and
  the run is undone — or goes to ``error`` when there is nothing to undo — while an undo goes on
  (:mod:`sas_app.engine.recovery` decides);
* every run past its workflow's deadline raises one alert and is undone (or goes to ``error``
  when there is nothing to undo);
* every run or step whose complete-by passed with no Scheduler acting on it — a run pending, a
  live run asked about (an operator's resume, a step marked done), a step whose back-off or wait
  is over: the Scheduler's message was lost — gets a new complete-by and the Scheduler is asked
  again. Every message sas_app sends has such a row behind it (:mod:`sas_app.messaging.publishes`).

Expired rows are read with ``FOR UPDATE SKIP LOCKED``, so Supervisors running at once take
disjoint rows, and each transition is fenced on the step's attempt, so none is recovered twice.
The agents' queue depths are read from the broker once a sweep, before any of its transactions
(:mod:`sas_app.supervision.queue_depths`): a slow broker never holds the rows a sweep has locked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from sas_app import fault_points
from sas_app.engine.alerts import Alert, Alerts
from sas_app.engine.recovery import past_deadline, recover_steps
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUPERVISOR_QUEUE, SWEEP, Router, agent_queue, asking
from sas_app.settings import Settings, instance_id
from sas_app.states import Cause
from sas_app.store import StepRow, Store, Tx
from sas_app.store.observe import FORGET_SUPERVISOR_AFTER
from sas_app.supervision.forecast import Forecast
from sas_app.supervision.queue_depths import QueueDepths, queued_steps

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

__all__ = ["SUPERVISOR_QUEUE", "Supervisor", "SweepReport"]
#: At most this many batches per sweep, so one sweep never runs unbounded; the next takes the rest.
MAX_BATCHES = 20
#: seconds past its complete-by during which an expired step is judged no sooner than the next look:
#: an agent that took its message just then is still claiming it
TAKE_GRACE = 2.0
#: seconds past its complete-by during which an expired step whose queue's depth cannot be read (the
#: broker just back from an outage, a read timing out) is judged no sooner than the next look
UNREAD_GRACE = 30.0


@dataclass
class SweepReport:
    retried: list[tuple[str, int, float]] = field(default_factory=list)  # (run, position, backoff)
    paced: list[tuple[str, int, float]] = field(default_factory=list)  # retries held for room in their queue
    failed: list[str] = field(default_factory=list)  # runs whose step failed for good
    requeued: list[str] = field(default_factory=list)
    #: messages waiting on the Scheduler's queue when the sweep began (runs stalled meanwhile are
    #: not asked about again: see Supervisor.sweep)
    scheduler_behind: int = 0
    relayed: int = 0
    #: steps past complete-by left alone: their messages still wait in their agent's queue
    queued: int = 0
    seconds: float = 0.0


def _listed(run_ids: list[str], most: int = 10) -> str:
    """Run ids for a log line: the first ``most``, then how many more."""
    more = f" and {len(run_ids) - most} more" if len(run_ids) > most else ""
    return ", ".join(run_ids[:most]) + more


class Supervisor:
    @property
    def instance_id(self) -> str:
        return instance_id()

    def __init__(self, store: Store, celery: Celery, settings: Settings, alerts: Alerts, router: Router,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.celery = celery
        self.settings = settings
        self.alerts = alerts
        self.router = router
        self.depths = QueueDepths(store, celery, settings)
        #: the at-risk looks and the pacing of retries; its lookout is started by SasApp when a
        #: worker that consumes sas.supervisor is ready
        self.forecast = Forecast(store, settings, alerts, self.depths, clock)

        @celery.task(name=SWEEP, ignore_result=True, shared=False)
        def sweep() -> dict[str, int]:
            report = self.sweep()
            return {"retried": len(report.retried), "paced": len(report.paced), "failed": len(report.failed),
                    "requeued": len(report.requeued), "scheduler_behind": report.scheduler_behind,
                    "queued": report.queued}

    def _busy_depths(self) -> dict[str, int | None]:
        """The busy agents' queue depths (None: it could not be read)."""
        return dict(self.depths.of_busy_agents().of)

    def sweep_once(self) -> SweepReport:
        """One batch of the sweep, timed (what bench/sweep.py measures)."""
        report = SweepReport()
        started = time.perf_counter()
        self._sweep_batch(report, self._busy_depths())
        report.seconds = time.perf_counter() - started
        return report

    def sweep(self) -> SweepReport:
        """Up to :data:`MAX_BATCHES` batches (see the module's note), then the stranded
        notifications.

        A run or step left pending past its complete-by is asked about again only while the
        Scheduler's queue is empty: with messages waiting there, the Scheduler is behind, not deaf,
        and its message for that run is most likely among them. Asking again then only deepens the
        queue — each ask a message more for the Scheduler, whose runs then stall in turn until
        nothing completes. A message that was lost is asked again once the queue has drained
        (the measurement: docs/explanation/measurements-behind-the-code.md)."""
        report = SweepReport()
        started = time.perf_counter()
        depths = self._busy_depths()
        report.scheduler_behind = self.depths.read(SCHEDULER_QUEUE) or 0
        for _ in range(MAX_BATCHES):
            if self._sweep_batch(report, depths) < self.settings.sweep_batch:
                break
        # Notifications whose relayer died after its commit: sent now, under their own ids.
        stranded = self.store.unsent(older_than=self.settings.pickup_timeout, limit=self.settings.sweep_batch)
        self.router.relay(stranded)
        report.relayed = len(stranded)
        try:
            self.store.record_sweep(self.instance_id, len(report.retried) + len(report.paced) + len(report.failed)
                                    + len(report.requeued), forget_after=FORGET_SUPERVISOR_AFTER)
        except SQLAlchemyError as exc:  # the heartbeat only informs; the sweep's work is done
            log.warning("could not record this sweep (is the schema up to date? `sas migrate`): %s",
                        str(exc).splitlines()[0])
        report.seconds = time.perf_counter() - started
        return report

    def _sweep_batch(self, report: SweepReport, depths: dict[str, int | None]) -> int:
        s = self.settings
        retried: list[tuple[str, int, float]] = []
        failed: list[str] = []
        raised: list[Alert | None] = []
        with self.store.begin() as tx:
            found = tx.sweep.expired_steps(s.sweep_batch)
            queued, just, outwaited = self._still_queued(tx, found, depths)
            tx.sweep.leave_queued(queued, max(s.supervisor_interval, min((q.timeout for q in queued), default=0.0)),
                                  self.instance_id)
            tx.sweep.leave_queued(just, TAKE_GRACE, self.instance_id, note=False)
            left = {step.id for step in [*queued, *just]}
            # outwaited: still in the queue, past SAS_QUEUE_WAIT_MAX
            taken = self._just_taken(tx, [step for step in found if step.id not in left | outwaited])
            tx.sweep.leave_queued(taken, TAKE_GRACE, self.instance_id,
                                  detail={"taken": "no longer in the queue; its agent may be claiming it"})
            left |= {step.id for step in taken}
            expired = [step for step in found if step.id not in left]
            # a depth that could not be read counts as empty: those steps keep their back-off alone
            paced = self.forecast.paced(tx, expired, {agent: depth or 0 for agent, depth in depths.items()})
            for step, outcome in recover_steps(tx, self.alerts, s, expired, Cause.EXPIRED, actor=self.instance_id,
                                               paced=paced, silent=self._silent(tx, expired, outwaited)):
                # a failure, an escalation (the sweep asks again once its wait is over), an undo
                # retried past its threshold
                raised.append(outcome.alert)
                if outcome.retried and outcome.paced:
                    report.paced.append((step.run_id, step.position, outcome.backoff))  # the sweep wakes it
                elif outcome.retried:
                    retried.append((step.run_id, step.position, outcome.backoff))
                elif outcome.failed:
                    failed.append(step.run_id)
            for run in tx.sweep.past_deadline(s.sweep_batch):
                raised.append(past_deadline(tx, self.alerts, s, run, actor=self.instance_id))
                failed.append(run.id)
            requeued: list[str] = []
            woken: list[str] = []
            if not report.scheduler_behind:  # see sweep()
                requeued, woken = tx.sweep.requeue_stalled(s.pickup_timeout, s.sweep_batch, self.instance_id)
                # parents whose child ended and who were not told (the message was lost)
                requeued += tx.children.children_ended(s.pickup_timeout, s.sweep_batch)
        fault_points.hit("supervisor.after_commit")
        # A message the broker refuses is asked again by the next sweep: the state is committed.
        self.router.relay(tx.outbox)
        # the Scheduler is asked about the batch in a message per back-off, not one per run
        by_backoff: dict[float, list[str]] = {}
        for run_id, _, backoff in retried:
            by_backoff.setdefault(backoff, []).append(run_id)
        for backoff, run_ids in by_backoff.items():
            log.warning("%d step(s) passed complete-by; retry in %.1fs: runs %s", len(run_ids), backoff,
                        _listed(run_ids))
            self.router.send(asking(run_ids, Publish.RETRY, backoff))
        if requeued:
            log.warning("%d run(s) waited past complete-by for the Scheduler; asking again: %s", len(requeued),
                        _listed(requeued))
        if woken:  # a sleep, a wait's timeout or a poll whose time has come: as planned
            log.info("%d run(s) waiting in the store are due; asking the Scheduler: %s", len(woken), _listed(woken))
        if requeued or woken:
            self.router.send(asking(requeued + woken, Publish.REQUEUED))
        self.alerts.emit_grouped(raised)
        if failed:
            self.router.send(asking(failed, Publish.UNDO))  # to undo them, those being compensated
        for follow_up in tx.follow_ups:  # a child run ended, or is being cancelled with its parent
            self.router.send(follow_up)
        report.retried += retried
        report.failed += failed
        report.requeued += requeued + woken
        report.queued += len(queued)
        return len(found)

    @staticmethod
    def _just_taken(tx: Tx, expired: list[StepRow]) -> list[StepRow]:
        """The expired steps an earlier look left waiting in their queue at this attempt that the
        queue no longer holds, given :data:`TAKE_GRACE` once: an agent that took the message a
        moment before this look read the depth may not yet have claimed it
        (``StepTx.start_late``); recovered at a later look if it still has not. (A message lost
        from the queue is recovered a moment later than it would have been.)"""
        candidates = [step for step in expired if not step.is_undo and step.not_before is not None]
        left, taken = tx.sweep.left_queued(candidates)
        return [step for step in candidates if step.id in left and step.id not in taken]

    @staticmethod
    def _silent(tx: Tx, expired: list[StepRow], outwaited: set[int]) -> set[int]:
        """The expired attempts no agent said it took (no ``gave_up``: its message was lost, its
        worker killed whole) whose step has not yet had ``max_failures`` such: retried with no
        failure counted. Not those ``outwaited``, still in their queue past SAS_QUEUE_WAIT_MAX (no
        worker consumes it: that counts), nor an undo (an expired undo goes on regardless)."""
        steps = [step for step in expired if not step.is_undo and step.id not in outwaited]
        gave_up, silent_before = tx.sweep.agents_word(steps)
        return {step.id for step in steps
                if step.id not in gave_up and silent_before[step.id] < step.max_failures}

    def _still_queued(self, tx: Tx, expired: list[StepRow], depths: dict[str, int | None]
                      ) -> tuple[list[StepRow], list[StepRow], set[int]]:
        """The expired steps to leave alone for now: those whose messages still wait in their
        agent's queue, and those that expired a moment ago; and the ids of those still waiting
        there past SAS_QUEUE_WAIT_MAX, judged now.

        The first: untaken — among the last its depth counts — for at most SAS_QUEUE_WAIT_MAX
        past their complete-by. No worker has failed them, so none counts a failure, and the
        agent that takes one late starts it then. While an agent's queue cannot be read (the
        broker just back, or down: no message moves), its steps are left alone too, for
        :data:`UNREAD_GRACE`: there is nothing to judge them by.

        The second: the rest whose complete-by passed less than :data:`TAKE_GRACE` ago, judged at
        a later look: an agent that took the message just then may still be claiming it
        (``StepTx.start_late``), a moment behind the depth this sweep read.

        An undo (sent ahead of the queue) and a step whose agent's queue is empty, or that newer
        dispatches have pushed out of what its depth counts, are recovered: its message was lost,
        or its worker took it and went quiet (:meth:`_silent` tells which). Without replies
        handled in the agents' processes, an agent cannot start a late message (it has no store):
        every expired step is recovered."""
        s = self.settings
        if s.queue_wait_max <= 0 or not s.inline_replies:
            return [], [], set()
        now = tx.now()
        waiting: set[int] = set()
        for agent in {step.agent for step in expired if not step.is_undo}:
            depth = depths.get(agent, 0)
            if depth is None:
                log.warning("%s: its depth could not be read; its steps expired in the last %.0fs are judged later",
                            agent_queue(agent), UNREAD_GRACE)
                waiting |= {step.id for step in expired if step.agent == agent and not step.is_undo
                            and now - (step.complete_by or now) < UNREAD_GRACE}
            elif depth:
                waiting |= {step.id for step in queued_steps(tx, agent, depth)[0]}
        queued = [step for step in expired
                  if step.id in waiting and now - (step.complete_by or now) <= s.queue_wait_max]
        left = {step.id for step in queued}
        just = [step for step in expired if step.id not in left and not step.is_undo
                and now - (step.complete_by or now) < TAKE_GRACE]
        return queued, just, waiting - left

