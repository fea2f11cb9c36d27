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
    def start_sleep(self, step: StepRow, wake: float, actor: str) -> StepRow | None:
        """not_started → pending until ``wake`` (epoch seconds, the database's clock)."""
        return self.move_step(step, StepState.PENDING, actor=actor, detail={"sleep_until": wake}, not_before=wake,
                              complete_by=wake, locked_by=None)

    def wake(self, step: StepRow, actor: str) -> bool:
        """A sleep whose time has come: pending → completed."""
        return self.move_step(step, StepState.COMPLETED, actor=actor, result={"slept_until": step.not_before},
                              completed_at=db_now(), complete_by=None) is not None
