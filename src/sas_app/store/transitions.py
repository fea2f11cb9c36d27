"""The core of a transaction (:class:`TxBase`): the run's history and the notifications that every
transition writes, and the base of each concern's statements (:class:`Part`).

Each transition is one conditional statement (``UPDATE … WHERE state = :expected AND attempt = :n``)
whose row count says whether the caller won, and each appends its row of the run's history, written
with the transaction's other events just before it commits. Nothing here sends a message:
notifications go to the ``outbox`` table and are relayed after the commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, insert, select

from sas_app.messaging.routing import Advance, Notification
from sas_app.states import EventKind, Word
from sas_app.store.connection import PG_NOW, db_now, dialect_insert
from sas_app.store.prepared import rows
from sas_app.store.recordset import insert_from_json, rows_parameter
from sas_app.store.tables import alerts, events, outbox, runs

#: The PostgreSQL channel on which a run's id is announced when it reaches a terminal state.
RUN_DONE_CHANNEL = "sas_run_done"


def run_in(*states: str) -> ColumnElement[bool]:
    """A fence on a run's state, for a run found by its primary key (or joined on it). Written so
    that no index on the state can serve it: with statistics taken before a burst (they say no run
    is pending or live), PostgreSQL would walk every run in that state instead of the key
    (``bench/recovery.py`` measures it)."""
    return func.coalesce(runs.c.process_state, "").in_(states)

INSERT_EVENTS = insert(events).values(at=db_now())
_EVENT_COLUMNS = ("run_id", "position", "kind", "from_state", "to_state", "attempt", "actor", "detail")
INSERT_EVENTS_JSON = insert_from_json(events, _EVENT_COLUMNS, {"at": PG_NOW})


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
        #: each statement commits on its own (:meth:`Store.alone`): events and notifications,
        #: which must commit with the transition that writes them, are refused
        self.alone = False

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
        self._refuse_alone("an event")
        self._events.append(dict(zip(_EVENT_COLUMNS, (
            run_id, position, str(kind), plain(from_state), plain(to_state), attempt, actor, detail), strict=True)))

    def transition(self, run_id: str, position: int | None, from_state: str | None, to_state: str, *,
                   attempt: int | None = None, actor: str | None = None, detail: Any = None) -> None:
        self.event(run_id, position, EventKind.TRANSITION, from_state, to_state, attempt=attempt, actor=actor,
                   detail=detail)

    def _refuse_alone(self, what: str) -> None:
        if self.alone:
            raise RuntimeError(f"{what} written where each statement commits on its own (Store.alone): "
                               "it must commit with its transition, in Store.begin")

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
        self._refuse_alone("a notification")
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
        inserted = self.conn.execute(
            dialect_insert(self.conn.dialect.name)(alerts)
            .values(dedup_key=dedup_key, run_id=run_id, position=position, kind=kind, attempt=attempt,
                    reason=reason, at=db_now())
            .on_conflict_do_nothing(index_elements=["dedup_key"])
            .returning(alerts.c.id)
        ).first()
        if inserted is None:
            return False
        self.event(run_id, position, EventKind.ALERT, None, None, attempt=attempt, actor=actor, detail=detail)
        return True


class Part:
    """One concern's statements on a transaction, reached from it by the name of the concern's
    module: ``tx.waits`` is the :class:`~sas_app.store.waits.WaitTx` of ``tx``, in
    ``sas_app/store/waits.py``. Every concern writes its history through the transaction
    (``self.tx.event``, ``self.tx.transition``); one that builds on others is given them when
    made (``WaitTx(tx, runs, steps)``)."""

    def __init__(self, tx: TxBase) -> None:
        self.tx = tx
        self.conn: Connection = tx.conn
