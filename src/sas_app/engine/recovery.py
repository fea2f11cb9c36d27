"""The recovery policy: what happens to an attempt that will never reply, to a step that failed
for good, and which steps of a run get undone.

* An attempt given up (its complete-by passed, or its worker died) counts one failure. Under the
  step's ``max_failures`` it goes back to pending after a back-off that doubles with each failure
  (``SAS_RETRY_BACKOFF``, capped at ``SAS_RETRY_BACKOFF_MAX``) — or longer, when the Supervisor
  paces it because its agent's queue is too deep to take it in time; at the threshold it fails.
* An attempt that passed its complete-by in silence — no agent said it took it: its message was
  lost with the broker, or its worker was killed whole — counts none: nothing tried it. It goes
  back to pending after the first back-off, up to ``max_failures`` times a step; past that, each
  counts as above (a step that makes its whole worker die each time still ends).
* A step that failed for good raises one alert and the run is undone — its steps whose effect may
  have happened, last first — or goes to ``error`` when there is nothing to undo. An undo that
  fails for good (its service refused it, or it lost its worker at every attempt) sends the run to
  ``error`` with a second alert. An undo that only passed its complete-by is never given up: an
  effect left standing is worse than a late undo, and an expiry says nothing of the service's
  answer (its queue was backed up, the broker was down). At the threshold it raises one
  ``compensation_stuck`` alert and goes on, once every ``SAS_RETRY_BACKOFF_MAX`` at most, until it
  completes, is refused, or an operator marks it done.

Each function works inside the caller's transaction, fenced on the step's attempt: nothing happens
if the step moved on meanwhile. The Scheduler (a lost worker, an agent's permanent fault), the
Supervisor (an expired attempt) and the operators (cancel, compensate) all decide through here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sas_app.engine.alerts import COMPENSATION_FAILED, COMPENSATION_STUCK, DEADLINE, ESCALATED, FAILED, Alert, Alerts
from sas_app.engine.graph import Graph
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance
from sas_app.settings import Settings
from sas_app.states import EXPIRED_ERROR, Cause, RunState, StepState
from sas_app.store import RunRow, StepRow, Tx


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover_step` decided for an attempt given up."""

    retried: bool
    failed: bool
    backoff: float
    alert: Alert | None = None
    #: the step waits the extended period of its escalation (the sweep wakes it: no message to send)
    escalated: bool = False
    #: the retry waits for room in its agent's queue in the store (the sweep wakes it: no message to send)
    paced: bool = False


#: A paced retry that waits longer than this, in seconds, waits in the store (the sweep wakes it);
#: a shorter wait is the countdown of the Scheduler's message, as a back-off is. Long waits are
#: rows with a due time, never messages held by a broker or a worker.
PACED_IN_STORE_AFTER = 5.0


def backoff(settings: Settings, failure_count: int) -> float:
    """Seconds to wait before retry number ``failure_count``: doubling, capped."""
    return float(min(settings.retry_backoff * 2 ** (failure_count - 1), settings.retry_backoff_max))


def undoable(steps: Sequence[StepRow]) -> list[StepRow]:
    """The steps to undo, last first: those with an undo action whose effect may have happened —
    completed, still running or waiting for a retry (a late reply is fenced out), or failed by the
    Supervisor on expiry. A step whose agent reported a permanent fault did nothing and is not undone.
    With steps that ran in parallel, "last" is the order they completed in (those still under way
    first), so a step is undone before any step it waited for; a ``for_each`` step is undone
    branch by branch."""
    chosen = [
        s for s in steps
        if not s.is_undo and s.undo is not None and s.for_each is None
        and (s.state in (StepState.COMPLETED, StepState.RUNNING)
             or (s.state == StepState.PENDING and s.attempt > 0)
             or (s.state == StepState.FAILED and s.error == EXPIRED_ERROR))
    ]
    return sorted(chosen, key=lambda s: (s.completed_at is None, s.completed_at or 0.0, s.position), reverse=True)


def undo_run(tx: Tx, run: RunRow, reason: str, settings: Settings, *, actor: str,
             cancelled_by: str | None = None) -> list[StepRow]:
    """Start undoing ``run``: it goes to ``compensating`` with a compensation row for each step
    :func:`undoable` names. Returns those steps; none means nothing changed."""
    steps = tx.steps.steps_of(run.id)
    _cancel_children(tx, run, steps, reason, settings, actor)
    undo = undoable(steps)
    if not tx.compensation.start_compensation(run, undo, reason, settings.pickup_timeout, actor=actor,
                                              first_free=Graph(steps).next_free(),
                                              cancelled_by=cancelled_by):
        return []
    return undo


