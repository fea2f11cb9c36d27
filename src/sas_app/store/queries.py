"""Read-only queries of runs, steps and their history, for the client, the CLI and the dashboard.
(The dashboard's and the metrics' own aggregates are in :mod:`sas_app.store.observe`.)"""

from __future__ import annotations

from sqlalchemy import Engine, and_, func, or_, select

from sas_app.states import RunState
from sas_app.store.connection import db_now
from sas_app.store.rows import EventRow, RunRow, SignalRow, StepRow, as_row
from sas_app.store.service_tables import schedules
from sas_app.store.tables import events, runs, signals, steps


class Queries:
    engine: Engine

    def now(self) -> float:
        """The database's clock, in epoch seconds."""
        with self.engine.connect() as conn:
            return float(conn.execute(select(db_now())).scalar_one())

    def get_run(self, run_id: str) -> RunRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        return None if row is None else as_row(RunRow, row)

    def find_run(self, workflow: str, business_key: str) -> RunRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(runs).where(runs.c.workflow == workflow, runs.c.business_key == business_key)
            ).first()
        return None if row is None else as_row(RunRow, row)

    def reply_queues(self) -> list[str]:
        """Every reply queue a run was submitted with (the test kit's check of a name)."""
        with self.engine.connect() as conn:
            found = conn.execute(select(runs.c.reply_to).where(runs.c.reply_to.is_not(None)).distinct())
            return sorted(row[0] for row in found)

    def get_steps(self, run_id: str) -> list[StepRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(steps).where(steps.c.run_id == run_id).order_by(steps.c.position))
            return [as_row(StepRow, r) for r in rows]

    def get_events(self, run_id: str) -> list[EventRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.id))
            return [as_row(EventRow, r) for r in rows]

    def schedule_ticks(self) -> dict[str, float]:
        """Each schedule's last tick handled, by name."""
        with self.engine.connect() as conn:
            return {name: float(tick) for name, tick in conn.execute(select(schedules.c.name, schedules.c.last_tick))}

    def signals_of(self, run_id: str) -> list[SignalRow]:
        """Every signal sent to the run, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(signals).where(signals.c.run_id == run_id).order_by(signals.c.id))
            return [as_row(SignalRow, r) for r in rows]

    def list_runs(self, *, state: str | None = None, workflow: str | None = None, key: str | None = None,
                  version: str | None = None, failure: str | None = None, since: float | None = None,
                  until: float | None = None, after: tuple[float, str] | None = None,
                  limit: int = 50) -> list[RunRow]:
        """Newest first, filtered by state, workflow, the definition's version, a business-key
        prefix and words in the run's error (``failure``, any case); ``%`` and ``_`` in the last two
        are characters, not wildcards. ``since``/``until``: created in ``[since, until)``.
        ``after``: the ``(created_at, id)`` of the last run of the page before (a keyset page:
        runs submitted meanwhile neither shift nor repeat the pages that follow)."""
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        if since is not None:
            query = query.where(runs.c.created_at >= since)
        if until is not None:
            query = query.where(runs.c.created_at < until)
        if after is not None:
            query = query.where(or_(runs.c.created_at < after[0],
                                    and_(runs.c.created_at == after[0], runs.c.id < after[1])))
        if state is not None:
            query = query.where(runs.c.process_state == state)
        if workflow is not None:
            query = query.where(runs.c.workflow == workflow)
        if version is not None:
            query = query.where(runs.c.version == version)
        if key is not None:
            query = query.where(runs.c.business_key.like(like_literal(key) + "%", escape="\\"))
        if failure is not None:
            query = query.where(runs.c.error.ilike("%" + like_literal(failure) + "%", escape="\\"))
        with self.engine.connect() as conn:
            return [as_row(RunRow, r) for r in conn.execute(query)]

    def children(self, run_id: str) -> list[RunRow]:
        """The child runs ``run_id``'s steps started, oldest first."""
        query = select(runs).where(runs.c.parent_run_id == run_id).order_by(runs.c.created_at)
        with self.engine.connect() as conn:
            return [as_row(RunRow, r) for r in conn.execute(query)]

    def count_states(self, run_ids: list[str]) -> dict[str, int]:
        """How many of these runs are in each state."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(runs.c.process_state, func.count()).where(runs.c.id.in_(run_ids))
                                .group_by(runs.c.process_state))
            return {state: int(n) for state, n in rows}

    def count_runs_by_state(self) -> dict[str, int]:
        query = select(runs.c.process_state, func.count()).group_by(runs.c.process_state)
        with self.engine.connect() as conn:
            return {state: count for state, count in conn.execute(query)}

    def count_errors_rerun(self) -> int:
        """The runs in error that have been rerun: they need nobody, their rerun carries on."""
        query = select(func.count()).select_from(runs).where(runs.c.process_state == RunState.ERROR.value,
                                                             runs.c.rerun_as.is_not(None))
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def count_events(self, kind: str, run_id: str | None = None) -> int:
        query = select(func.count()).select_from(events).where(events.c.kind == str(kind))
        if run_id is not None:
            query = query.where(events.c.run_id == run_id)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())


def like_literal(text: str) -> str:
    """``text`` for a LIKE pattern, its ``%`` and ``_`` escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
