"""One run at a time per key (``Workflow(concurrency_key=, max_running=)``): a run whose payload
names a key starts only while fewer than ``max_running`` runs of its workflow with that key are
live (processing or being undone) and none submitted before it still waits. Otherwise it stays
``pending`` — parked, re-asked by the Supervisor every pick-up timeout — and the run ending before
it (in any way: :meth:`RunTx.update_run`) asks the Scheduler about the next in line in its own
transaction's follow-ups.

Claims of one key are serialised — on PostgreSQL by a transaction-scoped advisory lock on the
workflow and key, taken last, after the run's row lock, so its holder never waits on a row; on
SQLite by the database's single writer — so two runs never take the last slot together. A run
ending reads the next in line without that lock: one parked in that same instant waits for the
Supervisor's next re-ask (at most a pick-up timeout), never for ever.
"""

from __future__ import annotations

from sqlalchemy import and_, func, or_, select, update

from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance
from sas_app.states import EventKind, RunState
from sas_app.store.connection import db_now
from sas_app.store.rows import RunRow
from sas_app.store.runs import CLAIM_SLOT_RUN, RunTx
from sas_app.store.tables import runs
from sas_app.store.transitions import Part, TxBase, run_in

_LIVE = (RunState.PROCESSING.value, RunState.COMPENSATING.value)


class SlotTx(Part):
    def __init__(self, tx: TxBase, runs: RunTx) -> None:
        super().__init__(tx)
        self.runs = runs

    def claim_slot(self, run: RunRow, pickup_timeout: float, locked_by: str) -> RunRow | None:
        """``run`` (pending, locked by the caller) → processing if its key has a free slot and no
        run before it waits; else it stays pending, asked about again after ``pickup_timeout``.
        Returns the run claimed, or None."""
        assert run.slot is not None and run.max_running is not None
        self._lock_key(run)
        same = and_(runs.c.workflow == run.workflow, runs.c.slot == run.slot)
        holders = self.conn.execute(select(func.count()).where(same, runs.c.process_state.in_(_LIVE))).scalar_one()
        before = self.conn.execute(select(func.count()).where(
            same, runs.c.process_state == RunState.PENDING.value,
            or_(runs.c.created_at < run.created_at, and_(runs.c.created_at == run.created_at, runs.c.id < run.id)),
        )).scalar_one()
        if holders >= run.max_running or before:
            self._park(run, int(holders), int(before), pickup_timeout)
            return None
        claimed = self.runs.claimed(self.conn.execute(CLAIM_SLOT_RUN, {"b_run_id": run.id, "b_locked_by": locked_by})
                                    .first(), locked_by)
        if claimed is not None and holders + 1 < run.max_running:  # room for the next in line too
            self.tx.follow_ups += [Advance(i, Publish.SLOT_FREED)
                                   for i in self.runs.next_in_line(run.workflow, run.slot, run.id)]
        return claimed

    def slot_holders(self, run: RunRow) -> list[str]:
        """The live runs holding a slot of ``run``'s key (claims of that key held off meanwhile)."""
        assert run.slot is not None
        self._lock_key(run)
        return list(self.conn.execute(select(runs.c.id).where(
            runs.c.workflow == run.workflow, runs.c.slot == run.slot, runs.c.process_state.in_(_LIVE),
            runs.c.id != run.id)).scalars())

    def _lock_key(self, run: RunRow) -> None:
        if self.tx.is_postgresql:
            key = func.hashtextextended(f"{run.workflow}\x1f{run.slot}", 0)
            self.conn.execute(select(func.pg_advisory_xact_lock(key)))

    def _park(self, run: RunRow, holders: int, before: int, pickup_timeout: float) -> None:
        now = db_now()
        self.conn.execute(update(runs).where(runs.c.id == run.id, run_in(RunState.PENDING.value))
                          .values(complete_by=now + pickup_timeout, slot_since=func.coalesce(runs.c.slot_since, now),
                                  updated_at=now))
        if run.slot_since is None:  # once, not on every re-ask
            self.tx.event(run.id, None, EventKind.REQUEUE, RunState.PENDING, RunState.PENDING,
                          detail={"waiting_for_slot": run.slot, "running": holders, "before": before})
