"""The transitions of runs and steps, inside one transaction (:class:`TxBase`).

Each is one conditional statement (``UPDATE … WHERE state = :expected AND attempt = :n``) whose
row count says whether the caller won, and each appends its row of the run's history, written
with the transaction's other events just before it commits. Nothing here sends a message:
notifications go to the ``outbox`` table and are relayed after the commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import ColumnElement, Connection, bindparam, func, insert, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row

from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance, Notification
from sas_app.states import LIVE_RUN_STATES, TERMINAL_RUN_STATES, Cause, EventKind, RunState, StepState, Word
from sas_app.store.connection import PG_NOW, db_now
from sas_app.store.prepared import PREPARED, rows
from sas_app.store.recordset import insert_from_json, rows_parameter
from sas_app.store.rows import RunRow, StepRow, as_row
from sas_app.store.tables import alerts, events, outbox, runs, steps

#: The PostgreSQL channel on which a run's id is announced when it reaches a terminal state.
RUN_DONE_CHANNEL = "sas_run_done"


def run_in(*states: str) -> ColumnElement[bool]:
    """A fence on a run's state, for a run found by its primary key (or joined on it). Written so
    that no index on the state can serve it: with statistics taken before a burst (they say no run
    is pending or live), PostgreSQL would walk every run in that state instead of the key
    (``bench/recovery.py`` measures it)."""
    return func.coalesce(runs.c.process_state, "").in_(states)


# The hot path's statements, built once and executed with fresh parameters (prepared on
# PostgreSQL: sas_app.store.prepared).
LOCK_RUN = select(runs).where(runs.c.id == bindparam("b_run_id")).with_for_update().execution_options(**PREPARED)
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
INSERT_EVENTS = insert(events).values(at=db_now())
_EVENT_COLUMNS = ("run_id", "position", "kind", "from_state", "to_state", "attempt", "actor", "detail")
INSERT_EVENTS_JSON = insert_from_json(events, _EVENT_COLUMNS, {"at": PG_NOW})
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


def plain(value: Any) -> Any:
    """An enum member as the plain string the database and the JSON bodies hold; anything else as is."""
    return str(value) if isinstance(value, Word) else value


class TxBase:
    """Transitions inside one transaction. Each returns whether this caller won the row."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        #: notifications written in this transaction, to relay once it commits
        self.outbox: list[Notification] = []
        #: runs the Scheduler is to be asked about once this commits: the parent of a child run
        #: that ended here, a child run being cancelled with its parent
        self.follow_ups: list[Advance] = []
        self._events: list[dict[str, Any]] = []

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """A part of the transaction that, if it raises, leaves nothing of itself: neither rows nor
        the events and notifications it queued (the exception goes on)."""
        marks = len(self._events), len(self.outbox), len(self.follow_ups)
        try:
            with self.conn.begin_nested():
                yield
        except BaseException:
            del self._events[marks[0]:], self.outbox[marks[1]:], self.follow_ups[marks[2]:]
            raise

    @property
    def is_postgresql(self) -> bool:
        return self.conn.dialect.name == "postgresql"

    # -- history ----------------------------------------------------------------------------

    def event(self, run_id: str, position: int | None, kind: EventKind, from_state: str | None,
              to_state: str | None, *, attempt: int | None = None, actor: str | None = None,
              detail: Any = None) -> None:
        """Append to the run's history; written with the transaction's other events, in one
        statement, just before it commits."""
        self._events.append(dict(zip(_EVENT_COLUMNS, (
            run_id, position, str(kind), plain(from_state), plain(to_state), attempt, actor, detail), strict=True)))

    def transition(self, run_id: str, position: int | None, from_state: str | None, to_state: str, *,
                   attempt: int | None = None, actor: str | None = None, detail: Any = None) -> None:
        self.event(run_id, position, EventKind.TRANSITION, from_state, to_state, attempt=attempt, actor=actor,
                   detail=detail)

    def flush_events(self) -> None:
        if self._events:
            if self.is_postgresql:
                rows(self.conn, INSERT_EVENTS_JSON, rows_parameter(self._events))
            else:
                self.conn.execute(INSERT_EVENTS, self._events)
            self._events = []

    def now(self) -> float:
        """The database's clock, in epoch seconds."""
        return float(self.conn.execute(select(db_now())).scalar_one())

    def notify(self, run_id: str, reply_to: str, business_key: str, workflow: str, kind: str,
               **detail: Any) -> Notification:
        """Write a progress notification in this transaction (relayed after the commit)."""
        body = {"run_id": run_id, "business_key": business_key, "workflow": workflow, "kind": str(kind),
                **{key: plain(value) for key, value in detail.items()}}
        notification_id = self.conn.execute(
            insert(outbox).values(run_id=run_id, reply_to=reply_to, body=body, created_at=db_now())
            .returning(outbox.c.id)
        ).scalar_one()
        note = Notification(int(notification_id), reply_to, {"id": int(notification_id), **body})
        self.outbox.append(note)
        return note

    def record_alert(self, dedup_key: str, run_id: str, position: int | None, kind: str, attempt: int | None,
                     reason: str, actor: str, detail: dict[str, Any]) -> bool:
        """Store an alert once per ``dedup_key`` (and its event); False if it was raised before."""
        dialect_insert = postgresql.insert if self.is_postgresql else sqlite.insert
        inserted = self.conn.execute(
            dialect_insert(alerts)
            .values(dedup_key=dedup_key, run_id=run_id, position=position, kind=kind, attempt=attempt,
                    reason=reason, at=db_now())
            .on_conflict_do_nothing(index_elements=["dedup_key"])
            .returning(alerts.c.id)
        ).first()
        if inserted is None:
            return False
        self.event(run_id, position, EventKind.ALERT, None, None, attempt=attempt, actor=actor, detail=detail)
        return True

    # -- runs -------------------------------------------------------------------------------

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
        self.transition(run_id, None, RunState.PENDING, RunState.PROCESSING, actor=locked_by)
        if run.reply_to is not None:
            self.notify(run_id, run.reply_to, run.business_key, run.workflow, RunState.PROCESSING,
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
            self.transition(run_id, None, from_state, to_state, actor=actor, detail={"error": error} if error else None)
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
            self.notify(run_id, row.reply_to, row.business_key, row.workflow, str(new), state=str(new))
        if new in TERMINAL_RUN_STATES and self.is_postgresql:
            # Wakes every RunHandle.wait() LISTENing, when (and only if) this transaction commits.
            self.conn.execute(select(func.pg_notify(RUN_DONE_CHANNEL, run_id)))
        return True

    def ended(self, run_id: str, workflow: str, parent_run_id: str | None, slot: str | None) -> None:
        """A run has ended (in any way): its parent's Scheduler is asked about it, and the next run
        waiting for its concurrency key's slot about that, once this transaction commits."""
        if parent_run_id is not None:
            self.follow_ups.append(Advance(parent_run_id, Publish.CHILD_ENDED))
        if slot is not None:
            self.follow_ups += [Advance(next_id, Publish.SLOT_FREED)
                                for next_id in self.next_in_line(workflow, slot, run_id)]

    def next_in_line(self, workflow: str, slot: str, other_than: str, limit: int = 1) -> list[str]:
        """The oldest pending runs of ``workflow`` with concurrency key ``slot`` (but ``other_than``)."""
        return list(self.conn.execute(
            select(runs.c.id)
            .where(runs.c.workflow == workflow, runs.c.slot == slot, runs.c.process_state == RunState.PENDING.value,
                   runs.c.id != other_than)
            .order_by(runs.c.created_at, runs.c.id).limit(limit)
        ).scalars())

    # -- steps ------------------------------------------------------------------------------

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
        self.transition(running.run_id, running.position, previous, StepState.RUNNING, attempt=running.attempt,
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
        self.transition(run_id, position, StepState.RUNNING, StepState.COMPLETED, attempt=attempt, actor=actor)
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
            self.transition(run_id, position, StepState.RUNNING, StepState.FAILED, attempt=attempt, actor=actor,
                            detail={"error": error})
        return won

    def retry_steps(self, batch: Sequence[StepRow], backoff: float, pickup_timeout: float, actor: str,
                    reason: str) -> list[StepRow]:
        """Each of ``batch`` (running: expired, or its worker died) → pending, in one statement
        fenced on each step's attempt: one more failure, LockedBy cleared, a back-off before the
        Scheduler may dispatch it again and a new complete-by for that pick-up. Returns the steps
        moved (a step that moved on meanwhile is left alone)."""
        if not batch:
            return []
        now = db_now()
        moved = [as_row(StepRow, r) for r in self.conn.execute(
            update(steps)
            .where(tuple_(steps.c.id, steps.c.attempt).in_([(s.id, s.attempt) for s in batch]),
                   steps.c.state == StepState.RUNNING.value)
            .values(state=StepState.PENDING.value, updated_at=now, failure_count=steps.c.failure_count + 1,
                    locked_by=None, not_before=now + backoff, complete_by=now + backoff + pickup_timeout)
            .returning(*steps.c)
        )]
        per_run = Counter(step.run_id for step in moved)  # parallel steps of one run: a failure each
        for failures in set(per_run.values()):
            self.conn.execute(update(runs).where(runs.c.id.in_([r for r, n in per_run.items() if n == failures]))
                              .values(failure_count=runs.c.failure_count + failures))
        for step in moved:
            self.transition(step.run_id, step.position, StepState.RUNNING, StepState.PENDING, attempt=step.attempt,
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

    def defer_step(self, run_id: str, position: int, attempt: int, delay: float, pickup_timeout: float,
                   reason: str, actor: str) -> bool:
        """running → pending for ``delay`` seconds, its failure count untouched (the agent did not
        call its service, e.g. while its circuit breaker is open)."""
        now = db_now()
        won = self.update_step(run_id, position, attempt, StepState.RUNNING, StepState.PENDING, locked_by=None,
                               not_before=now + delay, complete_by=now + delay + pickup_timeout)
        if won:
            self.transition(run_id, position, StepState.RUNNING, StepState.PENDING, attempt=attempt, actor=actor,
                            detail={"deferred": delay, "reason": Cause.DEFERRED.value, "message": reason})
        return won is not None

    def move_step(self, step: StepRow, new: str, *, actor: str, detail: Any = None, **values: Any) -> StepRow | None:
        """``step`` from the state and attempt it was read at → ``new`` (fenced), with its event."""
        moved = self.update_step(step.run_id, step.position, step.attempt, step.state, new, **values)
        if moved is not None:
            self.transition(step.run_id, step.position, step.state, new, attempt=step.attempt, actor=actor,
                            detail=detail)
        return moved

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
