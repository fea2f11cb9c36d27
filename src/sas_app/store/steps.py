"""The transitions of a step (``tx.steps``): mark it running, complete it, fail it, retry or defer
it, each fenced on the state and the attempt it was read at."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, select, tuple_, update
from sqlalchemy.engine import Row

from sas_app.states import LIVE_RUN_STATES, Cause, EventKind, StepState
from sas_app.store.connection import db_now
from sas_app.store.prepared import PREPARED, rows
from sas_app.store.rows import StepRow, as_row
from sas_app.store.tables import events, runs, steps
from sas_app.store.transitions import Part, run_in


def _running_in_a_live_run(run_id: str, position: int, attempt: int) -> tuple[Any, ...]:
    """The step at ``position`` running at ``attempt`` in a live run: an attempt the store still
    waits for (what a message taken late, or delivered a second time, is checked against)."""
    live = select(runs.c.id).where(runs.c.id == run_id, run_in(*LIVE_RUN_STATES))
    return (steps.c.run_id == run_id, steps.c.position == position, steps.c.attempt == attempt,
            steps.c.state == StepState.RUNNING.value, steps.c.run_id.in_(live.scalar_subquery()))


# The hot path's statements, built once and executed with fresh parameters (prepared on
# PostgreSQL: sas_app.store.prepared).
COMPLETE_STEP = (
    update(steps)
    .where(steps.c.run_id == bindparam("b_run_id"), steps.c.position == bindparam("b_position"),
           steps.c.state == StepState.RUNNING.value, steps.c.attempt == bindparam("b_attempt"))
    .values(state=StepState.COMPLETED.value, result=bindparam("b_result", type_=steps.c.result.type),
            locked_by=None, completed_at=db_now(), updated_at=db_now())
    .returning(*steps.c)
    .execution_options(**PREPARED)
)
MARK_NEXT_RUNNING = (
    update(steps)
    .where(steps.c.run_id == bindparam("b_run_id"), steps.c.position == bindparam("b_position"),
           steps.c.compensates.is_(None),
           steps.c.state.in_((StepState.NOT_STARTED.value, StepState.PENDING.value)),
           (steps.c.not_before.is_(None)) | (steps.c.not_before <= db_now()))
    .values(state=StepState.RUNNING.value, attempt=steps.c.attempt + 1, locked_by=bindparam("b_locked_by"),
            complete_by=db_now() + steps.c.timeout, not_before=None, updated_at=db_now())
    .returning(*steps.c)
    .execution_options(**PREPARED)
)
# A step, not_started | pending → running, fenced on its state and attempt (the planner's, for every
# step it starts: a graph's, a retry, an undo).
MARK_STEP_RUNNING = (
    update(steps)
    .where(steps.c.id == bindparam("b_id"), steps.c.state == bindparam("b_state"),
           steps.c.attempt == bindparam("b_attempt"),
           (steps.c.not_before.is_(None)) | (steps.c.not_before <= db_now()))
    .values(state=StepState.RUNNING.value, attempt=steps.c.attempt + 1, locked_by=bindparam("b_locked_by"),
            complete_by=db_now() + steps.c.timeout, not_before=None, updated_at=db_now())
    .returning(*steps.c)
    .execution_options(**PREPARED)
)
STEPS_OF = select(steps).where(steps.c.run_id == bindparam("b_run_id")).order_by(steps.c.position) \
    .execution_options(**PREPARED)


class StepTx(Part):
    """A step's transitions, inside one transaction. Each returns whether this caller won the row."""

    def steps_of(self, run_id: str) -> list[StepRow]:
        return [as_row(StepRow, row) for row in rows(self.conn, STEPS_OF, {"b_run_id": run_id})]

    def mark_step_running(self, step: StepRow, locked_by: str) -> StepRow | None:
        """not_started | pending → running with ``attempt + 1`` and ``complete_by = now + timeout``.

        Refused while a back-off (``not_before``) has not passed. Returns the step as dispatched,
        or None if another actor moved it first."""
        found = rows(self.conn, MARK_STEP_RUNNING, {"b_id": step.id, "b_state": step.state, "b_attempt": step.attempt,
                                                    "b_locked_by": locked_by})
        return self.dispatched(as_row(StepRow, found[0]) if found else None, locked_by)

    def mark_next_running(self, run_id: str, position: int, locked_by: str) -> StepRow | None:
        """The workflow step at ``position``, not_started | pending → running, without reading the
        run's other steps first. None if it is not due (or there is none)."""
        row = self.conn.execute(
            MARK_NEXT_RUNNING, {"b_run_id": run_id, "b_position": position, "b_locked_by": locked_by}
        ).first()
        return self.dispatched(row, locked_by)

    def dispatched(self, row: Row[Any] | StepRow | None, locked_by: str) -> StepRow | None:
        """The event of a step just marked running."""
        if row is None:
            return None
        running = row if isinstance(row, StepRow) else as_row(StepRow, row)
        # A first dispatch comes from not_started; any later one from pending (a retry, a deferral).
        previous = StepState.NOT_STARTED if running.attempt == 1 and not running.is_undo else StepState.PENDING
        self.tx.transition(running.run_id, running.position, previous, StepState.RUNNING, attempt=running.attempt,
                           actor=locked_by, detail={"complete_by": running.complete_by})
        return running

    def complete_step(self, run_id: str, position: int, attempt: int, result: Any,
                      actor: str | None = None) -> StepRow | None:
        """running → completed, only at the attempt that is still running (fenced)."""
        row = self.conn.execute(
            COMPLETE_STEP, {"b_run_id": run_id, "b_position": position, "b_attempt": attempt, "b_result": result}
        ).first()
        if row is None:
            return None
        self.tx.transition(run_id, position, StepState.RUNNING, StepState.COMPLETED, attempt=attempt, actor=actor)
        return as_row(StepRow, row)

    def running_step(self, run_id: str, position: int, attempt: int) -> StepRow | None:
        """The step at ``position`` if it is still running at ``attempt``."""
        row = self.conn.execute(
            select(steps).where(steps.c.run_id == run_id, steps.c.position == position,
                                steps.c.state == StepState.RUNNING.value, steps.c.attempt == attempt)
        ).first()
        return None if row is None else as_row(StepRow, row)

    def fail_step(self, run_id: str, position: int, attempt: int, error: str, *, actor: str | None = None,
                  count_failure: bool = False) -> StepRow | None:
        """running → failed (fenced), optionally counting one more failure."""
        values: dict[str, Any] = {"error": error, "locked_by": None}
        if count_failure:
            values["failure_count"] = steps.c.failure_count + 1
        won = self.update_step(run_id, position, attempt, StepState.RUNNING, StepState.FAILED, **values)
        if won:
            self.tx.transition(run_id, position, StepState.RUNNING, StepState.FAILED, attempt=attempt, actor=actor,
                               detail={"error": error})
        return won

    def retry_steps(self, batch: Sequence[StepRow], backoff: float, pickup_timeout: float, actor: str,
                    reason: str, counted: bool = True) -> list[StepRow]:
        """Each of ``batch`` (running: expired, or its worker died) → pending, in one statement
        fenced on each step's attempt: one more failure (unless not ``counted``), LockedBy cleared,
        a back-off before the Scheduler may dispatch it again and a new complete-by for that
        pick-up. Returns the steps moved (a step that moved on meanwhile is left alone)."""
        if not batch:
            return []
        now = db_now()
        moved = [as_row(StepRow, r) for r in self.conn.execute(
            update(steps)
            .where(tuple_(steps.c.id, steps.c.attempt).in_([(s.id, s.attempt) for s in batch]),
                   steps.c.state == StepState.RUNNING.value)
            .values(state=StepState.PENDING.value, updated_at=now,
                    failure_count=steps.c.failure_count + (1 if counted else 0),
                    locked_by=None, not_before=now + backoff, complete_by=now + backoff + pickup_timeout)
            .returning(*steps.c)
        )]
        # parallel steps of one run: a failure each
        per_run = Counter(step.run_id for step in moved) if counted else Counter()
        for failures in set(per_run.values()):
            self.conn.execute(update(runs).where(runs.c.id.in_([r for r, n in per_run.items() if n == failures]))
                              .values(failure_count=runs.c.failure_count + failures))
        for step in moved:
            self.tx.transition(step.run_id, step.position, StepState.RUNNING, StepState.PENDING, attempt=step.attempt,
                               actor=actor, detail={"failure_count": step.failure_count, "backoff": backoff,
                                                 "reason": reason})
        return moved

    def workers_lost(self, step: StepRow) -> int:
        """How many of ``step``'s attempts so far lost their worker (their running → pending events
        for that reason; the last one, failed, is the caller's to count)."""
        details = self.conn.execute(
            select(events.c.detail).where(events.c.run_id == step.run_id, events.c.position == step.position,
                                          events.c.kind == EventKind.TRANSITION.value,
                                          events.c.from_state == StepState.RUNNING.value,
                                          events.c.to_state == StepState.PENDING.value)
        ).scalars()
        return sum(1 for detail in details if (detail or {}).get("reason") == Cause.WORKER_LOST.value)

    def start_late(self, run_id: str, position: int, attempt: int, waited_at_most: float, actor: str) -> float | None:
        """An agent took this attempt's message late (it waited in the queue until little of its
        time was left, or past its complete-by): if the store still waits for that attempt
        (running in a live run, its complete-by not passed more than ``waited_at_most`` seconds
        ago), it gets a whole timeout from now, with a ``queued`` event, and the time it ends is
        returned; None when the attempt is no longer wanted (the message is dropped).

        The new deadline is the step's ``not_before`` (when the Supervisor looks at it again),
        not its complete-by: ``complete_by - timeout`` stays the time its message was sent, which
        is how the Supervisor tells the messages still queued from those taken (the last ones
        sent, as many as the queue holds)."""
        now = db_now()
        late = self.conn.execute(
            update(steps)
            .where(*_running_in_a_live_run(run_id, position, attempt), steps.c.complete_by >= now - waited_at_most)
            .values(not_before=now + steps.c.timeout, updated_at=now)
            .returning(steps.c.not_before)
        ).first()
        if late is None:
            return None
        self.tx.event(run_id, position, EventKind.QUEUED, None, None, attempt=attempt, actor=actor,
                      detail={"started_late": True})
        return float(late[0])

    def attempt_running(self, run_id: str, position: int, attempt: int) -> bool:
        """Whether the store still waits for this attempt: the step running at ``attempt`` in a
        live run (what a message delivered a second time is checked against)."""
        return self.conn.execute(
            select(steps.c.id).where(*_running_in_a_live_run(run_id, position, attempt))
        ).first() is not None

    def defer_step(self, run_id: str, position: int, attempt: int, delay: float, pickup_timeout: float,
                   reason: str, actor: str) -> bool:
        """running → pending for ``delay`` seconds, its failure count untouched (the agent did not
        call its service, e.g. while its circuit breaker is open)."""
        now = db_now()
        won = self.update_step(run_id, position, attempt, StepState.RUNNING, StepState.PENDING, locked_by=None,
                               not_before=now + delay, complete_by=now + delay + pickup_timeout)
        if won:
            self.tx.transition(run_id, position, StepState.RUNNING, StepState.PENDING, attempt=attempt, actor=actor,
                               detail={"deferred": delay, "reason": Cause.DEFERRED.value, "message": reason})
        return won is not None

    def poll_later(self, step: StepRow, after: float, actor: str, detail: str = "") -> StepRow | None:
        """A polling step's "not yet" (``step`` read running at its attempt): running → pending,
        waiting in the store until its next call — its ``not_before`` and complete-by, when the
        sweep asks the Scheduler about it — no failure counted, one more poll. Its first sets
        ``poll_until`` (now plus its ``max_wait``); the next call is never later than that. None
        when it moved on, or when ``poll_until`` has passed (the caller fails it)."""
        now = self.tx.now()
        until = step.poll_until if step.poll_until is not None else now + float(step.poll["max_wait"])
        if now >= until:
            return None
        wake = min(now + after, until)
        moved = self.update_step(step.run_id, step.position, step.attempt, StepState.RUNNING, StepState.PENDING,
                                 locked_by=None, not_before=wake, complete_by=wake, polls=step.polls + 1,
                                 poll_until=until)
        if moved is not None:
            self.tx.transition(step.run_id, step.position, StepState.RUNNING, StepState.PENDING, attempt=step.attempt,
                               actor=actor, detail={"not_yet": moved.polls, "next_poll": wake,
                                                    **({"message": detail} if detail else {})})
        return moved

    def move_step(self, step: StepRow, new: str, *, actor: str, detail: Any = None, **values: Any) -> StepRow | None:
        """``step`` from the state and attempt it was read at → ``new`` (fenced), with its event."""
        moved = self.update_step(step.run_id, step.position, step.attempt, step.state, new, **values)
        if moved is not None:
            self.tx.transition(step.run_id, step.position, step.state, new, attempt=step.attempt, actor=actor,
                               detail=detail)
        return moved

    def skip_step(self, step: StepRow, reason: str, actor: str) -> StepRow | None:
        """A step not taken (its condition did not hold, or every step it waits for was skipped)
        → skipped, the reason in its ``error`` and its event; nothing was or will be dispatched."""
        return self.move_step(step, StepState.SKIPPED, actor=actor, detail={"reason": reason}, error=reason,
                              locked_by=None, complete_by=None, not_before=None)

    def refuse_step(self, step: StepRow, reason: str, actor: str) -> StepRow | None:
        """A step that cannot start or go on (its list is missing or too long, its action or child
        workflow is not in the deployed code, its time is no time) fails at once, nothing dispatched."""
        return self.move_step(step, StepState.FAILED, actor=actor, detail={"error": reason}, error=reason,
                              locked_by=None, complete_by=None)

    def update_step(self, run_id: str, position: int, attempt: int, expected: str, new: str,
                    **values: Any) -> StepRow | None:
        """``expected`` → ``new``, fenced on the step's state and attempt."""
        row = self.conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.position == position, steps.c.state == str(expected),
                   steps.c.attempt == attempt)
            .values(state=str(new), updated_at=db_now(), **values)
            .returning(*steps.c)
        ).first()
        return None if row is None else as_row(StepRow, row)
