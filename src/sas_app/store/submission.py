"""Writing a new run: the run row (deduplicated on its workflow and business key), its steps — a
copy of its workflow's graph — its first event and its "received" notification. The client does it
in a transaction of its own; the planner does it for a child run inside its parent's.

On PostgreSQL a straight line submitted by a process that starts it too (SAS_INLINE_REPLIES) is
written already started, in one statement (:meth:`SubmissionTx.insert_started_run`): the run
claimed, its first step running, and the three events the step-by-step path writes — the same rows
as :meth:`SubmissionTx.insert_run` followed by the Scheduler's claim, in one round trip instead of four."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Double, bindparam, insert, select, text, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB

from sas_app.states import EventKind, RunState, StepState
from sas_app.store.connection import PG_NOW, db_now
from sas_app.store.prepared import PREPARE, PREPARED, rows
from sas_app.store.recordset import ROWS, insert_from_json, recordset, rows_parameter
from sas_app.store.rows import NewStep, RunRow, StepRow, as_row, field_names, prefixed, prefixed_columns
from sas_app.store.tables import runs, steps
from sas_app.store.transitions import Part


def _insert_run(insert_fn: Any) -> Any:
    return (
        insert_fn(runs)
        .values(
            id=bindparam("b_id"), workflow=bindparam("b_workflow"), business_key=bindparam("b_business_key"),
            payload=bindparam("b_payload", type_=runs.c.payload.type), process_state=RunState.PENDING.value,
            reply_to=bindparam("b_reply_to"), priority=bindparam("b_priority"),
            version=bindparam("b_version"), linear=bindparam("b_linear"),
            parent_run_id=bindparam("b_parent_run_id"), parent_position=bindparam("b_parent_position"),
            depth=bindparam("b_depth"),
            deadline=db_now() + bindparam("b_deadline", type_=Double()),
            slot=bindparam("b_slot"), max_running=bindparam("b_max_running"), schedule=bindparam("b_schedule"),
            rerun_of=bindparam("b_rerun_of"), rerun_from=bindparam("b_rerun_from"),
            complete_by=db_now() + bindparam("b_pickup", type_=Double()), failure_count=0,
            created_at=db_now(), updated_at=db_now(),
        )
        .on_conflict_do_nothing(index_elements=["workflow", "business_key"])
        .returning(*runs.c)
        .execution_options(**PREPARED)
    )


_INSERT_RUN = {"postgresql": _insert_run(postgresql.insert), "sqlite": _insert_run(sqlite.insert)}
# many runs in one statement (of a size that varies: not prepared)
_INSERT_RUNS = {name: statement.execution_options(**{PREPARE: False}) for name, statement in _INSERT_RUN.items()}
_INSERT_STEPS = insert(steps).values(created_at=db_now(), updated_at=db_now(), state=StepState.NOT_STARTED.value)
_STEP_COLUMNS = ("run_id", "position", "name", "agent", "action", "timeout", "max_failures", "idempotency_key",
                 "undo", "attempt", "failure_count", "waits_for", "for_each", "max_parallel", "child", "sleep",
                 "sleep_until", "event", "on_timeout", "escalate", "escalated", "condition", "poll",
                 "polls")
_INSERT_STEPS_JSON = insert_from_json(steps, _STEP_COLUMNS, {
    "created_at": PG_NOW, "updated_at": PG_NOW, "state": f"'{StepState.NOT_STARTED}'"})


_RUN_COLUMNS, _STEP_ROW_COLUMNS = field_names(RunRow), field_names(StepRow)
_RUNNING, _NOT_STARTED = StepState.RUNNING.value, StepState.NOT_STARTED.value
_PENDING, _PROCESSING = RunState.PENDING.value, RunState.PROCESSING.value
_TRANSITION = EventKind.TRANSITION.value
_FIRST = {"attempt": "CASE WHEN r.position = 0 THEN r.attempt + 1 ELSE r.attempt END"}

# The run inserted claimed (processing, locked, no pickup deadline) and its first step inserted
# running at attempt 1 — where insert_run and the claim (hot_path.START_NEW_RUN) leave them — with
# the run's "received", its claim and its first dispatch as events, in that order. Nothing is
# written when the business key is taken (no row comes back).
INSERT_STARTED_RUN = text(f"""
WITH run AS (
    INSERT INTO runs (id, workflow, business_key, payload, process_state, reply_to, priority, version, linear,
                      parent_run_id, parent_position, depth, deadline, slot, max_running, schedule, rerun_of,
                      rerun_from, locked_by, complete_by, failure_count, created_at, updated_at)
    VALUES (:b_id, :b_workflow, :b_business_key, :b_payload, '{_PROCESSING}', :b_reply_to, :b_priority,
            :b_version, :b_linear, :b_parent_run_id, :b_parent_position, :b_depth, {PG_NOW} + :b_deadline,
            :b_slot, :b_max_running, :b_schedule, :b_rerun_of, :b_rerun_from, :b_locked_by, NULL, 0,
            {PG_NOW}, {PG_NOW})
    ON CONFLICT (workflow, business_key) DO NOTHING
    RETURNING *
), st AS (
    INSERT INTO steps ({", ".join(_STEP_COLUMNS)}, state, locked_by, complete_by, created_at, updated_at)
    SELECT {", ".join(_FIRST.get(c, f"r.{c}") for c in _STEP_COLUMNS)},
           CASE WHEN r.position = 0 THEN '{_RUNNING}' ELSE '{_NOT_STARTED}' END,
           CASE WHEN r.position = 0 THEN :b_locked_by END,
           CASE WHEN r.position = 0 THEN {PG_NOW} + r.timeout END, {PG_NOW}, {PG_NOW}
    FROM {recordset(steps, _STEP_COLUMNS)}
    WHERE EXISTS (SELECT 1 FROM run)
    ORDER BY e.n
    RETURNING steps.*
), ev AS (
    INSERT INTO events (run_id, position, kind, from_state, to_state, attempt, actor, detail, at)
    SELECT id, NULL::integer, '{_TRANSITION}', NULL::text, '{_PENDING}', NULL::integer, NULL::text, :b_received,
           {PG_NOW}
    FROM run
    UNION ALL
    SELECT id, NULL, '{_TRANSITION}', '{_PENDING}', '{_PROCESSING}', NULL, :b_locked_by, NULL, {PG_NOW} FROM run
    UNION ALL
    SELECT run_id, 0, '{_TRANSITION}', '{_NOT_STARTED}', '{_RUNNING}', attempt, :b_locked_by,
           jsonb_build_object('complete_by', complete_by), {PG_NOW}
    FROM st WHERE position = 0
)
SELECT {", ".join(f"r.{c} AS r_{c}" for c in _RUN_COLUMNS)},
       {", ".join(f"n.{c} AS n_{c}" for c in _STEP_ROW_COLUMNS)}
