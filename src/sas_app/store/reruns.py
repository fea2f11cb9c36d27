"""Rerunning a run after a fix (``tx.reruns``): the new run's steps before the step it reruns
from carry the old run's outcome (its result and idempotency key: an undo of the new run undoes
the effect the old one applied), and the old run names its rerun, once."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update

from sas_app.states import StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import StepRow
from sas_app.store.tables import runs, steps
from sas_app.store.transitions import Part


class RerunTx(Part):
    def claim_rerun(self, old_id: str, new_id: str) -> bool:
        """Mark ``old_id`` as rerun as ``new_id``; False when it has a rerun already (fenced)."""
        won = self.conn.execute(update(runs).where(runs.c.id == old_id, runs.c.rerun_as.is_(None))
                                .values(rerun_as=new_id, updated_at=db_now()))
        return bool(won.rowcount == 1)

    def carry_over(self, run_id: str, carried: Sequence[tuple[int, StepRow]], old_id: str, actor: str) -> None:
        """Each ``(position, old step)``: the new run's step at ``position``, not started, takes the
        old step's outcome — completed with its result and idempotency key, or skipped with its
        reason — with an event naming the run it came from."""
        now = db_now()
        for position, old in carried:
            self.conn.execute(
                update(steps)
                .where(steps.c.run_id == run_id, steps.c.position == position,
                       steps.c.state == StepState.NOT_STARTED.value)
                .values(state=old.state, result=old.result, error=old.error, idempotency_key=old.idempotency_key,
                        completed_at=now if old.state == StepState.COMPLETED else None, updated_at=now)
            )
            self.tx.transition(run_id, position, StepState.NOT_STARTED, old.state, actor=actor,
                               detail={"carried_over_from": old_id})
