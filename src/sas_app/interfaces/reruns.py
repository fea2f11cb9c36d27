"""Rerunning after a fix: ``sas rerun RUN --from STEP`` (``SasApp.rerun``) starts a new run of the
run's workflow as deployed now, with the old run's payload, in which the steps ``STEP`` waits for
(directly or not) keep the outcome they had in the old run — their results, not called again — and
``STEP`` and everything else run again. The two are linked both ways (``rerun_of`` on the new run,
``rerun_as`` on the old), the old run keeps its history, and a run is rerun at most once, so a bulk
rerun sent twice starts nothing twice.

Refused with :class:`InvalidOperation`, nothing written: a run still live (cancel it first, or let
it end), a child run (rerun its parent), a run rerun already, a step the deployed workflow does
not have, a step before ``STEP`` that did not complete in the old run (it was undone, or never
ran: rerun from it instead) or that fanned out with an undo (its branches stay with the old run),
or a payload the workflow's input model or concurrency key now refuses. A run once rerun takes no
other operator action (:mod:`sas_app.interfaces.operations`): its rerun carries what it did on.
"""

from __future__ import annotations

import uuid

from sas_app.definitions.workflow import Workflow
from sas_app.errors import InvalidOperation, UnknownRun
from sas_app.interfaces.client import MAX_KEY_LENGTH, Client, RunHandle
from sas_app.states import TERMINAL_RUN_STATES, EventKind, StepState
from sas_app.store import RunRow, StepRow, Tx

#: the outcomes a step before the rerun's step may carry over
CARRIED = (StepState.COMPLETED.value, StepState.SKIPPED.value)


class Reruns:
    """Reruns start their new run as a submit does: through the :class:`Client` (its store, its
    registered workflows, and its Scheduler's first move or message)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.store = client.store
        self.workflows = client.workflows

    def rerun(self, run_id: str, from_step: str, *, by: str, reason: str = "") -> RunHandle:
        """Start the rerun of ``run_id`` from ``from_step`` (see the module's docstring); its handle."""
        if not isinstance(by, str) or not by.strip():
            raise InvalidOperation("say who reruns it (by=)")
        new_id = uuid.uuid4().hex
        with self.store.begin() as tx:
            old = tx.runs.lock_run(run_id)
            if old is None:
                raise UnknownRun(f"no run with id {run_id!r}")
            workflow = self._checked(old, from_step)
            carried = self._carried(tx, old, workflow, from_step)
            key = f"{old.business_key[:MAX_KEY_LENGTH - 15]}#rerun-{new_id[:8]}"
            try:  # its payload as the input model (and concurrency key) deployed now take it
                new = workflow.new_run(new_id, key, workflow.stored_input(old.payload), reply_to=old.reply_to,
                                       priority=old.priority, rerun_of=old.id, rerun_from=from_step)
            except ValueError as exc:
                raise InvalidOperation(f"cannot rerun run {run_id}: {exc}") from None
            if not tx.reruns.claim_rerun(old.id, new_id):  # pragma: no cover - the run's lock is held
                raise InvalidOperation(f"cannot rerun run {run_id}: it was rerun meanwhile")
            _, created = tx.submission.insert_run(new, self.client.settings.pickup_timeout)
            if not created:  # pragma: no cover - a fresh id in its key
                raise InvalidOperation(f"cannot rerun run {run_id}: business key {key!r} is taken")
            tx.reruns.carry_over(new_id, carried, old.id, by)
            detail = {"action": "rerun", "by": by, "reason": reason, "from": from_step}
            tx.event(old.id, None, EventKind.OPERATOR, None, None, actor=by, detail={**detail, "rerun_as": new_id})
            tx.event(new_id, None, EventKind.OPERATOR, None, None, actor=by, detail={**detail, "rerun_of": old.id})
            moves = self.client.first_move(tx, new_id)
        self.client.start(tx, new_id, moves)
        return RunHandle(self.client, new_id, created=True)

    def _checked(self, old: RunRow, from_step: str) -> Workflow:
        """The deployed workflow, if ``old`` may be rerun from ``from_step``."""
        what = f"cannot rerun run {old.id}"
        if old.process_state not in TERMINAL_RUN_STATES:
            raise InvalidOperation(f"{what}: it is still {old.process_state}; let it end, or cancel it first")
        if old.rerun_as is not None:
            raise InvalidOperation(f"{what}: it was rerun already, as run {old.rerun_as}")
        if old.parent_run_id is not None:
            raise InvalidOperation(f"{what}: it is a child run of run {old.parent_run_id}; rerun that one")
        workflow = self.workflows.get(old.workflow)
        if workflow is None:
            raise InvalidOperation(f"{what}: its workflow {old.workflow!r} is not deployed here")
        names = [s.name for s in workflow.specs]
        if from_step not in names:
            raise InvalidOperation(f"{what} from {from_step!r}: workflow {workflow.name!r} as deployed now has no "
                                   f"such step; its steps: {', '.join(names)}")
        return workflow

    def _carried(self, tx: Tx, old: RunRow, workflow: Workflow, from_step: str) -> list[tuple[int, StepRow]]:
        """The new run's positions before ``from_step`` and the old steps whose outcome they take."""
        position = [s.name for s in workflow.specs].index(from_step)
        before = workflow.upstream(position)
        had = {s.name: s for s in tx.steps.steps_of(old.id) if not s.is_undo and not s.is_branch}
        carried = []
        for at in sorted(before):
            name = workflow.specs[at].name
            step = had.get(name)
            if step is None or step.state not in CARRIED:
                state = "not in that run" if step is None else step.state
                raise InvalidOperation(f"cannot rerun run {old.id} from {from_step!r}: step {name!r} before it is "
                                       f"{state}, not completed; rerun from {name!r} or earlier")
            if step.for_each is not None and step.undo is not None and step.state == StepState.COMPLETED:
                # its undo goes branch by branch, and the branches stay with the old run
                raise InvalidOperation(f"cannot rerun run {old.id} from {from_step!r}: step {name!r} before it "
                                       "fanned out and has an undo, which a rerun cannot carry; rerun from "
                                       f"{name!r} or earlier")
            carried.append((at, step))
        return carried