def cancel_run(tx: Tx, run: RunRow, why: str, settings: Settings, *, by: str) -> str:
    """Stop a pending or processing run (locked by the caller): no further step starts, and
    whatever may have been done is undone — it ends ``cancelled`` then, or at once with nothing
    to undo. Returns the state it is in now (``compensating`` or ``cancelled``)."""
    if undo_run(tx, run, why, settings, actor=by, cancelled_by=by):
        return RunState.COMPENSATING.value
    tx.runs.finish_run(run.id, RunState.CANCELLED, from_state=run.process_state, actor=by, error=why, cancelled_by=by)
    tx.compensation.stop_live_steps(run.id, by)  # a wait or sleep left would wait for ever
    return RunState.CANCELLED.value


def _cancel_children(tx: Tx, run: RunRow, steps: Sequence[StepRow], reason: str, settings: Settings,
                     actor: str) -> None:
    """A run being undone (or failed) cancels its live child runs: each is undone in turn (its own
    children too), or ends ``cancelled`` when it has nothing to undo."""
    waiting = {s.position for s in steps if s.child is not None and s.state == StepState.RUNNING}
    for child in tx.children.children_of(run.id) if waiting else []:
        if child.parent_position not in waiting or child.process_state not in (RunState.PENDING,
                                                                                RunState.PROCESSING):
            continue
        locked = tx.runs.lock_run(child.id)
        if locked is None:
            continue
        why = f"its parent run {run.id} is being undone: {reason}"
        if not undo_run(tx, locked, why, settings, actor=actor, cancelled_by=actor):
            tx.runs.finish_run(child.id, RunState.CANCELLED, from_state=locked.process_state, actor=actor, error=why,
                               cancelled_by=actor)
        tx.follow_ups.append(Advance(child.id, Publish.CHILD_CANCELLED))


def recover_step(tx: Tx, alerts: Alerts, settings: Settings, step: StepRow, why: Cause, detail: str, *,
                 actor: str) -> Recovery:
    """For a ``running`` attempt that will never reply (its row locked by the caller): one failure
    counted; under the step's threshold, back to pending after a back-off (the caller asks the
    Scheduler again after it); at the threshold, the step's escalation if it has one
    (:func:`_escalate`), else it fails for good (:func:`fail_run`) — an undo only once it lost its
    worker at every attempt (one that passed its complete-by goes on: :func:`_goes_on`)."""
    [(_, outcome)] = recover_steps(tx, alerts, settings, [step], why, detail, actor=actor)
    return outcome


def recover_steps(tx: Tx, alerts: Alerts, settings: Settings, batch: Sequence[StepRow], why: Cause,
                  detail: str = "", *, actor: str, paced: Mapping[int, float] | None = None,
                  silent: Collection[int] = ()) -> list[tuple[StepRow, Recovery]]:
    """:func:`recover_step` for a batch of attempts (their rows locked by the caller), set-based
    where the numbers are: those that go back to pending move together, one fenced statement per
    back-off however many they are; those at their threshold (escalated, or failed and undone)
    one by one, after them.

    ``paced`` holds, by step id, how long a retry waits for room in its agent's queue (the
    Supervisor's pacing) when that is longer than its back-off, rounded up to half a second so that
    a batch still moves in a few statements. A wait of more than :data:`PACED_IN_STORE_AFTER`
    seconds is kept in the store — the step's complete-by is the end of its wait, the sweep wakes it
    then — rather than held as a message's countdown.

    ``silent`` holds the ids of expired attempts no agent said it took, under their step's limit of
    such: they go back to pending with no failure counted, after the first back-off."""
    paced = paced or {}
    retrying: dict[tuple[float, bool, bool], list[StepRow]] = {}
    at_threshold = []
    for step in batch:
        counted = step.id not in silent
        if not counted or _goes_on(tx, step, why):
            wait, held = backoff(settings, step.failure_count + 1 if counted else 1), paced.get(step.id, 0.0)
            if held > wait:
                wait = math.ceil(held * 2) / 2
            retrying.setdefault((wait, held > PACED_IN_STORE_AFTER, counted), []).append(step)
        else:
            at_threshold.append(step)
    outcomes = []
    for (wait, held, counted), group in retrying.items():
        moved = {s.id for s in tx.steps.retry_steps(group, wait, 0.0 if held else settings.pickup_timeout, actor,
                                                    reason=str(why if counted else Cause.SILENT), counted=counted)}
        outcomes += [(s, Recovery(retried=s.id in moved, failed=False, backoff=wait, paced=held,
                                  alert=_stuck(tx, alerts, s, actor) if s.id in moved else None))
                     for s in group]
    return outcomes + [(s, _give_up(tx, alerts, settings, s, why, detail, actor)) for s in at_threshold]


