"""Steps that wait in the store, holding no message and no worker slot: a durable sleep is
``pending`` until its time, a wait for an event until its timeout (``not_before``), each with its
complete-by at that same time, so the Supervisor's sweep — which asks the Scheduler about pending
steps whose complete-by has passed — wakes it on the database's clock. A signal ends a wait
sooner (:mod:`sas_app.store.signals`)."""

from __future__ import annotations

from typing import Any

from sas_app.states import StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import StepRow
from sas_app.store.runs import RunTx
from sas_app.store.steps import StepTx
from sas_app.store.transitions import Part, TxBase


class WaitTx(Part):
    def __init__(self, tx: TxBase, runs: RunTx, steps: StepTx) -> None:
        super().__init__(tx)
        self.runs = runs
        self.steps = steps

    def start_sleep(self, step: StepRow, wake: float, actor: str) -> StepRow | None:
        """not_started (or pending, resubmitted) → pending until ``wake`` (epoch seconds, the database's clock)."""
        return self.steps.move_step(step, StepState.PENDING, actor=actor, detail={"sleep_until": wake},
                                    not_before=wake, complete_by=wake, locked_by=None)

    def start_wait(self, step: StepRow, until: float, actor: str) -> StepRow | None:
        """not_started (or pending, resubmitted) → pending for its event until ``until``, its timeout."""
        return self.steps.move_step(step, StepState.PENDING, actor=actor,
                                    detail={"event": step.event, "wait_until": until},
                                    not_before=until, complete_by=until, locked_by=None)

    def escalate_step(self, step: StepRow, wait: float, *, failure_count: int, actor: str) -> StepRow | None:
        """running (at its failure threshold) → pending for its escalation's extended ``wait``, with
        ``failure_count`` set so its escalation's retries remain; its complete-by is the end of the
        wait, so the sweep, not a delayed message, asks the Scheduler to retry it."""
        now = db_now()
        won = self.steps.update_step(step.run_id, step.position, step.attempt, StepState.RUNNING, StepState.PENDING,
                                     failure_count=failure_count, escalated=step.escalated + 1, locked_by=None,
                                     not_before=now + wait, complete_by=now + wait)
        if won is not None:
            self.runs.count_run_failure(step.run_id)
            self.tx.transition(step.run_id, step.position, StepState.RUNNING, StepState.PENDING, attempt=step.attempt,
                               actor=actor, detail={"escalated": step.escalated + 1, "wait": wait})
        return won

    def wake(self, step: StepRow, actor: str) -> bool:
        """A sleep whose time has come: pending → completed."""
        return self.end_wait(step, {"slept_until": step.not_before}, actor)

    def end_wait(self, step: StepRow, result: Any, actor: str, detail: Any = None) -> bool:
        """A sleep or a wait that is over: pending → completed with ``result``."""
        return self.steps.move_step(step, StepState.COMPLETED, actor=actor, detail=detail, result=result,
                                    completed_at=db_now(), complete_by=None) is not None
