"""Signals sent to runs: each is recorded in the run's transaction (its row locked), ``kept`` until
the run's wait for that event consumes it — at once when the run is waiting, or when it reaches
the wait — and ``ignored`` when that wait already has one, has ended or timed out."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, true, update

from sas_app.states import EventKind, SignalStatus, StepState
from sas_app.store.connection import db_now
from sas_app.store.rows import SignalRow, StepRow, as_row
from sas_app.store.tables import signals
from sas_app.store.transitions import Part


class SignalTx(Part):
    def record_signal(self, wait: StepRow, payload: Any, sent_by: str) -> tuple[int, str]:
        """Record a signal for ``wait``'s event (the caller holds the run's lock): ``kept``, or
        ``ignored`` when a signal for it is kept or consumed already or the wait has ended.
        Returns its id and status."""
        assert wait.event is not None
        taken = self.conn.execute(
            select(signals.c.id).where(signals.c.run_id == wait.run_id, signals.c.event == wait.event,
                                       signals.c.status.in_((SignalStatus.KEPT.value, SignalStatus.CONSUMED.value)))
            .limit(1)
        ).first()
        late = wait.state == StepState.PENDING and wait.not_before is not None and self.tx.now() > wait.not_before
        open_ = wait.state in (StepState.NOT_STARTED, StepState.PENDING) and not late
        status = SignalStatus.KEPT if open_ and taken is None else SignalStatus.IGNORED
        why = None if status == SignalStatus.KEPT else ("after the wait's timeout" if late else
                                                       "the wait has its signal" if taken else "the wait has ended")
        signal_id = self.conn.execute(
            insert(signals).values(run_id=wait.run_id, event=wait.event, payload=payload, status=status.value,
                                   sent_by=sent_by, received_at=db_now()).returning(signals.c.id)
        ).scalar_one()
        self.tx.event(wait.run_id, wait.position, EventKind.SIGNAL, None, None, actor=sent_by,
                      detail={"event": wait.event, "status": status.value, "signal": signal_id,
                           **({"why": why} if why else {})})
        return int(signal_id), status.value

    def take_signal(self, wait: StepRow) -> SignalRow | None:
        """The first kept signal for ``wait``'s event that came before its timeout, now consumed
        by it; None if none came."""
        in_time = signals.c.received_at <= wait.not_before if wait.not_before is not None else true()
        row = self.conn.execute(
            update(signals)
            .where(signals.c.id == select(signals.c.id)
                   .where(signals.c.run_id == wait.run_id, signals.c.event == wait.event,
                          signals.c.status == SignalStatus.KEPT.value, in_time)
                   .order_by(signals.c.id).limit(1).scalar_subquery())
            .values(status=SignalStatus.CONSUMED.value, position=wait.position)
            .returning(*signals.c)
        ).first()
        return None if row is None else as_row(SignalRow, row)

    def signal_status(self, signal_id: int) -> str:
        return str(self.conn.execute(select(signals.c.status).where(signals.c.id == signal_id)).scalar_one())
