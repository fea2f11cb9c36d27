"""Steps that wait in the store, as the planner starts and ends them: a durable sleep, and a wait
for an event that a signal ends (:meth:`sas_app.SasApp.signal`).

Neither holds a message or a worker slot. Each is ``pending`` until its time — a sleep's wake
time, a wait's timeout — which is also its complete-by, so the Supervisor's sweep asks the
Scheduler about it then, on the database's clock; a signal ends a wait sooner, in the transaction
that records it. A signal sent before the run reaches its wait is kept and consumed when it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sas_app.engine.graph import step_input, wake_time
from sas_app.settings import Settings, instance_id
from sas_app.states import StepState
from sas_app.store import RunRow, StepRow, Tx

#: what a wait's timeout does: undo the run, leave it in error for an operator, or go on without the event
ON_TIMEOUT = ("compensate", "error", "continue")


@dataclass
class Waited:
    """What :func:`plan_waits` did: a wait ended (what waited for it may start), or a step failed
    (``undo``: the run is undone; otherwise it is left in error)."""

    ended: bool = False
    failed: StepRow | None = None
    reason: str = ""
    undo: bool = True


def plan_waits(tx: Tx, run: RunRow, results: dict[str, Any], ready: Sequence[StepRow], settings: Settings) -> Waited:
    """Start the sleeps and waits that may start; end those whose time has come or whose signal
    has arrived."""
    if not ready:
        return Waited()
    outcome, now = Waited(), tx.now()
    for step in ready:
        if step.state == StepState.NOT_STARTED or step.not_before is None:  # not started, or resubmitted
            until = (wake_time(step, step_input(run, step), results, now, settings.max_sleep) if step.is_sleep
                     else now + step.timeout)
            if isinstance(until, str):
                return Waited(failed=step, reason=f"step {step.name!r}: {until}")
            started = tx.waits.start_sleep(step, until, instance_id()) if step.is_sleep else \
                tx.waits.start_wait(step, until, instance_id())
            if started is None:
                continue
            step = started
        assert step.not_before is not None
        if step.is_wait:
            signal = tx.signals.take_signal(step)
            if signal is not None:
                outcome.ended |= tx.waits.end_wait(step, signal.payload, instance_id(),
                                                   {"signal": signal.id, "event": step.event})
            elif step.not_before <= now:
                timed_out = _time_out(tx, step)
                if timed_out is not None:
                    return timed_out
                outcome.ended = True
        elif step.not_before <= now:
            outcome.ended |= tx.waits.wake(step, instance_id())
    return outcome


def _time_out(tx: Tx, step: StepRow) -> Waited | None:
    """A wait whose timeout passed with no signal: it goes on without one (``continue``), or fails."""
    if step.on_timeout == "continue":
        tx.waits.end_wait(step, {"timed_out": True}, instance_id(), {"event": step.event, "timed_out": True})
        return None
    reason = f"step {step.name!r}: no {step.event!r} signal came within {step.timeout:g} s"
    return Waited(failed=step, reason=reason, undo=step.on_timeout != "error")
