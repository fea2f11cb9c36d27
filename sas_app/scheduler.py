"""The Scheduler: runs each workflow's steps in order, recording state before acting.

Celery tasks on the ``sas.scheduler`` queue. Every handler is one transaction that locks the run,
makes fenced transitions and commits; only then does it send the next message. A message lost
after the commit is recovered by the Supervisor; a duplicate or late one is refused by the fence.

When a run fails for good (a non-transient fault, a step past its failure threshold, a cancel),
the steps whose effects may have happened are undone, last first: each undo is a compensation row
of its own, dispatched and supervised exactly like a step (complete-by, attempts, fencing, its
own idempotency key). The run ends ``compensated`` (``cancelled`` after a cancel), or ``error``
with an alert if an undo fails too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import faults
from .agent import SCHEDULER_QUEUE, agent_queue, agent_task_name, dispatch_task_id
from .alerts import COMPENSATION_FAILED, FAILED, Alert, Alerts
from .notify import relay
from .settings import Settings, instance_id
from .store import EXPIRED, EXPIRED_REASON, LIVE_RUN_STATES, WORKER_LOST, RunRow, StepRow, Store, Tx

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("sas.scheduler")


def well_formed(kind: str, run_id: Any, *numbers: Any) -> bool:
    """A Scheduler message names a run (an id string) and, for a reply, a step position and an
    attempt (integers). Anything else is logged and dropped before it reaches the store."""
    if isinstance(run_id, str) and 0 < len(run_id) <= 64 and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers
    ):
        return True
    log.error("%s rejected a malformed message: run_id must be an id and position and attempt "
              "non-negative integers, got %r", kind, (run_id, *numbers))
    return False


@dataclass(frozen=True)
class Dispatch:
    """An agent message to send once the transaction that marked its step running commits."""

    run: RunRow
    step: StepRow
    results: dict[str, Any]
    undoes: StepRow | None = None

    def message(self) -> dict[str, Any]:
        return {
            "run_id": self.run.id,
            "business_key": self.run.business_key,
            "workflow": self.run.workflow,
            "step": self.step.name,
            "position": self.step.position,
            "attempt": self.step.attempt,
            "idempotency_key": self.step.idempotency_key,
            "payload": self.run.payload if self.step.input is None else self.step.input,
            "results": self.results,
            "complete_by": self.step.complete_by,
            "budget": self.step.timeout,
            "undoes": None if self.undoes is None else {
                "step": self.undoes.name, "idempotency_key": self.undoes.idempotency_key,
            },
        }


@dataclass(frozen=True)
class Later:
    """Ask the Scheduler again for this run after ``delay`` seconds (a back-off not yet over)."""

    run_id: str
    delay: float


class Scheduler:
    @property
    def instance_id(self) -> str:
        return instance_id()

    def __init__(self, store: Store, celery: Celery, settings: Settings, alerts: Alerts) -> None:
        self.store = store
        self.celery = celery
        self.settings = settings
        self.alerts = alerts
        self._register_tasks()

    def _register_tasks(self) -> None:
        # Late acks: a scheduler killed mid-handler leaves the message to be redelivered; every
        # handler is fenced, so running it twice is harmless.
        options: dict[str, Any] = {
            "shared": False, "acks_late": True, "reject_on_worker_lost": True, "ignore_result": True,
        }

        @self.celery.task(name="sas.scheduler.advance", **options)
        def advance(run_id: str) -> None:
            if well_formed("advance", run_id):
                self.advance(run_id)

        @self.celery.task(name="sas.scheduler.step_done", **options)
        def step_done(run_id: str, position: int, attempt: int, result: Any = None,
                      results: dict[str, Any] | None = None) -> None:
            if well_formed("step_done", run_id, position, attempt) and (results is None or isinstance(results, dict)):
                self.step_done(run_id, position, attempt, result, results)

        @self.celery.task(name="sas.scheduler.step_failed", **options)
        def step_failed(run_id: str, position: int, attempt: int, error: str = "") -> None:
            if well_formed("step_failed", run_id, position, attempt):
                self.step_failed(run_id, position, attempt, str(error))

        @self.celery.task(name="sas.scheduler.step_deferred", **options)
        def step_deferred(run_id: str, position: int, attempt: int, delay: float = 1.0, reason: str = "") -> None:
            if well_formed("step_deferred", run_id, position, attempt) and isinstance(delay, (int, float)):
                self.step_deferred(run_id, position, attempt, delay, str(reason))

        @self.celery.task(name="sas.scheduler.step_lost", **options)
        def step_lost(run_id: str, position: int, attempt: int, reason: str = "") -> None:
            if well_formed("step_lost", run_id, position, attempt):
                self.step_lost(run_id, position, attempt, str(reason))

    # -- handlers ---------------------------------------------------------------------------

    def advance(self, run_id: str) -> None:
        """Claim the run if it is pending and dispatch its next step, if that step is due."""
        with self.store.begin() as tx:
            first = None
            run = tx.claim_pending_run(run_id, self.instance_id)  # a new run: claimed and locked at once
            if run is not None:
                if not run.paused_by:
                    first = tx.mark_next_running(run_id, 0, self.instance_id)
            else:
                run = tx.lock_run(run_id)
            if run is None:
                log.warning("advance: no run %s; message ignored", run_id)
                return
            if run.process_state not in LIVE_RUN_STATES:
                log.info("advance: run %s is %s; nothing to do", run_id, run.process_state)
                return
            next_message = Dispatch(run, first, {}) if first is not None else self._next(tx, run)
        self._after_commit(tx, next_message)

    def step_done(
        self, run_id: str, position: int, attempt: int, result: Any, results: dict[str, Any] | None = None
    ) -> None:
        """An agent's success reply: record it if that attempt still runs, then go on.

        ``results`` (the earlier steps' results, as the agent received them) lets the common case
        dispatch the next step without reading the run's steps: lock the run, complete this step,
        mark the next one running, write their events, commit — on PostgreSQL as one statement."""
        if results is not None and self.store.is_postgresql and self._step_done_fast(
            run_id, position, attempt, result, results
        ):
            return
        with self.store.begin() as tx:
            run = tx.lock_run(run_id)
            done = None
            if run is not None and run.process_state in LIVE_RUN_STATES:
                done = tx.complete_step(run_id, position, attempt, result, actor=self.instance_id)
            if run is None or done is None:
                self._stale(tx, run, position, attempt, "step_done")
                return
            if done.compensates is not None:
                tx.mark_compensated(run_id, done.compensates, self.instance_id)
            if run.reply_to is not None:
                kind = "step_undone" if done.is_undo else "step_completed"
                tx.notify(run_id, run.reply_to, run.business_key, run.workflow, kind,
                          step=done.name, position=done.position, attempt=done.attempt)
            following = None
            if results is not None and not done.is_undo and run.process_state == "processing" and not run.paused_by:
                following = tx.mark_next_running(run_id, position + 1, self.instance_id)
            if following is not None and results is not None:
                next_message: Dispatch | Later | None = Dispatch(run, following, {**results, done.name: result})
            else:
                next_message = self._next(tx, run)
        self._after_commit(tx, next_message)

    def _step_done_fast(
        self, run_id: str, position: int, attempt: int, result: Any, results: dict[str, Any]
    ) -> bool:
        """The common reply on PostgreSQL, in one statement; False if it needs the general path."""
        with self.store.begin() as tx:
            fast = tx.complete_and_advance(run_id, position, attempt, result, self.instance_id)
            if fast is None:
                return False
            run, name, following, finished = fast
            next_message: Dispatch | Later | None = None
            if following is not None:
                next_message = Dispatch(run, following, {**results, name: result})
            elif not finished:
                next_message = self._next(tx, run)
        self._after_commit(tx, next_message)
        return True

    def step_failed(self, run_id: str, position: int, attempt: int, error: str) -> None:
        """An agent's non-transient fault: the step fails with one alert, and the run is undone
        (or goes to ``error`` when there is nothing to undo, or when an undo itself failed)."""
        with self.store.begin() as tx:
            run = tx.lock_run(run_id)
            failed = None
            if run is not None and run.process_state in LIVE_RUN_STATES:
                failed = tx.fail_step(run_id, position, attempt, error, actor=self.instance_id, count_failure=True)
            if run is None or failed is None:
                self._stale(tx, run, position, attempt, "step_failed")
                return
            alert = fail_run(tx, self.alerts, self.settings, run, failed, f"step {failed.name!r} failed: {error}",
                             actor=self.instance_id)
            after = tx.lock_run(run_id)
            next_message = self._next(tx, after) if after is not None else None
        self.alerts.emit(alert)
        self._after_commit(tx, next_message)

    def step_deferred(self, run_id: str, position: int, attempt: int, delay: float, reason: str) -> None:
        """The agent did not call its service (its circuit breaker is open): the step waits
        ``delay`` seconds, back in pending, without counting a failure."""
        with self.store.begin() as tx:
            run = tx.lock_run(run_id)
            deferred = False
            if run is not None and run.process_state in LIVE_RUN_STATES:
                deferred = tx.defer_step(run_id, position, attempt, max(float(delay), 0.0),
                                         self.settings.pickup_timeout, reason, actor=self.instance_id)
            if run is None or not deferred:
                self._stale(tx, run, position, attempt, "step_deferred")
                return
        self._after_commit(tx, Later(run_id, max(float(delay), 0.0)))

    def step_lost(self, run_id: str, position: int, attempt: int, reason: str) -> None:
        """The worker process running this attempt died (reported by its worker's main process).

        Handled as the Supervisor handles an attempt past its complete-by, only sooner: one failure
        counted, then a retry after a back-off, or, at the step's threshold, the step fails and the
        run is undone. A step that kills every worker it runs on (a poison step) therefore costs at
        most ``max_failures`` worker processes, spaced by the back-off, never a redelivery loop."""
        with self.store.begin() as tx:
            run = tx.lock_run(run_id)
            step = tx.running_step(run_id, position, attempt) if run is not None else None
            if run is None or step is None or run.process_state not in LIVE_RUN_STATES:
                self._stale(tx, run, position, attempt, "step_lost")
                return
            outcome = recover_step(tx, self.alerts, self.settings, step, WORKER_LOST, reason, actor=self.instance_id)
        self.alerts.emit(outcome.alert)
        log.warning("run %s step %s attempt %s: worker lost (%s); %s", run_id, position, attempt, reason,
                    "failed for good" if outcome.failed else f"retry in {outcome.backoff:.1f}s")
        self._after_commit(tx, Later(run_id, outcome.backoff))

    # -- internals --------------------------------------------------------------------------

    def _next(self, tx: Tx, run: RunRow) -> Dispatch | Later | None:
        """Within the run's transaction: dispatch the first unfinished step (or undo, while
        compensating), or finish the run when there is none."""
        steps = tx.steps_of(run.id)
        if run.process_state == "processing" and run.paused_by is None:
            chain, final = [s for s in steps if not s.is_undo], "processed"
        elif run.process_state == "compensating":
            chain, final = [s for s in steps if s.is_undo], "cancelled" if run.cancelled_by else "compensated"
        else:
            return None
        for step in chain:
            if step.state == "completed":
                continue
            if step.state not in ("not_started", "pending"):
                return None  # running or failed: an agent or the Supervisor owns it
            running = tx.mark_step_running(step, self.instance_id)
            if running is not None:
                results = {s.name: s.result for s in steps if not s.is_undo and s.result is not None}
                undoes = None if running.compensates is None else steps[running.compensates]
                return Dispatch(run, running, results, undoes)
            if step.not_before is not None:
                delay = step.not_before - tx.now()
                if delay > 0:
                    return Later(run.id, delay)
            return None
        tx.finish_run(run.id, final, from_state=run.process_state, actor=self.instance_id)
        log.info("run %s (%s %s) %s", run.id, run.workflow, run.business_key, final)
        return None

    def _stale(self, tx: Tx, run: RunRow | None, position: int, attempt: int, kind: str) -> None:
        if run is None:
            log.warning("%s for unknown run; ignored", kind)
            return
        log.info("%s for run %s step %s attempt %s is stale; ignored", kind, run.id, position, attempt)
        tx.event(run.id, position, "stale_reply", None, None, attempt=attempt, actor=self.instance_id,
                 detail={"message": kind})

    def _broker_priority(self, urgency: int) -> int:
        """Our 0-9 urgency as the broker counts it: Redis serves 0 first, AMQP serves 9 first."""
        return 9 - urgency if self.settings.broker_url.startswith(("redis", "rediss")) else urgency

    def _after_commit(self, tx: Tx, next_message: Dispatch | Later | None) -> None:
        """Once the transaction has committed: its notifications, then the next message. In that
        order, so a submitter hears of a step before anything that follows it."""
        if next_message is None and not tx.outbox:
            return
        faults.hit("scheduler.after_commit")
        relay(self.celery, self.store, tx.outbox)
        self._send(next_message)

    def _send(self, next_message: Dispatch | Later | None) -> None:
        if next_message is None:
            return
        try:
            if isinstance(next_message, Later):
                self.celery.send_task(
                    "sas.scheduler.advance", args=[next_message.run_id], queue=SCHEDULER_QUEUE,
                    countdown=next_message.delay,
                )
                return
            step = next_message.step
            self.celery.send_task(
                agent_task_name(step.agent, step.action),
                task_id=dispatch_task_id(step.run_id, step.position, step.attempt),
                kwargs=next_message.message(),
                queue=agent_queue(step.agent),
                priority=self._broker_priority(next_message.run.priority),
                # a backstop checked on the consuming worker's clock (see Settings.clock_skew)
                expires=step.timeout + self.settings.clock_skew,
                soft_time_limit=step.timeout + 1,
                time_limit=step.timeout + 5,
            )
        except Exception:
            # The transition is committed; the Supervisor re-dispatches after complete-by.
            what = (f"run {next_message.run_id}" if isinstance(next_message, Later) else
                    f"run {next_message.run.id} step {next_message.step.name} attempt {next_message.step.attempt}")
            log.exception("could not publish for %s; the Supervisor will recover it", what)


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover_step` decided for an attempt given up."""

    retried: bool
    failed: bool
    backoff: float
    alert: Alert | None = None


def backoff(settings: Settings, failure_count: int) -> float:
    """Seconds to wait before retry number ``failure_count``: doubling, capped."""
    return float(min(settings.retry_backoff * 2 ** (failure_count - 1), settings.retry_backoff_max))


def recover_step(
    tx: Tx, alerts: Alerts, settings: Settings, step: StepRow, why: str, detail: str, *, actor: str
) -> Recovery:
    """In the caller's transaction (the step's row locked), for a ``running`` attempt that will never
    reply: count one failure; under the step's threshold, back to pending after a back-off (the
    caller asks the Scheduler again after it); at the threshold, the step fails for good and the
    run is undone (or goes to ``error``) with one alert. Fenced on the attempt: nothing happens if
    the step moved on meanwhile."""
    failures = step.failure_count + 1
    if failures < step.max_failures:
        wait = backoff(settings, failures)
        won = tx.retry_step(step, wait, settings.pickup_timeout, actor, reason=why)
        return Recovery(retried=won is not None, failed=False, backoff=wait)
    what = "passed its complete-by" if why == EXPIRED_REASON else "lost its worker"
    reason = f"step {step.name!r} {what} {failures} times (threshold {step.max_failures})"
    if detail:
        reason += f": {detail}"
    failed = tx.fail_step(step.run_id, step.position, step.attempt, EXPIRED, actor=actor, count_failure=True)
    run = tx.lock_run(step.run_id) if failed is not None else None
    if failed is None or run is None:
        return Recovery(retried=False, failed=False, backoff=0.0)
    return Recovery(retried=False, failed=True, backoff=0.0,
                    alert=fail_run(tx, alerts, settings, run, failed, reason, actor=actor))


def fail_run(
    tx: Tx, alerts: Alerts, settings: Settings, run: RunRow, step: StepRow, reason: str, *, actor: str
) -> Alert | None:
    """In the caller's transaction, once ``step`` has failed for good: raise its alert, then
    start undoing the run, or put it in ``error`` if there is nothing to undo or an undo failed."""
    kind = COMPENSATION_FAILED if step.is_undo else FAILED
    alert = alerts.record(
        tx, Alert(run.id, run.workflow, run.business_key, step.name, step.position, step.attempt, reason, kind),
        actor,
    )
    tx.count_run_failure(run.id)
    if step.is_undo:
        tx.finish_run(run.id, "error", from_state=run.process_state, actor=actor,
                      error=f"compensation failed: {reason}")
    elif not tx.start_compensation(run, reason, settings.pickup_timeout, actor=actor):
        tx.finish_run(run.id, "error", from_state=run.process_state, actor=actor, error=reason)
    return alert
