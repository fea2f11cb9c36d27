"""Child runs: a step that starts another workflow's run and waits for it. The step runs (with no
complete-by of its own: the child is supervised like any run) until its child ends; then it
completes with the child's results, or fails."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, select, update

from sas_app.states import TERMINAL_RUN_STATES, StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import RunRow, StepRow, as_row
from sas_app.store.steps import StepTx
from sas_app.store.tables import runs, steps
from sas_app.store.transitions import Part, TxBase


def child_key(run_id: str, step: str, attempt: int) -> str:
    """The business key of the child run a step's attempt starts (unique per workflow)."""
    return f"{run_id}:{step}:{attempt}"


class ChildTx(Part):
    def __init__(self, tx: TxBase, steps: StepTx) -> None:
        super().__init__(tx)
        self.steps = steps

    def start_child_step(self, step: StepRow, child_run_id: str, actor: str) -> StepRow | None:
        """The step (waiting) → running at its next attempt, its child run named in the event."""
        row = self.conn.execute(
            update(steps)
            .where(steps.c.id == step.id, steps.c.state == step.state, steps.c.attempt == step.attempt)
            .values(state=StepState.RUNNING.value, attempt=steps.c.attempt + 1, locked_by=actor, complete_by=None,
                    not_before=None, updated_at=db_now())
            .returning(*steps.c)
        ).first()
        started = None if row is None else as_row(StepRow, row)
        if started is not None:
            self.tx.transition(step.run_id, step.position, step.state, StepState.RUNNING, attempt=started.attempt,
                               actor=actor, detail={"child": child_run_id})
        return started

    def finish_child_step(self, step: StepRow, child: RunRow, result: Any, actor: str) -> bool:
        """The child was processed: the step completes with its results."""
        return self.steps.move_step(step, StepState.COMPLETED, actor=actor, detail={"child": child.id},
                                    result=result,
                                    locked_by=None, completed_at=db_now()) is not None

    def children_of(self, run_id: str) -> list[RunRow]:
        rows = self.conn.execute(select(runs).where(runs.c.parent_run_id == run_id).order_by(runs.c.created_at))
        return [as_row(RunRow, r) for r in rows]

    def children_ended(self, older_than: float, limit: int) -> list[str]:
        """Runs with a step still waiting for a child that ended more than ``older_than`` seconds
        ago: the message that should have told them was lost (the Supervisor asks again). Read
        from the steps running with no complete-by (a partial index: a child's step has none)."""
        rows = self.conn.execute(
            select(steps.c.run_id).distinct()
            .join(runs, and_(runs.c.parent_run_id == steps.c.run_id, runs.c.parent_position == steps.c.position))
            .where(steps.c.child.is_not(None), steps.c.state == StepState.RUNNING.value, steps.c.complete_by.is_(None),
                   runs.c.process_state.in_(TERMINAL_RUN_STATES), runs.c.updated_at < db_now() - older_than)
            .limit(limit)
        )
        return [run_id for (run_id,) in rows]
