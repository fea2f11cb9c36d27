"""The transitions of a run (``tx.runs``): lock it, claim it, move it from one state to the next
(fenced on the state it was read in), ask the Scheduler about it, and what follows its end."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.engine import Row

from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance
from sas_app.states import LIVE_RUN_STATES, TERMINAL_RUN_STATES, RunState
from sas_app.store.connection import db_now
from sas_app.store.prepared import PREPARED
from sas_app.store.rows import RunRow, as_row
from sas_app.store.tables import runs
from sas_app.store.transitions import RUN_DONE_CHANNEL, Part, run_in

# The hot path's statements, built once and executed with fresh parameters (prepared on
# PostgreSQL: sas_app.store.prepared).
LOCK_RUN = select(runs).where(runs.c.id == bindparam("b_run_id")).with_for_update().execution_options(**PREPARED)
# pending → processing, in the statement that also locks the run: a new run's claim is one round trip.
_CLAIM = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"), run_in(RunState.PENDING.value))
    .values(process_state=RunState.PROCESSING.value, locked_by=bindparam("b_locked_by"), complete_by=None,
            updated_at=db_now())
    .returning(*runs.c)
    .execution_options(**PREPARED)
)
#: a run with no concurrency key (one with a key claims its slot first: sas_app.store.slots)
CLAIM_RUN = _CLAIM.where(runs.c.slot.is_(None))
CLAIM_SLOT_RUN = _CLAIM.values(slot_since=db_now())



class RunTx(Part):
    """A run's transitions, inside one transaction. Each returns whether this caller won the row."""

    def lock_run(self, run_id: str) -> RunRow | None:
        """Read the run and hold its row until commit (PostgreSQL), so that every transition of
        one run is serialised; on SQLite the whole write transaction already is."""
        row = self.conn.execute(LOCK_RUN, {"b_run_id": run_id}).first()
        return None if row is None else as_row(RunRow, row)

    def claim_pending_run(self, run_id: str, locked_by: str) -> RunRow | None:
        """pending → processing, locking the run, in one statement; None if it was not pending."""
        return self.claimed(self.conn.execute(CLAIM_RUN, {"b_run_id": run_id, "b_locked_by": locked_by}).first(),
                            locked_by)

    def claimed(self, row: Row[Any] | RunRow | None, locked_by: str) -> RunRow | None:
        """A claim's row, with its event and notification."""
        if row is None:
            return None
        run = row if isinstance(row, RunRow) else as_row(RunRow, row)
        run_id = run.id
        self.tx.transition(run_id, None, RunState.PENDING, RunState.PROCESSING, actor=locked_by)
        if run.reply_to is not None:
            self.tx.notify(run_id, run.reply_to, run.business_key, run.workflow, RunState.PROCESSING,
                           state=RunState.PROCESSING)
        return run

    def finish_run(self, run_id: str, to_state: str, *, from_state: str = RunState.PROCESSING,
                   actor: str | None = None, error: str | None = None, failure_count: int | None = None,
                   **extra: Any) -> bool:
        """processing → processed | error (or any ``from_state`` → ``to_state``)."""
        values: dict[str, Any] = {"locked_by": None, "complete_by": None, **extra}
        if error is not None:
            values["error"] = error
        if failure_count is not None:
            values["failure_count"] = failure_count
        won = self.update_run(run_id, from_state, to_state, **values)
        if won:
            self.tx.transition(run_id, None, from_state, to_state, actor=actor,
                               detail={"error": error} if error else None)
        return won

    def ask(self, run_id: str, why: Publish, pickup_timeout: float) -> Advance:
        """The Scheduler's message about a run this transaction leaves with nothing else due (an
        operator resumed it, marked a step done, a signal was kept for it): unless it has one, the
        run gets a complete-by ``pickup_timeout`` from now, which the sweep finds if the message is
        lost and the Scheduler clears when it looks at the run (:meth:`looked_at`)."""
        now = db_now()
        self.conn.execute(update(runs).where(runs.c.id == run_id, run_in(RunState.PENDING.value, *LIVE_RUN_STATES))
                          .values(complete_by=func.coalesce(runs.c.complete_by, now + pickup_timeout),
                                  updated_at=now))
        return Advance(run_id, why)

    def looked_at(self, run: RunRow) -> None:
        """The Scheduler has looked at a live run it was asked about (:meth:`ask`): its
        complete-by is cleared. A pending run's is its pick-up time, which its claim clears."""
        if run.complete_by is not None and run.process_state in LIVE_RUN_STATES:
            self.conn.execute(update(runs).where(runs.c.id == run.id, run_in(*LIVE_RUN_STATES))
                              .values(complete_by=None))

    def count_run_failure(self, run_id: str) -> None:
        """The run's FailureCount: one more failed attempt of any of its steps."""
        self.conn.execute(update(runs).where(runs.c.id == run_id).values(failure_count=runs.c.failure_count + 1))

    def update_run(self, run_id: str, expected: str, new: str, **values: Any) -> bool:
        """``expected`` → ``new`` (fenced on the state), with its notification and, for a final
        state on PostgreSQL, the announcement :meth:`Store.listen_for_finished_runs` waits for."""
        row = self.conn.execute(
            update(runs)
            .where(runs.c.id == run_id, run_in(str(expected)))
            .values(process_state=str(new), updated_at=db_now(), **values)
            .returning(runs.c.reply_to, runs.c.business_key, runs.c.workflow, runs.c.parent_run_id, runs.c.slot)
        ).first()
        if row is None:
            return False
        if new in TERMINAL_RUN_STATES:
            self.ended(run_id, row.workflow, row.parent_run_id, row.slot)
        if row.reply_to is not None:
            self.tx.notify(run_id, row.reply_to, row.business_key, row.workflow, str(new), state=str(new))
        if new in TERMINAL_RUN_STATES and self.tx.is_postgresql:
            # Wakes every RunHandle.wait() LISTENing, when (and only if) this transaction commits.
            self.conn.execute(select(func.pg_notify(RUN_DONE_CHANNEL, run_id)))
        return True

    def ended(self, run_id: str, workflow: str, parent_run_id: str | None, slot: str | None) -> None:
        """A run has ended (in any way): its parent's Scheduler is asked about it, and the next run
        waiting for its concurrency key's slot about that, once this transaction commits."""
        if parent_run_id is not None:
            self.tx.follow_ups.append(Advance(parent_run_id, Publish.CHILD_ENDED))
        if slot is not None:
            self.tx.follow_ups += [Advance(next_id, Publish.SLOT_FREED)
                                   for next_id in self.next_in_line(workflow, slot, run_id)]

    def next_in_line(self, workflow: str, slot: str, other_than: str, limit: int = 1) -> list[str]:
        """The oldest pending runs of ``workflow`` with concurrency key ``slot`` (but ``other_than``)."""
        return list(self.conn.execute(
            select(runs.c.id)
            .where(runs.c.workflow == workflow, runs.c.slot == slot, runs.c.process_state == RunState.PENDING.value,
                   runs.c.id != other_than)
            .order_by(runs.c.created_at, runs.c.id).limit(limit)
        ).scalars())
