"""A ``for_each`` step's transitions: it starts by writing one branch row per element (each
dispatched and supervised like a step, with its own attempts, complete-by and idempotency key),
completes with their results once every branch has, or fails before writing any when its list
cannot be had."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert

from ..routing import branch_key
from ..states import StepState
from .engine import db_now
from .rows import RunRow, StepRow
from .tables import steps
from .transitions import TxBase


class FanOutTx(TxBase):
    def start_fan_out(self, parent: StepRow, items: Sequence[Any], first_free: int, actor: str) -> bool:
        """``parent`` (waiting) → running, with a not_started branch per element of ``items`` from
        position ``first_free`` on. The parent itself has no complete-by: its branches do."""
        won = self.update_step(parent.run_id, parent.position, parent.attempt, parent.state, StepState.RUNNING,
                               locked_by=None, complete_by=None, not_before=None)
        if won is None:
            return False
        self.transition(parent.run_id, parent.position, parent.state, StepState.RUNNING, attempt=parent.attempt,
                        actor=actor, detail={"branches": len(items)})
        if items:
            now = db_now()
            self.conn.execute(insert(steps).values(created_at=now, updated_at=now), [
                {"run_id": parent.run_id, "position": first_free + index, "name": f"{parent.name}[{index}]",
                 "agent": parent.agent, "action": parent.action, "state": StepState.NOT_STARTED.value,
                 "attempt": 0, "timeout": parent.timeout, "max_failures": parent.max_failures, "failure_count": 0,
                 "idempotency_key": branch_key(parent.idempotency_key, index), "undo": parent.undo,
                 "branch_of": parent.position, "branch": index, "item": item}
                for index, item in enumerate(items)
            ])
        return True

    def complete_fan_out(self, run: RunRow, parent: StepRow, results: list[Any], actor: str) -> bool:
        """Every branch completed: the ``for_each`` step completes with their results, in order."""
        won = self.update_step(parent.run_id, parent.position, parent.attempt, StepState.RUNNING,
                               StepState.COMPLETED, result=results, completed_at=db_now())
        if won is None:
            return False
        self.transition(parent.run_id, parent.position, StepState.RUNNING, StepState.COMPLETED,
                        attempt=parent.attempt, actor=actor)
        if run.reply_to is not None:
            self.notify(run.id, run.reply_to, run.business_key, run.workflow, "step_completed", step=parent.name,
                        position=parent.position, attempt=parent.attempt)
        return True

    def refuse_step(self, step: StepRow, reason: str, actor: str) -> StepRow | None:
        """A waiting step that cannot start (its list is missing or too long, its action is not in
        the deployed code) fails at once, before anything is dispatched."""
        failed = self.update_step(step.run_id, step.position, step.attempt, step.state, StepState.FAILED,
                                  error=reason, locked_by=None, complete_by=None)
        if failed is not None:
            self.transition(step.run_id, step.position, step.state, StepState.FAILED, attempt=step.attempt,
                            actor=actor, detail={"error": reason})
        return failed
