"""Undoing a run: the transitions that start compensation and record each step undone.

Which steps get undone is the recovery policy's choice (:func:`sas_app.engine.recovery.undoable`); here
the run goes to ``compensating`` and each of those steps gets a compensation row of its own
(``undo:<step>``), dispatched and supervised exactly like a step, last step first. Every other
step still under way (a parallel branch with nothing to undo, a ``for_each`` step whose branches
are being undone) stops: a late reply from it is fenced out, and nothing retries it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert, select, update

from sas_app.messaging.routing import undo_key
from sas_app.states import RunState, StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import RunRow, StepRow
from sas_app.store.runs import RunTx
from sas_app.store.steps import StepTx
from sas_app.store.tables import steps
from sas_app.store.transitions import Part, TxBase


class CompensationTx(Part):
    def __init__(self, tx: TxBase, runs: RunTx, steps: StepTx) -> None:
        super().__init__(tx)
        self.runs = runs
        self.steps = steps

    def start_compensation(self, run: RunRow, undo: Sequence[StepRow], reason: str, pickup_timeout: float, *,
                           actor: str, first_free: int, cancelled_by: str | None = None) -> bool:
        """``run.process_state`` → compensating, with one pending compensation row per step in
        ``undo`` (in that order, from position ``first_free`` on). False (nothing changed) when
        there is nothing to undo or the run moved on."""
        if not undo:
            return False
        values: dict[str, Any] = {"error": reason, "complete_by": None}
        if cancelled_by is not None:
            values["cancelled_by"] = cancelled_by
        if not self.runs.update_run(run.id, run.process_state, RunState.COMPENSATING, **values):
            return False
        self.tx.transition(run.id, None, run.process_state, RunState.COMPENSATING, actor=actor,
                           detail={"reason": reason, "undo": [s.name for s in undo]})
        now = db_now()
        for offset, step in enumerate(undo):
            self.steps.update_step(run.id, step.position, step.attempt, step.state, StepState.COMPENSATING)
            self.tx.transition(run.id, step.position, step.state, StepState.COMPENSATING, attempt=step.attempt,
                               actor=actor)
            agent, _, action = (step.undo or "").partition(".")
            self.conn.execute(insert(steps).values(
                run_id=run.id, position=first_free + offset, name=f"undo:{step.name}", agent=agent, action=action,
                state=StepState.PENDING.value, attempt=0, complete_by=now + pickup_timeout, timeout=step.timeout,
                max_failures=step.max_failures, failure_count=0, idempotency_key=undo_key(step.idempotency_key),
                compensates=step.position, created_at=now, updated_at=now,
            ))
        self.stop_live_steps(run.id, actor)
        return True

    def stop_live_steps(self, run_id: str, actor: str) -> None:
        """Running or waiting workflow steps of a run being undone (not those being undone: they
        are ``compensating`` by now) → stopped."""
        live = (StepState.RUNNING.value, StepState.PENDING.value)
        found = self.conn.execute(
            select(steps.c.position, steps.c.state, steps.c.attempt)
            .where(steps.c.run_id == run_id, steps.c.compensates.is_(None), steps.c.state.in_(live))
        ).all()
        if not found:
            return
        self.conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.compensates.is_(None), steps.c.state.in_(live))
            .values(state=StepState.STOPPED.value, locked_by=None, complete_by=None, updated_at=db_now())
        )
        for position, state, attempt in found:
            self.tx.transition(run_id, position, state, StepState.STOPPED, attempt=attempt, actor=actor)

    def mark_compensated(self, run_id: str, position: int, actor: str) -> None:
        """The step at ``position`` has been undone: compensating → compensated."""
        result = self.conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.position == position,
                   steps.c.state == StepState.COMPENSATING.value)
            .values(state=StepState.COMPENSATED.value, updated_at=db_now())
        )
        if result.rowcount == 1:
            self.tx.transition(run_id, position, StepState.COMPENSATING, StepState.COMPENSATED, actor=actor)
