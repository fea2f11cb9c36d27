"""What ``sas doctor`` reads of the store: the invariants the Supervisor keeps, each counted with an
example run — live runs with nothing due, rows left long past their due time, notifications never
relayed, attempts that left ``running`` twice — how long ago a Supervisor last swept, and when the
next thing is due.

Unlike the sweep's queries these read every live run (or a window of the history), not a partial
index of due rows: they are for an operator's command, a probe or a scrape, never for each sweep.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Select, and_, case, exists, func, literal, or_, select, union_all

from sas_app.states import LIVE_RUN_STATES, TERMINAL_RUN_STATES, EventKind, RunState, StepState
from sas_app.store.connection import db_now
from sas_app.store.history import first_event_since
from sas_app.store.service_tables import supervisors
from sas_app.store.tables import DUE_RUN_STATES, WAITING_FOR_RESUME, events, outbox, runs, steps

#: runs that are the Scheduler's or its agents' to move on (a paused run waits for an operator)
_WORKING = (RunState.PENDING.value, *LIVE_RUN_STATES)
_LIVE_STEP_STATES = (StepState.PENDING.value, StepState.RUNNING.value)
#: when the Supervisor next acts on a live step: its complete-by, or for a running step left alone
#: while its message waits in its queue (or taken late) its later ``not_before``
_STEP_DUE = case((and_(steps.c.state == StepState.RUNNING.value, steps.c.not_before > steps.c.complete_by),
                  steps.c.not_before), else_=steps.c.complete_by)
#: runs a deadline still applies to (one being undone is past it, or was stopped for another reason)
_BEFORE_DEADLINE = (RunState.PENDING.value, RunState.PROCESSING.value)


def stranded() -> Select[tuple[str]]:
    """The ids of live runs, not paused, with nothing due: no complete-by of their own, no step
    running (a child run's step runs while its child does), none pending with a due time. Nothing
    would ever move such a run on; sas_app leaves none (every message it sends has a row behind
    it), so any found is a bug to report.

    A live step is looked for in two halves, each the predicate of a partial index of live steps
    (one due at its complete-by, one running with none): asked as one condition, PostgreSQL read
    every step of the history to rule them out."""
    due_step = exists().where(steps.c.run_id == runs.c.id, steps.c.complete_by.is_not(None),
                              steps.c.state.in_(_LIVE_STEP_STATES))
    untimed_step = exists().where(steps.c.run_id == runs.c.id, steps.c.state == StepState.RUNNING.value,
                                  steps.c.complete_by.is_(None))
    return select(runs.c.id).where(runs.c.process_state.in_(_WORKING), runs.c.paused_by.is_(None),
                                   runs.c.complete_by.is_(None), ~due_step, ~untimed_step)


@dataclass(frozen=True)
class Found:
    """How many rows a check found, and one of their runs (None when it found none)."""

    count: int
    example: str | None = None


class Diagnosis:
    engine: Engine

    def stranded_runs(self, among: Collection[str] | None = None) -> Found:
        """Live runs, not paused, with nothing due (:func:`stranded`); only ``among`` these, if given."""
        ids = stranded()
        return self._found(ids if among is None else ids.where(runs.c.id.in_(list(among))))

    def overdue(self, late: float) -> Found:
        """Runs and live steps of live runs whose due time passed more than ``late`` seconds ago:
        a Supervisor would have acted on them by now (none is sweeping, or it cannot keep up)."""
        before = db_now() - late
        due_runs = select(runs.c.id).where(runs.c.process_state.in_(DUE_RUN_STATES), runs.c.complete_by < before)
        due_steps = (select(steps.c.run_id).join(runs, runs.c.id == steps.c.run_id)
                     .where(steps.c.state.in_(_LIVE_STEP_STATES), steps.c.complete_by < before,
                            # a step left alone while its message waits in its queue is due at its not_before
                            or_(steps.c.state != StepState.RUNNING.value, steps.c.not_before.is_(None),
                                steps.c.not_before < before),
                            runs.c.process_state.in_(LIVE_RUN_STATES), ~WAITING_FOR_RESUME))
        past_deadline = select(runs.c.id).where(runs.c.process_state.in_(_BEFORE_DEADLINE), runs.c.deadline < before)
        rows = union_all(due_runs, due_steps, past_deadline).subquery()
        return self._found(select(rows.c[0]))

    def unsent_notifications(self, late: float) -> Found:
        """Notifications written more than ``late`` seconds ago and never relayed."""
        return self._found(select(outbox.c.run_id).where(outbox.c.sent_at.is_(None),
                                                         outbox.c.created_at < db_now() - late))

    def attempts_ended_twice(self, since: float) -> Found:
        """Step attempts that left ``running`` more than once in the last ``since`` seconds of the
        history (each attempt is fenced: one reply, one expiry or one worker lost ends it)."""
        with self.engine.connect() as conn:
            first = first_event_since(conn, since)
        if first is None:
            return Found(0, None)
        left = (select(events.c.run_id)
                .where(events.c.id >= first, events.c.kind == EventKind.TRANSITION.value,
                       events.c.position.is_not(None), events.c.from_state == StepState.RUNNING.value,
                       events.c.at >= db_now() - since)
                .group_by(events.c.run_id, events.c.position, events.c.attempt)
                .having(func.count() > 1).subquery())
        return self._found(select(left.c.run_id))

    def last_sweep_age(self) -> float | None:
        """Seconds since any Supervisor last swept (None: none ever did)."""
        with self.engine.connect() as conn:
            last = conn.execute(select(func.max(supervisors.c.last_sweep_at))).scalar_one()
            return None if last is None else float(conn.execute(select(db_now() - literal(last))).scalar_one())

    def next_due(self, pickup_timeout: float) -> float | None:
        """The soonest time the Supervisor will act on something (the database's clock): a run's or a
        live step's complete-by, a live run's deadline, a pick-up time after a child run ended with
        its parent's step still waiting for it or after a notification was written and not yet
        relayed (their messages lost). None if nothing is due."""
        child = runs.alias("child")
        soonest = union_all(
            select(func.min(runs.c.complete_by)).where(runs.c.process_state.in_(DUE_RUN_STATES)),
            select(func.min(_STEP_DUE)).join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.state.in_(_LIVE_STEP_STATES), runs.c.process_state.in_(LIVE_RUN_STATES),
                   ~WAITING_FOR_RESUME),
            select(func.min(runs.c.deadline)).where(runs.c.process_state.in_(_BEFORE_DEADLINE)),
            select(func.min(child.c.updated_at) + pickup_timeout)
            .join(steps, and_(child.c.parent_run_id == steps.c.run_id, child.c.parent_position == steps.c.position))
            .where(steps.c.child.is_not(None), steps.c.state == StepState.RUNNING.value,
                   child.c.process_state.in_(TERMINAL_RUN_STATES)),
            select(func.min(outbox.c.created_at) + pickup_timeout).where(outbox.c.sent_at.is_(None)),
        ).subquery()
        with self.engine.connect() as conn:
            due = conn.execute(select(func.min(soonest.c[0]))).scalar_one()
        return None if due is None else float(due)

    def _found(self, ids: Select[Any]) -> Found:
        found = ids.subquery()
        with self.engine.connect() as conn:
            count, example = conn.execute(select(func.count(), func.min(found.c[0]))).one()
        return Found(int(count), example)
