"""Scheduled starts: each schedule's row (its last tick), held while a tick is handled so that
two beats — or one restarted mid-tick — handle it once, and the live runs a schedule started."""

from __future__ import annotations

from sqlalchemy import select, update

from sas_app.states import RunState
from sas_app.store.connection import db_now, dialect_insert
from sas_app.store.rows import RunRow, as_row
from sas_app.store.service_tables import schedules
from sas_app.store.tables import runs
from sas_app.store.transitions import Part


class ScheduleTx(Part):
    def lock_schedule(self, name: str) -> float:
        """The schedule's last tick, its row held until commit; a schedule seen for the first
        time starts from now (no run for ticks before it existed)."""
        self.conn.execute(dialect_insert(self.conn.dialect.name)(schedules)
                          .values(name=name, last_tick=db_now(), updated_at=db_now())
                          .on_conflict_do_nothing(index_elements=["name"]))
        return float(self.conn.execute(select(schedules.c.last_tick).where(schedules.c.name == name)
                                       .with_for_update()).scalar_one())

    def set_last_tick(self, name: str, tick: float) -> None:
        self.conn.execute(update(schedules).where(schedules.c.name == name)
                          .values(last_tick=tick, updated_at=db_now()))

    def live_runs_of(self, schedule: str) -> list[RunRow]:
        """The schedule's runs not finished yet (pending, processing, being undone), oldest first."""
        rows = self.conn.execute(
            select(runs).where(runs.c.schedule == schedule,
                               runs.c.process_state.in_((RunState.PENDING.value, RunState.PROCESSING.value,
                                                         RunState.COMPENSATING.value)))
            .order_by(runs.c.created_at)
        )
        return [as_row(RunRow, r) for r in rows]
