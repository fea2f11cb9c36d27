"""Steps that wait in the store: a durable sleep is ``pending`` until its time (``not_before``),
with its complete-by at that same time, so the Supervisor's sweep — which asks the Scheduler
about pending steps whose complete-by has passed — wakes it on the database's clock. No message
and no worker slot is held meanwhile."""

from __future__ import annotations

from ..states import StepState
from .engine import db_now
from .rows import StepRow
from .transitions import TxBase


class WaitTx(TxBase):
    def start_sleep(self, step: StepRow, wake: float, actor: str) -> bool:
        """not_started → pending until ``wake`` (epoch seconds, the database's clock)."""
        won = self.update_step(step.run_id, step.position, step.attempt, step.state, StepState.PENDING,
                               not_before=wake, complete_by=wake, locked_by=None)
        if won is not None:
            self.transition(step.run_id, step.position, step.state, StepState.PENDING, attempt=step.attempt,
                            actor=actor, detail={"sleep_until": wake})
        return won is not None

    def wake(self, step: StepRow, actor: str) -> bool:
        """A sleep whose time has come: pending → completed."""
        won = self.update_step(step.run_id, step.position, step.attempt, StepState.PENDING, StepState.COMPLETED,
                               result={"slept_until": step.not_before}, completed_at=db_now(), complete_by=None)
        if won is not None:
            self.transition(step.run_id, step.position, StepState.PENDING, StepState.COMPLETED, attempt=step.attempt,
                            actor=actor)
        return won is not None
