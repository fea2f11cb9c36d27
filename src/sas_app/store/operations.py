"""The transitions an operator makes: reopen a run in error, resubmit a failed step, complete a
step by hand, pause and resume. Each is fenced like any transition and recorded with who did it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update

from sas_app.states import EventKind, RunState, StepState
from sas_app.store.connection import db_now
from sas_app.store.diagnosis import stranded
from sas_app.store.rows import RunRow, StepRow
from sas_app.store.runs import RunTx
from sas_app.store.steps import StepTx
from sas_app.store.tables import runs, steps
from sas_app.store.transitions import Part, TxBase, run_in


class OperationsTx(Part):
    def __init__(self, tx: TxBase, runs: RunTx, steps: StepTx) -> None:
        super().__init__(tx)
        self.runs = runs
        self.steps = steps

    def operator_event(self, run_id: str, position: int | None, action: str, by: str, reason: str) -> None:
        self.tx.event(run_id, position, EventKind.OPERATOR, None, None, actor=by,
                      detail={"action": action, "by": by, "reason": reason})

    def reopen_run(self, run: RunRow, to_state: str, actor: str) -> bool:
        """error → processing | compensating, for an operator who fixed the cause (its deadline,
        which may have sent it there, lifted)."""
        won = self.runs.update_run(run.id, run.process_state, to_state, error=None, deadline=None)
        if won:
            self.tx.transition(run.id, None, run.process_state, to_state, actor=actor)
        return won

    def resubmit_step(self, step: StepRow, pickup_timeout: float, actor: str, step_input: Any = None) -> bool:
        """failed → pending with its failure count and escalation reset (and an edited input, if given)."""
        values: dict[str, Any] = {"failure_count": 0, "escalated": 0, "not_before": None, "error": None,
                                  "locked_by": None, "complete_by": db_now() + pickup_timeout}
        if step_input is not None:
            values["input"] = step_input
        won = self.steps.update_step(step.run_id, step.position, step.attempt, StepState.FAILED, StepState.PENDING,
                                     **values)
        if won:
            self.tx.transition(step.run_id, step.position, StepState.FAILED, StepState.PENDING, attempt=step.attempt,
                               actor=actor)
        return won is not None

    def restart_stopped(self, run_id: str, actor: str) -> None:
        """A run's stopped workflow steps (its deadline stopped them) → pending, their failure
        count reset: the Scheduler starts them again, a sleep or a wait from its beginning."""
        stopped = self.conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.compensates.is_(None), steps.c.state == StepState.STOPPED.value)
            .values(state=StepState.PENDING.value, failure_count=0, escalated=0, not_before=None, complete_by=None,
                    locked_by=None, error=None, updated_at=db_now())
            .returning(steps.c.position, steps.c.attempt)
        ).all()
        for position, attempt in stopped:
            self.tx.transition(run_id, position, StepState.STOPPED, StepState.PENDING, attempt=attempt, actor=actor)

    def complete_by_hand(self, step: StepRow, result: Any, actor: str) -> bool:
        """not_started | pending | failed → completed, for a step an operator did by hand."""
        won = self.steps.update_step(step.run_id, step.position, step.attempt, step.state, StepState.COMPLETED,
                                     result=result, locked_by=None, completed_at=db_now())
        if won:
            self.tx.transition(step.run_id, step.position, step.state, StepState.COMPLETED, attempt=step.attempt,
                               actor=actor, detail={"by_hand": True})
        return won is not None

    def hand_over_stranded(self, by: str) -> list[str]:
        """Live runs with nothing due (:func:`sas_app.store.diagnosis.stranded`) get a complete-by of
        now, so that the Supervisor's next sweep asks the Scheduler about them; each gets an
        operator event. Returns their ids."""
        now = db_now()
        ids = list(self.conn.execute(update(runs).where(runs.c.id.in_(stranded().scalar_subquery()))
                                     .values(complete_by=now, updated_at=now).returning(runs.c.id)).scalars())
        for run_id in ids:
            self.operator_event(run_id, None, "repair", by, "live with nothing due: handed to the Supervisor")
        return ids

    def set_paused(self, run: RunRow, paused_by: str | None) -> bool:
        """Pause (``paused_by`` set) or resume (None) a pending or processing run."""
        condition = runs.c.paused_by.is_(None) if paused_by is not None else runs.c.paused_by.is_not(None)
        result = self.conn.execute(
            update(runs)
            .where(runs.c.id == run.id, run_in(RunState.PENDING.value, RunState.PROCESSING.value), condition)
            .values(paused_by=paused_by, updated_at=db_now())
        )
        return bool(result.rowcount == 1)