def _give_up(tx: Tx, alerts: Alerts, settings: Settings, step: StepRow, why: Cause, detail: str,
             actor: str) -> Recovery:
    """An attempt at the step's threshold: its escalation if it has one not yet taken, else the
    step fails for good and the run is undone (or left in ``error``)."""
    what = "passed its complete-by" if why == Cause.EXPIRED else "lost its worker"
    times = tx.steps.workers_lost(step) + 1 if step.is_undo else step.failure_count + 1  # an undo: see _goes_on
    reason = f"step {step.name!r} {what} {times} times (threshold {step.max_failures})"
    if detail:
        reason += f": {detail}"
    escalate = step.escalate or {}
    if escalate and not step.escalated:
        return _escalate(tx, alerts, step, escalate, reason, actor)
    if escalate:
        reason += f", again after waiting {escalate['wait']:g} s; then: {escalate['then']}"
    failed = tx.steps.fail_step(step.run_id, step.position, step.attempt, EXPIRED_ERROR, actor=actor,
                                count_failure=True)
    run = tx.runs.lock_run(step.run_id) if failed is not None else None
    if failed is None or run is None:
        return Recovery(retried=False, failed=False, backoff=0.0)
    undo = escalate.get("then", "compensate") == "compensate"
    return Recovery(retried=False, failed=True, backoff=0.0,
                    alert=fail_run(tx, alerts, settings, run, failed, reason, actor=actor, undo=undo))


def _goes_on(tx: Tx, step: StepRow, why: Cause) -> bool:
    """Whether an attempt given up is retried: under the step's threshold, yes; past it, only an
    undo (see the module's note), unless it lost its worker at every one of ``max_failures`` attempts."""
    if step.failure_count + 1 < step.max_failures:
        return True
    if not step.is_undo:
        return False
    return why == Cause.EXPIRED or tx.steps.workers_lost(step) + 1 < step.max_failures


def _stuck(tx: Tx, alerts: Alerts, step: StepRow, actor: str) -> Alert | None:
    """An undo retried once more past its threshold (see the module's note): one alert, when it
    reaches the threshold; None for every other retry."""
    if step.failure_count + 1 != step.max_failures:
        return None
    run = tx.runs.lock_run(step.run_id)
    if run is None:
        return None
    reason = (f"step {step.name!r} failed {step.max_failures} attempts (past its complete-by, or its worker lost); "
              "it is retried until it completes, its service refuses it, or an operator marks it done")
    return alerts.record(tx, Alert(run.id, run.workflow, run.business_key, step.name, step.position, step.attempt,
                                   reason, COMPENSATION_STUCK), actor)


def _escalate(tx: Tx, alerts: Alerts, step: StepRow, escalate: dict[str, Any], reason: str, actor: str) -> Recovery:
    """The pattern's escalation at the threshold: wait the extended period "in the expectation that
    the fault will be resolved", then ``retries`` more attempts; one alert for this rung."""
    wait, retries = float(escalate["wait"]), int(escalate["retries"])
    won = tx.waits.escalate_step(step, wait, failure_count=step.max_failures - retries, actor=actor)
    run = tx.runs.lock_run(step.run_id) if won is not None else None
    if won is None or run is None:
        return Recovery(retried=False, failed=False, backoff=0.0)
    reason += f": escalated, waiting {wait:g} s, then {retries} more attempt(s), then {escalate['then']}"
    alert = alerts.record(tx, Alert(run.id, run.workflow, run.business_key, step.name, step.position, step.attempt,
                                    reason, ESCALATED), actor)
    return Recovery(retried=False, failed=False, backoff=wait, alert=alert, escalated=True)


def past_deadline(tx: Tx, alerts: Alerts, settings: Settings, run: RunRow, *, actor: str) -> Alert | None:
    """A live run (locked by the caller) past its deadline: one alert, no further step, and the
    run is undone — or goes to ``error`` when there is nothing to undo."""
    allowed = (run.deadline or 0.0) - run.created_at
    reason = f"run passed its deadline ({allowed:g} s after it was submitted)"
    alert = alerts.record(tx, Alert(run.id, run.workflow, run.business_key, None, None, None, reason, DEADLINE), actor)
    tx.runs.count_run_failure(run.id)
    if not undo_run(tx, run, reason, settings, actor=actor):
        tx.runs.finish_run(run.id, RunState.ERROR, from_state=run.process_state, actor=actor, error=reason)
        tx.compensation.stop_live_steps(run.id, actor)  # nothing was done; nothing may wait for ever either
    return alert


def fail_run(tx: Tx, alerts: Alerts, settings: Settings, run: RunRow, step: StepRow, reason: str, *,
             actor: str, undo: bool = True) -> Alert | None:
    """Once ``step`` has failed for good: raise its alert, then start undoing the run, or put it in
    ``error`` if there is nothing to undo, an undo itself failed or ``undo`` is False (left to an
    operator as it stands)."""
    kind = COMPENSATION_FAILED if step.is_undo else FAILED
    alert = alerts.record(
        tx, Alert(run.id, run.workflow, run.business_key, step.name, step.position, step.attempt, reason, kind),
        actor,
    )
    tx.runs.count_run_failure(run.id)
    if step.is_undo:
        tx.runs.finish_run(run.id, RunState.ERROR, from_state=run.process_state, actor=actor,
                           error=f"compensation failed: {reason}")
    elif not undo or not undo_run(tx, run, reason, settings, actor=actor):
        tx.runs.finish_run(run.id, RunState.ERROR, from_state=run.process_state, actor=actor, error=reason)
    return alert