FROM run r LEFT JOIN st n ON n.position = 0
""").bindparams(
    bindparam("b_payload", type_=runs.c.payload.type), bindparam("b_received", type_=JSONB),
    bindparam("b_deadline", type_=Double()), bindparam(ROWS, type_=JSONB),
).columns(*prefixed_columns(runs, "r_", _RUN_COLUMNS), *prefixed_columns(steps, "n_", _STEP_ROW_COLUMNS)
          ).execution_options(**PREPARED)


@dataclass(frozen=True)
class NewRun:
    """A run to write: what its submitter (or its parent) gave."""

    run_id: str
    workflow: str
    business_key: str
    payload: Any
    steps: Sequence[NewStep]
    reply_to: str | None = None
    priority: int = 5
    version: str | None = None
    linear: bool = True
    #: a child run: the run, and the position of the step, that started it
    parent_run_id: str | None = None
    parent_position: int | None = None
    depth: int = 0
    #: seconds from now by which the run must have ended, if it must
    deadline: float | None = None
    #: its concurrency key's value, and how many runs with it may be live at once
    slot: str | None = None
    max_running: int | None = None
    #: the schedule that started it
    schedule: str | None = None
    #: a rerun: the run it reruns, and the step it reruns from
    rerun_of: str | None = None
    rerun_from: str | None = None


def starts_in_one_statement(new: NewRun) -> bool:
    """Whether PostgreSQL writes ``new`` already started in one statement
    (:meth:`SubmissionTx.insert_started_run`): a straight line with no concurrency key, reply
    queue or parent, whose statement writes all there is to write."""
    return bool(new.linear and new.steps and new.slot is None and new.reply_to is None and new.parent_run_id is None)


class SubmissionTx(Part):
    def insert_run(self, new: NewRun, pickup_timeout: float) -> tuple[RunRow, bool]:
        """Write ``new`` pending, to be picked up within ``pickup_timeout``. Returns ``(run,
        created)``; when its workflow already has a run for this business key nothing is written
        and that run is returned."""
        found = rows(self.conn, _INSERT_RUN[self.conn.dialect.name], _run_values(new, pickup_timeout))
        if not found:
            return self._existing(new), False
        self._written([new])
        return as_row(RunRow, found[0]), True

    def insert_started_run(self, new: NewRun, locked_by: str) -> tuple[RunRow, StepRow | None, bool] | None:
        """On PostgreSQL, ``new`` written already claimed by ``locked_by`` with its first step
        running (:data:`INSERT_STARTED_RUN`): ``(run, first step, created)``; when its workflow
        already has a run for this business key nothing is written and that run is returned, with
        no step. None when ``new`` is not a straight line the statement starts the way the
        Scheduler would — a concurrency key, a reply queue, a child run, a step-by-step store — and
        :meth:`insert_run` must write it."""
        if not (self.tx.is_postgresql and starts_in_one_statement(new)):
            return None
        received: dict[str, Any] = {"business_key": new.business_key}
        found = rows(self.conn, INSERT_STARTED_RUN, {
            **{k: v for k, v in _run_values(new, 0.0).items() if k != "b_pickup"}, "b_locked_by": locked_by,
            "b_received": received,
            **rows_parameter([_step_values(new.run_id, position, s) for position, s in enumerate(new.steps)]),
        })
        if not found:
            return self._existing(new), None, False
        first = None if found[0]["n_id"] is None else prefixed(StepRow, found[0], "n_")
        return prefixed(RunRow, found[0], "r_"), first, True

    def _existing(self, new: NewRun) -> RunRow:
        """The run that already holds ``new``'s workflow and business key."""
        existing = self.conn.execute(
            select(runs).where(runs.c.workflow == new.workflow, runs.c.business_key == new.business_key)
        ).one()
        return as_row(RunRow, existing)

    def insert_runs(self, news: Sequence[NewRun], pickup_timeout: float) -> dict[tuple[str, str], tuple[RunRow, bool]]:
        """:meth:`insert_run` for many runs (of distinct workflow and business key) in a few
        statements: ``(workflow, business_key) -> (run, created)``."""
        if not news:
            return {}
        inserted = self.conn.execute(_INSERT_RUNS[self.conn.dialect.name],
                                     [_run_values(new, pickup_timeout) for new in news]).all()
        out = {(r.workflow, r.business_key): (as_row(RunRow, r), True) for r in inserted}
        missing = [(n.workflow, n.business_key) for n in news if (n.workflow, n.business_key) not in out]
        for start in range(0, len(missing), 500):
            for r in self.conn.execute(select(runs).where(
                    tuple_(runs.c.workflow, runs.c.business_key).in_(missing[start:start + 500]))):
                out[(r.workflow, r.business_key)] = (as_row(RunRow, r), False)
        self._written([n for n in news if out[(n.workflow, n.business_key)][1]])
        return out

    def _written(self, news: Sequence[NewRun]) -> None:
        """The steps, first event and "received" notification of runs just inserted."""
        if not news:
            return
        step_rows = [_step_values(new.run_id, position, s) for new in news for position, s in enumerate(new.steps)]
        if self.tx.is_postgresql:
            rows(self.conn, _INSERT_STEPS_JSON, rows_parameter(step_rows))
        else:
            self.conn.execute(_INSERT_STEPS, step_rows)
        for new in news:
            detail: dict[str, Any] = {"business_key": new.business_key}
            if new.parent_run_id is not None:
                detail["parent"] = new.parent_run_id
            self.tx.transition(new.run_id, None, None, RunState.PENDING, detail=detail)
            if new.reply_to is not None:
                self.tx.notify(new.run_id, new.reply_to, new.business_key, new.workflow, "received",
                               state=RunState.PENDING)


