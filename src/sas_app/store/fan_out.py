"""A ``for_each`` step's transitions: it starts by writing one branch row per element (each
dispatched and supervised like a step, with its own attempts, complete-by and idempotency key),
completes with their results once every branch has (a step that cannot fan out is refused before
any is written: :meth:`StepTx.refuse_step`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert

from sas_app.messaging.routing import branch_key
from sas_app.states import StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import RunRow, StepRow
from sas_app.store.steps import StepTx
from sas_app.store.tables import steps
from sas_app.store.transitions import Part, TxBase


class FanOutTx(Part):
    def __init__(self, tx: TxBase, steps: StepTx) -> None:
        super().__init__(tx)
        self.steps = steps

    def start_fan_out(self, parent: StepRow, items: Sequence[Any], first_free: int, actor: str) -> bool:
        """``parent`` (waiting) → running, with a not_started branch per element of ``items`` from
        position ``first_free`` on. The parent itself has no complete-by: its branches do."""
        if self.steps.move_step(parent, StepState.RUNNING, actor=actor, detail={"branches": len(items)},
                                locked_by=None, complete_by=None, not_before=None) is None:
            return False
        if items:
            now = db_now()
            self.conn.execute(insert(steps).values(created_at=now, updated_at=now), [
                {"run_id": parent.run_id, "position": first_free + index, "name": f"{parent.name}[{index}]",
                 "agent": parent.agent, "action": parent.action, "state": StepState.NOT_STARTED.value,
                 "attempt": 0, "timeout": parent.timeout, "max_failures": parent.max_failures, "failure_count": 0,
                 "idempotency_key": branch_key(parent.idempotency_key, index), "undo": parent.undo,
                 "branch_of": parent.position, "branch": index, "item": item, "escalate": parent.escalate,
                 "escalated": 0}
                for index, item in enumerate(items)
            ])
        return True

    def complete_fan_out(self, run: RunRow, parent: StepRow, results: list[Any], actor: str) -> bool:
        """Every branch completed: the ``for_each`` step completes with their results, in order."""
        if self.steps.move_step(parent, StepState.COMPLETED, actor=actor, result=results,
                                completed_at=db_now()) is None:
            return False
        if run.reply_to is not None:
            self.tx.notify(run.id, run.reply_to, run.business_key, run.workflow, "step_completed", step=parent.name,
                           position=parent.position, attempt=parent.attempt)
        return True
