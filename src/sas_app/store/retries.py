"""The Scheduler's side of a batch the Supervisor recovered: the steps it put back to pending,
dispatched again together — one statement for the batch instead of a transaction per run, so that
a fleet's worth of expired steps is running again within seconds (``bench/recovery.py``).

Only the plain case is taken here: a straight-line run, processing and not paused, whose step
is an agent call that ran before (a retry, or a deferral) and whose back-off is over. Anything
else is left for the Scheduler's full planning of that run.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, update

from sas_app.states import RunState, StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import RunRow, StepRow, as_row
from sas_app.store.steps import StepTx
from sas_app.store.tables import runs, steps
from sas_app.store.transitions import Part, TxBase, run_in

#: a restarted step, its run, and all of the run's steps (what its agent is told comes from them)
Restarted = tuple[RunRow, StepRow, list[StepRow]]


class RetryTx(Part):
    def __init__(self, tx: TxBase, steps: StepTx) -> None:
        super().__init__(tx)
        self.steps = steps

    def restart_retries(self, run_ids: Sequence[str], locked_by: str) -> list[Restarted]:
        """For each plain run among ``run_ids`` (see above) not locked by another transaction: its
        retried step pending → running with ``attempt + 1`` (fenced on the state and the
        back-off), the run locked until commit. Runs not in the answer need the full planning."""
        if not run_ids:
            return []
        locked = {row.id: as_row(RunRow, row) for row in self.conn.execute(
            select(runs)
            .where(runs.c.id.in_(list(run_ids)), run_in(RunState.PROCESSING.value),
                   runs.c.paused_by.is_(None), runs.c.linear.is_(True))
            .with_for_update(skip_locked=True)
        )}
        if not locked:
            return []
        now = db_now()
        rows = self.conn.execute(
            update(steps)
            .where(steps.c.run_id.in_(list(locked)), steps.c.state == StepState.PENDING.value, steps.c.attempt > 0,
                   steps.c.compensates.is_(None), steps.c.for_each.is_(None), steps.c.branch_of.is_(None),
                   steps.c.child.is_(None), steps.c.sleep.is_(None), steps.c.sleep_until.is_(None),
                   steps.c.event.is_(None), (steps.c.not_before.is_(None)) | (steps.c.not_before <= now))
            .values(state=StepState.RUNNING.value, attempt=steps.c.attempt + 1, locked_by=locked_by,
                    complete_by=now + steps.c.timeout, not_before=None, updated_at=now)
            .returning(*steps.c)
        ).all()
        running = [step for step in (self.steps.dispatched(row, locked_by) for row in rows) if step is not None]
        if not running:
            return []
        of_run: dict[str, list[StepRow]] = {}
        for row in self.conn.execute(select(steps).where(steps.c.run_id.in_([s.run_id for s in running]))
                                     .order_by(steps.c.run_id, steps.c.position)):
            of_run.setdefault(row.run_id, []).append(as_row(StepRow, row))
        return [(locked[step.run_id], step, of_run[step.run_id]) for step in running]
