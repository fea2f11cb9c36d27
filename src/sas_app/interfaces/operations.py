"""What an operator does to a run, from the CLI or from Python: resubmit a failed step, mark a
step done by hand, pause, resume, cancel, compensate now.

Each action is one transaction, refused with :class:`InvalidOperation` (nothing changed) when the
run's state does not allow it, and recorded in the run's events with who did it and why. Once it
has committed, the Scheduler is asked to go on through the router: a broker that refuses that
message does not undo the action (it is committed) and is not reported as its failure; the
Supervisor asks the Scheduler again once the step's or run's complete-by passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sas_app.definitions.workflow import Workflow
from sas_app.engine.recovery import cancel_run, undo_run
from sas_app.errors import InvalidOperation, UnknownRun
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance, Router
from sas_app.settings import Settings
from sas_app.states import RunState, StepState
from sas_app.store import RunRow, StepRow, Store, Tx, dumps_payload


class Operator:
    def __init__(self, store: Store, settings: Settings, router: Router,
                 workflows: Mapping[str, Workflow] | None = None) -> None:
        self.store = store
        self.settings = settings
        self.router = router
        #: the registered workflows, whose input models an edited input is validated against
        self.workflows = {} if workflows is None else workflows

    def resubmit(self, run_id: str, *, by: str, reason: str = "", step: str | None = None,
                 step_input: Any = None) -> None:
        """Put a run in ``error`` back to work from its failed step (not from the start): that step
        goes to pending with its failure count reset, optionally with an edited input. A run that
        has no failed step — its deadline passed with nothing to undo — goes back to work where it
        stopped: its stopped steps back to pending, its deadline lifted."""
        _check_reason(by, reason)
        if step_input is not None:
            try:
                dumps_payload(step_input)
            except (TypeError, ValueError) as exc:
                raise InvalidOperation(f"the edited step input is not JSON-serialisable: {exc}") from None
        with self.store.begin() as tx:
            run = _locked(tx, run_id, "resubmit")
            if run.process_state != RunState.ERROR:
                raise InvalidOperation(f"cannot resubmit run {run_id}: it is {run.process_state}, not error")
            workflow = self.workflows.get(run.workflow)
            if step_input is not None and workflow is not None:
                try:
                    step_input = workflow.stored_input(step_input)
                except ValueError as exc:
                    raise InvalidOperation(f"the edited input for run {run_id}: {exc}") from None
            steps = tx.steps.steps_of(run_id)
            stopped_at_deadline = step is None and not any(s.state == StepState.FAILED for s in steps)
            if stopped_at_deadline and step_input is not None:
                raise InvalidOperation(f"cannot resubmit run {run_id} with an edited input: it has no failed step "
                                       "to give it to (name one with --step)")
            _check_slot(tx, run, "resubmit")
            if stopped_at_deadline:
                _refuse_fan_outs(run, steps)
                tx.operations.operator_event(run_id, None, "resubmit", by, reason)
                tx.operations.restart_stopped(run_id, by)
                undoing = False
            else:
                failed = _step(tx, run, step, (StepState.FAILED,), "resubmit")
                tx.operations.operator_event(run_id, failed.position, "resubmit", by, reason)
                tx.operations.resubmit_step(failed, self.settings.pickup_timeout, by, step_input)
                undoing = failed.is_undo
            tx.operations.reopen_run(run, RunState.COMPENSATING if undoing else RunState.PROCESSING, by)
            asked = tx.runs.ask(run_id, Publish.RESUBMITTED, self.settings.pickup_timeout)
        self.router.after_commit(tx.outbox, asked, *tx.follow_ups)

    def mark_done(self, run_id: str, step: str, *, by: str, reason: str = "", result: Any = None) -> None:
        """Record a step an operator completed by hand (or decided to skip) as completed; the run
        goes on with the next one."""
        _check_reason(by, reason)
        with self.store.begin() as tx:
            run = _locked(tx, run_id, "mark a step of")
            if run.process_state not in (RunState.PROCESSING, RunState.ERROR, RunState.COMPENSATING):
                raise InvalidOperation(f"cannot mark a step of run {run_id} done: it is {run.process_state}")
            # an undo may be marked done while it runs too: one retried past its threshold (it passed its
            # complete-by again and again) is mostly running; its late reply is fenced out
            allowed = (StepState.NOT_STARTED, StepState.PENDING, StepState.FAILED)
            target = _step(tx, run, step, (*allowed, StepState.RUNNING), "mark done")
            if target.state == StepState.RUNNING and not target.is_undo:
                raise InvalidOperation(f"cannot mark done step {target.name!r} of run {run_id}: it is running, "
                                       "not not_started or pending or failed (only an undo may be marked done "
                                       "while it runs)")
            _check_slot(tx, run, "mark a step of")
            tx.operations.operator_event(run_id, target.position, "mark_done", by, reason)
            tx.operations.complete_by_hand(target, result, by)
            if target.compensates is not None:
                tx.compensation.mark_compensated(run_id, target.compensates, by)
            if run.process_state == RunState.ERROR:
                tx.operations.reopen_run(run, RunState.COMPENSATING if target.is_undo else RunState.PROCESSING, by)
            asked = tx.runs.ask(run_id, Publish.MARKED_DONE, self.settings.pickup_timeout)
        self.router.after_commit(tx.outbox, asked, *tx.follow_ups)

    def pause(self, run_id: str, *, by: str, reason: str = "") -> None:
        """Dispatch no further step of this run until :meth:`resume` (a running step finishes)."""
        _check_reason(by, reason)
        with self.store.begin() as tx:
            run = _locked(tx, run_id)
            if not tx.operations.set_paused(run, by):
                state = "already paused" if run.paused_by else run.process_state
                raise InvalidOperation(f"cannot pause run {run_id}: it is {state}")
            tx.operations.operator_event(run_id, None, "pause", by, reason)

    def resume(self, run_id: str, *, by: str, reason: str = "") -> None:
        _check_reason(by, reason)
        with self.store.begin() as tx:
            run = _locked(tx, run_id)
            if not tx.operations.set_paused(run, None):
                raise InvalidOperation(f"cannot resume run {run_id}: it is {run.process_state} and not paused")
            tx.operations.operator_event(run_id, None, "resume", by, reason)
            asked = tx.runs.ask(run_id, Publish.RESUMED, self.settings.pickup_timeout)
        self.router.after_commit(tx.outbox, asked, *tx.follow_ups)

    def cancel(self, run_id: str, *, by: str, reason: str = "") -> str:
        """Stop a pending or processing run: no further step starts, and whatever may have been done
        is undone; the run ends ``cancelled``. Returns the state it is in now."""
        _check_reason(by, reason)
        with self.store.begin() as tx:
            run = _locked(tx, run_id)
            if run.process_state not in (RunState.PENDING, RunState.PROCESSING):
                raise InvalidOperation(f"cannot cancel run {run_id}: it is {run.process_state}")
            tx.operations.operator_event(run_id, None, "cancel", by, reason)
            why = f"cancelled by {by}" + (f": {reason}" if reason else "")
            state = cancel_run(tx, run, why, self.settings, by=by)
        undoing = state == RunState.COMPENSATING
        self.router.after_commit(tx.outbox, Advance(run_id, Publish.CANCELLED) if undoing else None, *tx.follow_ups)
        return state

    def compensate(self, run_id: str, *, by: str, reason: str = "") -> None:
        """Undo a processing run, or a run in ``error``, now; it ends ``compensated``."""
        _check_reason(by, reason)
        with self.store.begin() as tx:
            run = _locked(tx, run_id, "compensate")
            if run.process_state not in (RunState.PROCESSING, RunState.ERROR):
                raise InvalidOperation(f"cannot compensate run {run_id}: it is {run.process_state}")
            _check_slot(tx, run, "compensate")
            tx.operations.operator_event(run_id, None, "compensate", by, reason)
            why = f"compensated by {by}" + (f": {reason}" if reason else "")
            if not undo_run(tx, run, why, self.settings, actor=by):
                raise InvalidOperation(f"cannot compensate run {run_id}: none of its steps has anything to undo")
        self.router.after_commit(tx.outbox, Advance(run_id, Publish.COMPENSATE), *tx.follow_ups)


def done_message(action: str, run_id: str, *, step: str | None = None, state: str | None = None,
                 new_run: str | None = None) -> str:
    """What the CLI and the dashboard say once ``action`` has committed (``state``: the one a
    cancelled run is in now; ``new_run``: a rerun's)."""
    return {"resubmit": f"run {run_id} resubmitted", "mark_done": f"step {step} of run {run_id} marked done",
            "pause": f"run {run_id} paused", "resume": f"run {run_id} resumed", "cancel": f"run {run_id} {state}",
            "compensate": f"run {run_id} compensating", "rerun": f"run {run_id} rerun as run {new_run}"}[action]


def _check_slot(tx: Tx, run: RunRow, action: str) -> None:
    """A run in error put back to work takes a slot of its concurrency key again: refused while
    others hold every one (it released its own when it ended)."""
    if run.process_state != RunState.ERROR or run.slot is None or run.max_running is None:
        return
    holders = tx.slots.slot_holders(run)
    if len(holders) >= run.max_running:
        raise InvalidOperation(f"cannot {action} run {run.id}: its key {run.slot!r} runs at most {run.max_running} "
                               f"at once and {', '.join(holders)} hold(s) it; try again once they end")


def _refuse_fan_outs(run: RunRow, steps: list[StepRow]) -> None:
    """A run stopped at its deadline in the middle of a ``for_each`` cannot be put back where it
    stopped (its branches were stopped with it): refused, nothing changed."""
    fanned = [s.name for s in steps if s.state == StepState.STOPPED and (s.for_each is not None or s.is_branch)]
    if fanned:
        raise InvalidOperation(f"cannot resubmit run {run.id}: it stopped in the middle of fan-out step(s) "
                               f"{', '.join(sorted(set(fanned)))}; compensate it or submit it again")


def _locked(tx: Tx, run_id: str, action: str | None = None) -> RunRow:
    """The run, locked; with ``action``, refused when it was rerun: its rerun carries what it did
    on, and putting it back to work would do that twice (a step under two keys, an undo of an
    effect the rerun kept)."""
    run = tx.runs.lock_run(run_id)
    if run is None:
        raise UnknownRun(f"no run with id {run_id!r}")
    if action is not None and run.rerun_as is not None:
        raise InvalidOperation(f"cannot {action} run {run_id}: it was rerun as run {run.rerun_as}; act on that one")
    return run


def _step(tx: Tx, run: RunRow, name: str | None, states: tuple[str, ...], action: str) -> StepRow:
    """The step an action applies to: the one named, or else the single one in ``states``."""
    candidates = [s for s in tx.steps.steps_of(run.id) if (s.name == name if name else s.state in states)]
    wanted = " or ".join(str(state) for state in states)
    if not candidates:
        what = f"no step {name!r}" if name else f"no step in state {wanted}"
        raise InvalidOperation(f"cannot {action} run {run.id}: it has {what}")
    step = candidates[-1] if not name else candidates[0]
    if step.state not in states:
        raise InvalidOperation(f"cannot {action} step {step.name!r} of run {run.id}: it is {step.state}, not {wanted}")
    return step


def _check_reason(by: str, reason: str) -> None:
    if not by or not by.strip():
        raise InvalidOperation("say who is acting (by=...)")
    if reason is None:
        raise InvalidOperation("say why (reason=...)")
