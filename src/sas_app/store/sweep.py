"""The Supervisor's queries: what is past due, locked with ``SKIP LOCKED`` so that Supervisors
running at once take disjoint rows, and what an at-risk warning is judged by.

Each walks a partial index over live rows only (``ix_steps_live_complete_by``,
``ix_runs_due``), so its cost follows the number of rows that are due, not the
size of the table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, tuple_, update

from sas_app.states import LIVE_RUN_STATES, Cause, EventKind, RunState, StepState
from sas_app.store.connection import db_now
from sas_app.store.history import first_event_since
from sas_app.store.rows import RunRow, StepRow, as_row
from sas_app.store.tables import DUE_RUN_STATES, WAITING_FOR_RESUME, alerts, events, runs, steps
from sas_app.store.transitions import Part, run_in

_LIVE = run_in(*LIVE_RUN_STATES)  # through the run's primary key: see run_in


class SweepTx(Part):
    def expired_steps(self, limit: int) -> list[StepRow]:
        """Running steps of live runs whose complete-by has passed, oldest first, locked with
        ``SKIP LOCKED`` so that concurrent Supervisors take disjoint sets. A step left alone while
        its message waits in its agent's queue (:meth:`leave_queued`), or taken late by its agent
        (``StepTx.start_late``), comes back at its ``not_before``."""
        now = db_now()
        query = (
            select(steps)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.state == StepState.RUNNING.value, steps.c.complete_by < now,
                   steps.c.not_before.is_(None) | (steps.c.not_before <= now), _LIVE)
            .order_by(steps.c.complete_by)
            .limit(limit)
            .with_for_update(skip_locked=True, of=[steps, runs])
        )
        return [as_row(StepRow, r) for r in self.conn.execute(query)]

    def agents_word(self, expired: Sequence[StepRow]) -> tuple[set[int], Counter[int]]:
        """For attempts past their complete-by: the ids of the steps whose agent said it took this
        attempt and gave up on it (a ``gave_up`` event), and how many earlier attempts of each
        passed their complete-by in silence (running → pending for :attr:`Cause.SILENT`)."""
        gave_up: set[int] = set()
        silent: Counter[int] = Counter()
        for step, row in self._events_of(expired, or_(
                events.c.kind == EventKind.GAVE_UP.value,
                and_(events.c.kind == EventKind.TRANSITION.value, events.c.from_state == StepState.RUNNING.value,
                     events.c.to_state == StepState.PENDING.value))):
            if row.kind == EventKind.GAVE_UP.value and row.attempt == step.attempt:
                gave_up.add(step.id)
            elif row.kind == EventKind.TRANSITION.value and (row.detail or {}).get("reason") == Cause.SILENT.value:
                silent[step.id] += 1
        return gave_up, silent

    def leave_queued(self, queued: Collection[StepRow], look_again: float, actor: str, note: bool = True,
                     detail: dict[str, str] | None = None) -> None:
        """Steps past their complete-by whose messages still wait in their agent's queue, read and
        locked by this sweep: no failure counted, looked at again in ``look_again`` seconds (their
        ``not_before``; a running step's is otherwise empty). The first time, a ``queued`` event
        (unless ``note`` is False: a step given a moment's grace, not known to be queued); with
        ``detail``, a ``queued`` event of that detail each time."""
        if not queued:
            return
        self.conn.execute(update(steps).where(steps.c.id.in_([s.id for s in queued]))
                          .values(not_before=db_now() + look_again))
        for step in queued:
            if detail is not None or (note and step.not_before is None):
                self.tx.event(step.run_id, step.position, EventKind.QUEUED, None, None, attempt=step.attempt,
                              actor=actor, detail=detail or {"left": "its message waits in the queue"})

    def left_queued(self, expired: Sequence[StepRow]) -> tuple[set[int], set[int]]:
        """For attempts past their complete-by: the ids of the steps a sweep left waiting in their
        queue at this attempt (a ``queued`` event, ``left``), and of those already given a moment
        for their agent to claim a message it had just taken (``taken``)."""
        left: set[int] = set()
        taken: set[int] = set()
        for step, row in self._events_of(expired, events.c.kind == EventKind.QUEUED.value):
            if row.attempt == step.attempt:
                detail = row.detail or {}
                if "left" in detail:
                    left.add(step.id)
                if "taken" in detail:
                    taken.add(step.id)
        return left, taken

    def _events_of(self, expired: Sequence[StepRow], kind: ColumnElement[bool]) -> Iterator[tuple[StepRow, Any]]:
        """The events of ``expired``'s steps that match ``kind`` (a condition on ``events``), each
        with its step (the row's run_id, position, kind, attempt, detail): one query for the batch."""
        if not expired:
            return
        by_place = {(s.run_id, s.position): s for s in expired}
        found = self.conn.execute(
            select(events.c.run_id, events.c.position, events.c.kind, events.c.attempt, events.c.detail)
            .where(tuple_(events.c.run_id, events.c.position).in_(list(by_place)), kind))
        for row in found:
            yield by_place[(row.run_id, row.position)], row

    def past_deadline(self, limit: int) -> list[RunRow]:
        """Pending or processing runs whose deadline has passed, locked with ``SKIP LOCKED``."""
        rows = self.conn.execute(
            select(runs)
            .where(runs.c.deadline.is_not(None), runs.c.deadline < db_now(),
                   runs.c.process_state.in_((RunState.PENDING.value, RunState.PROCESSING.value)))
            .order_by(runs.c.deadline)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        return [as_row(RunRow, r) for r in rows]

    def requeue_stalled(self, pickup_timeout: float, limit: int, actor: str) -> tuple[list[str], list[str]]:
        """Runs and pending steps that no Scheduler picked up by their complete-by: a pending run
        not claimed, a live run asked about and not looked at (:meth:`RunTx.ask`), a step whose
        back-off is over (all three: a lost message) — and a step waiting in the store whose time
        has come (a sleep, a wait's timeout, a poll: its complete-by is its ``not_before``, and no
        message was ever meant to wake it), unless its run is paused. Their complete-by is pushed
        forward and their run ids returned, ``(stalled, woken)``, to be asked about again. Two
        statements whatever the number (each an UPDATE of the rows a ``SKIP LOCKED`` select took),
        and their events in the transaction's one insert."""
        now = db_now()
        stalled_runs = (
            select(runs.c.id)
            .where(runs.c.process_state.in_(DUE_RUN_STATES), runs.c.complete_by < now)
            .order_by(runs.c.complete_by)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        moved_runs = self.conn.execute(
            update(runs)
            .where(runs.c.id.in_(stalled_runs.scalar_subquery()))
            .values(complete_by=now + pickup_timeout, updated_at=now)
            .returning(runs.c.id, runs.c.process_state)
        ).all()
        stalled_steps = (
            select(steps.c.id)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.state == StepState.PENDING.value, steps.c.complete_by < now, _LIVE,
                   ~WAITING_FOR_RESUME)
            .order_by(steps.c.complete_by)
            .limit(limit)
            .with_for_update(skip_locked=True, of=[steps, runs])
        )
        moved_steps = self.conn.execute(
            update(steps)
            .where(steps.c.id.in_(stalled_steps.scalar_subquery()))
            .values(complete_by=now + pickup_timeout, updated_at=now)
            # a wait's complete-by is its not_before; a back-off's is its not_before plus a pick-up time
            .returning(steps.c.run_id, steps.c.position, steps.c.attempt,
                       func.coalesce(steps.c.not_before > now - pickup_timeout, False).label("woke"))
        ).all()
        for run_id, state in moved_runs:
            self.tx.event(run_id, None, EventKind.REQUEUE, state, state, actor=actor)
        for run_id, position, attempt, _ in moved_steps:
            self.tx.event(run_id, position, EventKind.REQUEUE, StepState.PENDING, StepState.PENDING,
                          attempt=attempt, actor=actor)
        stalled = dict.fromkeys([*(run_id for run_id, _ in moved_runs),
                                 *(run_id for run_id, _, _, woke in moved_steps if not woke)])
        woken = dict.fromkeys(run_id for run_id, _, _, woke in moved_steps if woke and run_id not in stalled)
        return list(stalled), list(woken)

    def busy_agents(self) -> list[str]:
        """The agents with a step running in a live run (whose queues an at-risk warning looks at)."""
        return list(self.conn.execute(
            select(steps.c.agent).distinct()
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.state == StepState.RUNNING.value, steps.c.complete_by.is_not(None), _LIVE)
        ).scalars())

    def queued_steps(self, agent: str, depth: int, limit: int, read_at: float | None = None) -> list[StepRow]:
        """The running steps of ``agent`` whose messages likely wait in its queue, its head first:
        the ``depth`` dispatched last (by ``read_at``, when the depth was read, if given; a queue is
        first in, first out; a step's complete-by is its dispatch plus its timeout), at most
        ``limit`` of them from the head. Undos are left out: sent at the most urgent priority, they
        are taken before the rest. The ``depth`` newest are found on their ids and send times only
        (a top-N sort), and only the ``limit`` read whole: a deep backlog costs a sort of two
        numbers a step, not of every column."""
        dispatched = steps.c.complete_by - steps.c.timeout
        sent = [] if read_at is None else [dispatched <= read_at]
        newest = (
            select(steps.c.id, dispatched.label("sent_at"))
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.agent == agent, steps.c.state == StepState.RUNNING.value,
                   steps.c.complete_by.is_not(None), steps.c.compensates.is_(None), _LIVE, *sent)
            .order_by(dispatched.desc(), steps.c.id.desc())
            .limit(depth)
            .subquery()
        )
        rows = self.conn.execute(
            select(steps).join(newest, newest.c.id == steps.c.id)
            .order_by(newest.c.sent_at, steps.c.id)
            .limit(limit)
        )
        return [as_row(StepRow, r) for r in rows]

    def still_running(self, attempts: Collection[tuple[int, int]]) -> set[tuple[int, int]]:
        """Which of ``attempts`` (a step's id and attempt) are still running, in a live run."""
        rows = self.conn.execute(select(steps.c.id, steps.c.attempt)
                                 .join(runs, runs.c.id == steps.c.run_id)
                                 .where(steps.c.id.in_([step_id for step_id, _ in attempts]),
                                        steps.c.state == StepState.RUNNING.value, _LIVE))
        return {(step_id, attempt) for step_id, attempt in rows} & set(attempts)

    def run_names(self, run_ids: Collection[str]) -> dict[str, tuple[str, str]]:
        """Each run's workflow and business key, by id, read without a lock (an at-risk warning
        only tells; it must not hold the runs an agent's reply is waiting to complete)."""
        rows = self.conn.execute(select(runs.c.id, runs.c.workflow, runs.c.business_key)
                                 .where(runs.c.id.in_(list(run_ids))))
        return {run_id: (workflow, key) for run_id, workflow, key in rows}

    def alerts_raised(self, dedup_keys: Collection[str]) -> set[str]:
        """Which of ``dedup_keys`` name an alert already stored."""
        return set(self.conn.execute(select(alerts.c.dedup_key)
                                     .where(alerts.c.dedup_key.in_(list(dedup_keys)))).scalars())

    def recent_completions(self, agent: str, window: float, most: int = 50) -> tuple[list[float], float]:
        """When ``agent``'s last ``most`` steps completed within the last ``window`` seconds,
        newest first, and now (the store's clock): read from the window's events (their
        completions, newest first, each step's agent by its key), so that the cost follows the
        window's events, never the steps the store keeps."""
        now = float(self.conn.execute(select(db_now())).scalar_one())
        first = first_event_since(self.conn, window)
        if first is None:
            return [], now
        done = self.conn.execute(
            select(events.c.at)
            .join(steps, and_(steps.c.run_id == events.c.run_id, steps.c.position == events.c.position))
            .where(events.c.id >= first, events.c.kind == EventKind.TRANSITION.value,
                   events.c.to_state == StepState.COMPLETED.value, events.c.position.is_not(None),
                   events.c.at >= now - window, steps.c.agent == agent)
            .order_by(events.c.id.desc())
            .limit(most)
        ).scalars().all()
        return sorted((float(t) for t in done), reverse=True), now

    def paced_retries_due_last(self, agent: str) -> float | None:
        """When the last of ``agent``'s paced retries still to come is due (the next one paced goes
        after it). A paced retry waits in the store until the sweep wakes it: its complete-by is the
        end of its wait (a back-off's or a breaker's deferral adds the pick-up time; an escalation's
        wait has its own counter)."""
        last = self.conn.execute(
            select(func.max(steps.c.not_before))
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.agent == agent, steps.c.state == StepState.PENDING.value, steps.c.attempt > 0,
                   steps.c.escalated == 0, steps.c.complete_by == steps.c.not_before,
                   steps.c.not_before > db_now(), _LIVE)
        ).scalar_one()
        return None if last is None else float(last)
