"""Read-only queries for people and monitoring: the dashboard's pages and the Prometheus metrics.

Nothing here writes. The runs list is :meth:`Store.list_runs`; an alert is current while its run is in one of
:data:`sas_app.states.OPEN_RUN_STATES` (one in error until it is rerun). Queries walk an index where one
serves: runs by creation time (the chart), workflows by the workflow/key index, events by their
primary key (the metrics follow the append-only history, so every process on every host is counted
without counters of their own), alerts by id; the metrics' counts of runs by state read the open
runs only (bench/dashboard.py measures them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from sqlalchemy import and_, case, func, literal, or_, select

from sas_app.states import OPEN_RUN_STATES, RunState, StepState
from sas_app.store.database import Store
from sas_app.store.rows import as_row
from sas_app.store.service_tables import supervisors
from sas_app.store.tables import alerts, events, runs, steps


@dataclass(frozen=True)
class AlertView:
    id: int
    run_id: str
    position: int | None
    kind: str
    attempt: int | None
    reason: str
    at: float
    workflow: str | None
    business_key: str | None
    process_state: str | None


@dataclass(frozen=True)
class SupervisorView:
    """A Supervisor process (``host:pid``) as its heartbeats show it. ``gone``: not heard from for
    longer than its share of the sweeps explains (see :meth:`Observer.supervisors`)."""

    instance: str
    sweeps: int
    recovered: int
    last_sweep_at: float
    gone: bool = False


#: an alert is current while its run still needs someone: in error until it is rerun (the new run
#: carries on, and the old refuses every action), or not finished
_NEEDS_SOMEONE = and_(runs.c.process_state.in_(OPEN_RUN_STATES),
                      or_(runs.c.process_state != RunState.ERROR.value, runs.c.rerun_as.is_(None)))

#: a Supervisor not heard from for this long is left out (and its row deleted by the next sweep)
FORGET_SUPERVISOR_AFTER = 3600.0
#: gone: quiet for this many times its share of the sweeps, and at least this many seconds
GONE_AFTER_SHARES = 4
GONE_AFTER_AT_LEAST = 30.0
#: the Supervisors counted as sharing the sweeps: heard from within this many intervals
RECENT_SHARES = 10


class HistoryEvent(NamedTuple):
    """One event of the history as the metrics count it, with its step's agent and when the
    step's current attempt was dispatched (``complete_by - timeout``). A tuple, made straight from
    the row: the metrics read hundreds of thousands of these catching up a long history."""

    id: int
    kind: str
    from_state: str | None
    to_state: str | None
    position: int | None
    at: float
    detail: Any
    workflow: str | None
    agent: str | None
    dispatched_at: float | None


@dataclass(frozen=True)
class WaitingView:
    """A run waiting in the store: its step asleep (``kind`` "sleep") or waiting for an event
    ("event") until when, or the run waiting for a slot of its concurrency key ("slot", ``step``
    the key's value)."""

    run_id: str
    workflow: str
    business_key: str
    step: str
    kind: str
    event: str | None
    until: float
    since: float


_KIND = case((steps.c.event.is_not(None), "event"), else_="sleep")
# steps waiting in the store (pending, with a time), of runs going forward: on the live-steps index
_WAITING = (steps.c.state == StepState.PENDING.value,
            or_(steps.c.sleep.is_not(None), steps.c.sleep_until.is_not(None), steps.c.event.is_not(None)))


class Observer:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store.engine

    def now(self) -> float:
        return self.store.now()

    def open_runs_by_workflow_and_state(self) -> list[tuple[str, str, int]]:
        """The runs not finished, or in error and not rerun, by workflow and state: read through
        the runs' state index, so the cost follows the open runs, never the history a store keeps."""
        query = (select(runs.c.workflow, runs.c.process_state, func.count())
                 .where(_NEEDS_SOMEONE).group_by(runs.c.workflow, runs.c.process_state))
        with self.engine.connect() as conn:
            return [(w, s, int(n)) for w, s, n in conn.execute(query)]

    def submitted_over_time(self, since: float, bucket: float) -> list[tuple[int, str, int]]:
        """Runs created since ``since``, per ``bucket`` seconds and by their state now:
        ``(bucket index, state, count)``."""
        index = func.floor((runs.c.created_at - since) / bucket)
        query = (select(index, runs.c.process_state, func.count())
                 .where(runs.c.created_at >= since).group_by(index, runs.c.process_state))
        with self.engine.connect() as conn:
            return [(int(i), s, int(n)) for i, s, n in conn.execute(query)]

    def workflows(self) -> list[str]:
        """The workflows the store has runs of: one step down the (workflow, business key) index
        per workflow (a loose index scan), rather than a DISTINCT over every run."""
        seen = select(func.min(runs.c.workflow).label("workflow")).cte("seen", recursive=True)
        after = select(func.min(runs.c.workflow)).where(runs.c.workflow > seen.c.workflow).scalar_subquery()
        seen = seen.union_all(select(after).where(seen.c.workflow.is_not(None)))
        with self.engine.connect() as conn:
            return [w for w in conn.execute(select(seen.c.workflow)).scalars() if w is not None]

    def alerts(self, limit: int, current: bool | None = None) -> list[AlertView]:
        """The newest alerts with their run's workflow, key and state now. ``current``: only those
        whose run still needs someone (in error and not rerun, or not finished: see :data:`OPEN_RUN_STATES`);
        False: only those whose run has since finished."""
        query = (select(alerts, runs.c.workflow, runs.c.business_key, runs.c.process_state)
                 .join(runs, runs.c.id == alerts.c.run_id, isouter=True)
                 .order_by(alerts.c.id.desc()).limit(limit))
        if current is not None:
            query = query.where(_NEEDS_SOMEONE if current else ~_NEEDS_SOMEONE)
        with self.engine.connect() as conn:
            return [as_row(AlertView, r) for r in conn.execute(query)]

    def count_alerts(self, current: bool) -> int:
        """How many alerts are current (see :meth:`alerts`), or, with False, are not."""
        query = (select(func.count()).select_from(alerts).join(runs, runs.c.id == alerts.c.run_id, isouter=True)
                 .where(_NEEDS_SOMEONE if current else ~_NEEDS_SOMEONE))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def current_alerts_by_kind(self) -> list[tuple[str, int]]:
        """How many alerts are current (see :meth:`alerts`), by kind."""
        query = (select(alerts.c.kind, func.count()).join(runs, runs.c.id == alerts.c.run_id)
                 .where(_NEEDS_SOMEONE).group_by(alerts.c.kind))
        with self.engine.connect() as conn:
            return [(kind, int(n)) for kind, n in conn.execute(query)]

    def waiting(self, limit: int) -> list[WaitingView]:
        """Runs waiting in the store — asleep, for an event (soonest to wake or time out first), or
        for a slot of their concurrency key (longest waiting first; ``until`` is when they are
        asked about again)."""
        query = (select(steps.c.run_id, runs.c.workflow, runs.c.business_key, steps.c.name.label("step"),
                        _KIND.label("kind"), steps.c.event, steps.c.not_before.label("until"),
                        steps.c.updated_at.label("since"))
                 .join(runs, runs.c.id == steps.c.run_id)
                 .where(*_WAITING, steps.c.not_before.is_not(None), runs.c.process_state == RunState.PROCESSING.value)
                 .order_by(steps.c.complete_by).limit(limit))
        parked = (select(runs.c.id, runs.c.workflow, runs.c.business_key, runs.c.slot, literal("slot"), literal(None),
                         runs.c.complete_by, runs.c.slot_since)
                  .where(runs.c.slot.is_not(None), runs.c.process_state == RunState.PENDING.value,
                         runs.c.slot_since.is_not(None))
                  .order_by(runs.c.slot_since).limit(limit))
        with self.engine.connect() as conn:
            rows = [WaitingView(*r) for r in conn.execute(query)] + [WaitingView(*r) for r in conn.execute(parked)]
        return rows[:limit]

    def waiting_by_kind(self) -> list[tuple[str, int]]:
        """How many runs wait in the store now, by kind ("sleep", "event", "slot"): the steps
        waiting, counted on their own partial index without reading the runs (a run waiting in two
        branches at once counts twice; ``bench/sweep.py`` times it)."""
        query = select(_KIND, func.count()).where(*_WAITING).group_by(_KIND)
        parked = select(func.count()).where(runs.c.slot.is_not(None), runs.c.slot_since.is_not(None),
                                            runs.c.process_state == RunState.PENDING.value)
        with self.engine.connect() as conn:
            counts = [(kind, int(n)) for kind, n in conn.execute(query)]
            return [*counts, ("slot", int(conn.execute(parked).scalar_one()))]

    def supervisors(self, interval: float) -> list[SupervisorView]:
        """The Supervisor processes heard from in the last :data:`FORGET_SUPERVISOR_AFTER` seconds
        (older rows are deleted by the sweep), newest first, each marked gone once it has been
        quiet for :data:`GONE_AFTER_SHARES` times its share of the sweeps: beat sends one sweep
        every ``interval`` to whichever process takes it, so with ``n`` of them alive each sweeps
        about every ``n * interval`` seconds."""
        now = self.now()
        query = (select(supervisors).where(supervisors.c.last_sweep_at >= now - FORGET_SUPERVISOR_AFTER)
                 .order_by(supervisors.c.last_sweep_at.desc()))
        with self.engine.connect() as conn:
            rows = [SupervisorView(r.instance, r.sweeps, r.recovered, r.last_sweep_at) for r in conn.execute(query)]
        recent = sum(1 for r in rows if now - r.last_sweep_at <= RECENT_SHARES * interval) or 1
        quiet = max(GONE_AFTER_SHARES * recent * interval, GONE_AFTER_AT_LEAST)
        return [replace(r, gone=now - r.last_sweep_at > quiet) for r in rows]

    def history_after(self, last_id: int, limit: int) -> list[HistoryEvent]:
        """Up to ``limit`` events with an id above ``last_id``, in id order."""
        query = (
            select(events.c.id, events.c.kind, events.c.from_state, events.c.to_state, events.c.position,
                   events.c.at, events.c.detail, runs.c.workflow, steps.c.agent,
                   (steps.c.complete_by - steps.c.timeout).label("dispatched_at"))
            .join(runs, runs.c.id == events.c.run_id, isouter=True)
            .join(steps, (steps.c.run_id == events.c.run_id) & (steps.c.position == events.c.position),
                  isouter=True)
            .where(events.c.id > last_id)
            .order_by(events.c.id).limit(limit)
        )
        with self.engine.connect() as conn:
            return [HistoryEvent._make(row) for row in conn.execute(query)]