def _run_values(new: NewRun, pickup_timeout: float) -> dict[str, Any]:
    return {
        "b_id": new.run_id, "b_workflow": new.workflow, "b_business_key": new.business_key,
        "b_payload": new.payload, "b_reply_to": new.reply_to, "b_priority": new.priority,
        "b_pickup": pickup_timeout, "b_version": new.version, "b_linear": new.linear,
        "b_parent_run_id": new.parent_run_id, "b_parent_position": new.parent_position, "b_depth": new.depth,
        "b_deadline": new.deadline, "b_slot": new.slot, "b_max_running": new.max_running,
        "b_schedule": new.schedule, "b_rerun_of": new.rerun_of, "b_rerun_from": new.rerun_from,
    }


def _step_values(run_id: str, position: int, s: NewStep) -> dict[str, Any]:
    """A step's row, keyed by :data:`_STEP_COLUMNS` (what PostgreSQL's statement reads of it)."""
    return dict(zip(_STEP_COLUMNS, (
        run_id, position, s.name, s.agent, s.action, s.timeout, s.max_failures, s.idempotency_key, s.undo,
        0, 0, s.waits_for, s.for_each, s.max_parallel, s.child, s.sleep, s.sleep_until, s.event, s.on_timeout,
        s.escalate, 0, s.condition, s.poll, 0), strict=True))
