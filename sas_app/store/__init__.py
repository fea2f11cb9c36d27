"""The state store: every SQL statement sas_app runs lives in this module.

Each transition is one conditional statement (``UPDATE … WHERE state = :expected AND attempt = :n``)
whose row count says whether the caller won, and each writes its row in ``events`` in the same
transaction. Callers compose transitions inside :meth:`Store.begin`; nothing here sends a message.
"""

from __future__ import annotations

import json
import select as select_module
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Double,
    Engine,
    bindparam,
    create_engine,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Row, make_url

from ..models import alerts, db_now, events, outbox, runs, steps, supervisors

T = TypeVar("T")


@dataclass(frozen=True)
class RunRow:
    id: str
    workflow: str
    business_key: str
    payload: Any
    process_state: str
    locked_by: str | None
    complete_by: float | None
    failure_count: int
    reply_to: str | None
    error: str | None
    cancelled_by: str | None
    paused_by: str | None
    priority: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class StepRow:
    id: int
    run_id: str
    position: int
    name: str
    agent: str
    action: str
    state: str
    attempt: int
    locked_by: str | None
    complete_by: float | None
    not_before: float | None
    timeout: float
    max_failures: int
    failure_count: int
    idempotency_key: str
    undo: str | None
    compensates: int | None
    input: Any
    result: Any
    error: str | None
    created_at: float
    updated_at: float
    completed_at: float | None

    @property
    def is_undo(self) -> bool:
        return self.compensates is not None


@dataclass(frozen=True)
class EventRow:
    id: int
    run_id: str
    position: int | None
    kind: str
    from_state: str | None
    to_state: str | None
    attempt: int | None
    actor: str | None
    at: float
    detail: Any


@dataclass(frozen=True)
class Notification:
    """A progress message for a submitter's ``reply_to`` queue; ``body["id"]`` never changes."""

    id: int
    reply_to: str
    body: dict[str, Any]


@dataclass(frozen=True)
class NewStep:
    """A step as written at submit time, copied from its workflow definition."""

    name: str
    agent: str
    action: str
    timeout: float
    max_failures: int
    idempotency_key: str
    undo: str | None = None


#: ``steps.error`` of a step failed by the Supervisor: whether its effect was applied is unknown.
EXPIRED = "complete-by passed"
#: why an attempt was given up (the ``reason`` of its running → pending event): its complete-by
#: passed (found by the Supervisor) or its worker process died (reported by the worker)
EXPIRED_REASON = "expired"
WORKER_LOST = "worker_lost"
#: Run states in which the Scheduler still has work: its steps, or their undoing.
LIVE_RUN_STATES = ("processing", "compensating")
#: Run states a run never leaves.
TERMINAL_RUN_STATES = ("processed", "error", "compensated", "cancelled")
#: The PostgreSQL channel on which a run's id is announced when it reaches a terminal state.
RUN_DONE_CHANNEL = "sas_run_done"


def _as(kind: type[T], row: Row[Any]) -> T:
    mapping = row._mapping
    return kind(**{name: mapping[name] for name in _field_names(kind)})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in fields(kind))
    return names


# The hot path's statements, built once: a step costs a lock, two fenced updates and one insert of
# its events, each a cached, pre-built statement executed with fresh parameters.
_LOCK_RUN = select(runs).where(runs.c.id == bindparam("b_run_id")).with_for_update()
_COMPLETE_STEP = (
    update(steps)
    .where(steps.c.run_id == bindparam("b_run_id"), steps.c.position == bindparam("b_position"),
           steps.c.state == "running", steps.c.attempt == bindparam("b_attempt"))
    .values(state="completed", result=bindparam("b_result", type_=steps.c.result.type), locked_by=None,
            completed_at=db_now(), updated_at=db_now())
    .returning(*steps.c)
)
_MARK_NEXT_RUNNING = (
    update(steps)
    .where(steps.c.run_id == bindparam("b_run_id"), steps.c.position == bindparam("b_position"),
           steps.c.compensates.is_(None), steps.c.state.in_(("not_started", "pending")),
           (steps.c.not_before.is_(None)) | (steps.c.not_before <= db_now()))
    .values(state="running", attempt=steps.c.attempt + 1, locked_by=bindparam("b_locked_by"),
            complete_by=db_now() + steps.c.timeout, not_before=None, updated_at=db_now())
    .returning(*steps.c)
)
_INSERT_EVENTS = insert(events).values(at=db_now())
_PG_NOW = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"
_RUN_COLUMNS = [c.name for c in runs.c]
_STEP_COLUMNS = [c.name for c in steps.c]
# PostgreSQL: a step's whole hot path in one round trip. Lock the run; complete the step if that
# attempt still runs and the run is processing (not paused); mark the next workflow step running if
# it is due, or, after the last step, mark the run processed and announce it (RunHandle.wait); write
# the events. Every sub-statement sees one snapshot and each update is fenced, so these are the same
# transitions as the statements they replace, in one statement.
_COMPLETE_AND_ADVANCE = text(f"""
WITH run AS (
    SELECT * FROM runs WHERE id = :b_run_id FOR UPDATE
), done AS (
    UPDATE steps SET state = 'completed', result = :b_result, locked_by = NULL,
                     completed_at = {_PG_NOW}, updated_at = {_PG_NOW}
    FROM run
    WHERE steps.run_id = run.id AND run.process_state = 'processing' AND run.paused_by IS NULL
      AND steps.position = :b_position AND steps.state = 'running' AND steps.attempt = :b_attempt
      AND steps.compensates IS NULL
    RETURNING steps.position, steps.attempt, steps.name
), nxt AS (
    UPDATE steps SET state = 'running', attempt = steps.attempt + 1, locked_by = :b_locked_by,
                     complete_by = {_PG_NOW} + steps.timeout, not_before = NULL, updated_at = {_PG_NOW}
    WHERE steps.run_id = :b_run_id AND steps.position = :b_position + 1 AND steps.compensates IS NULL
      AND steps.state IN ('not_started', 'pending')
      AND (steps.not_before IS NULL OR steps.not_before <= {_PG_NOW})
      AND EXISTS (SELECT 1 FROM done)
    RETURNING steps.*
), fin AS (
    UPDATE runs SET process_state = 'processed', locked_by = NULL, complete_by = NULL, updated_at = {_PG_NOW}
    WHERE runs.id = :b_run_id AND EXISTS (SELECT 1 FROM done)
      AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = :b_run_id AND s.position > :b_position
                      AND s.compensates IS NULL)
    RETURNING runs.id
), ev AS (
    INSERT INTO events (run_id, position, kind, from_state, to_state, attempt, actor, at, detail)
    SELECT :b_run_id, d.position, 'transition', 'running', 'completed', d.attempt, :b_locked_by, {_PG_NOW}, NULL
    FROM done d
    UNION ALL
    SELECT :b_run_id, n.position, 'transition', CASE WHEN n.attempt = 1 THEN 'not_started' ELSE 'pending' END,
           'running', n.attempt, :b_locked_by, {_PG_NOW}, jsonb_build_object('complete_by', n.complete_by)
    FROM nxt n
    UNION ALL
    SELECT :b_run_id, NULL, 'transition', 'processing', 'processed', NULL, :b_locked_by, {_PG_NOW}, NULL FROM fin
), announce AS (
    SELECT pg_notify('{RUN_DONE_CHANNEL}', id) FROM fin
)
SELECT (SELECT name FROM done) AS done_name, (SELECT count(*) FROM announce) AS finished,
       {", ".join(f"r.{c} AS r_{c}" for c in _RUN_COLUMNS)},
       {", ".join(f"n.{c} AS n_{c}" for c in _STEP_COLUMNS)}
FROM run r LEFT JOIN nxt n ON true
""").bindparams(bindparam("b_result", type_=JSONB))
_INSERT_STEPS = insert(steps).values(created_at=db_now(), updated_at=db_now(), state="not_started")
# pending → processing, in the statement that also locks the run: a new run's claim is one round trip.
_CLAIM_RUN = (
    update(runs)
    .where(runs.c.id == bindparam("b_run_id"), runs.c.process_state == "pending")
    .values(process_state="processing", locked_by=bindparam("b_locked_by"), complete_by=None, updated_at=db_now())
    .returning(*runs.c)
)


def make_engine(url: str) -> Engine:
    """An engine tuned for the state store: WAL and ``BEGIN IMMEDIATE`` on SQLite, so that
    concurrent worker processes serialise their writes instead of failing.

    On a server database connections are not pinged before use: that was one more round trip in
    every transaction, a fifth of a step's cost. After a PostgreSQL restart the first transaction
    on a stale connection fails, SQLAlchemy discards the pool, and what that transaction was doing
    is recovered like any lost message (the Supervisor's sweep)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_size=5, max_overflow=5)


class Store:
    """The durable truth: runs, steps and their history."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._clock_offset = 0.0
        self._clock_checked: float | None = None
        insert_fn = postgresql.insert if self.is_postgresql else sqlite.insert
        self._insert_run = (
            insert_fn(runs)
            .values(
                id=bindparam("b_id"), workflow=bindparam("b_workflow"), business_key=bindparam("b_business_key"),
                payload=bindparam("b_payload", type_=runs.c.payload.type), process_state="pending",
                reply_to=bindparam("b_reply_to"), priority=bindparam("b_priority"),
                complete_by=db_now() + bindparam("b_pickup", type_=Double()), failure_count=0,
                created_at=db_now(), updated_at=db_now(),
            )
            .on_conflict_do_nothing(index_elements=["workflow", "business_key"])
            .returning(*runs.c)
        )
        recovered = bindparam("b_recovered", type_=supervisors.c.recovered.type)
        upsert = insert_fn(supervisors).values(instance=bindparam("b_instance"), sweeps=1, recovered=recovered,
                                               last_sweep_at=db_now())
        self._record_sweep = upsert.on_conflict_do_update(
            index_elements=["instance"],
            set_={"sweeps": supervisors.c.sweeps + 1, "recovered": supervisors.c.recovered + recovered,
                  "last_sweep_at": db_now()},
        )

    @property
    def is_postgresql(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    #: seconds between two measurements of this host's clock against the database's
    CLOCK_CHECK_INTERVAL = 60.0

    def db_clock(self) -> float | None:
        """The database's clock, read as this host's clock plus its offset from the database's,
        measured at most a minute ago (one query then; none in between). None if the database
        cannot be asked now."""
        checked = self._clock_checked
        if checked is None or time.monotonic() - checked > self.CLOCK_CHECK_INTERVAL:
            try:
                before = time.time()
                database = self.now()
                after = time.time()
            except Exception:
                return None
            self._clock_offset = database - (before + after) / 2
            self._clock_checked = time.monotonic()
        return time.time() + self._clock_offset

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def begin(self) -> Iterator[Tx]:
        """One transaction: every transition made through the yielded :class:`Tx` commits together."""
        with self.engine.begin() as conn:
            tx = Tx(conn)
            yield tx
            tx.flush_events()

    # -- submit -----------------------------------------------------------------------------

    def create_run(
        self,
        *,
        run_id: str,
        workflow: str,
        business_key: str,
        payload: Any,
        reply_to: str | None,
        new_steps: Sequence[NewStep],
        priority: int = 5,
        pickup_timeout: float,
        on_insert: Callable[[Connection, RunRow], None] | None = None,
    ) -> tuple[RunRow, bool, list[Notification]]:
        """Insert a run, its steps, its first event, its "received" notification and whatever
        ``on_insert`` writes, in one transaction. Returns ``(run, created, notifications)``; when the
        workflow already has a run for this business key nothing is written and the existing run is
        returned."""
        with self.engine.begin() as conn:
            row = conn.execute(self._insert_run, {
                "b_id": run_id, "b_workflow": workflow, "b_business_key": business_key, "b_payload": payload,
                "b_reply_to": reply_to, "b_priority": priority, "b_pickup": pickup_timeout,
            }).first()
            if row is None:
                existing = conn.execute(
                    select(runs).where(runs.c.workflow == workflow, runs.c.business_key == business_key)
                ).one()
                return _as(RunRow, existing), False, []
            run = _as(RunRow, row)
            conn.execute(
                _INSERT_STEPS,
                [
                    {
                        "run_id": run_id,
                        "position": position,
                        "name": s.name,
                        "agent": s.agent,
                        "action": s.action,
                        "timeout": s.timeout,
                        "max_failures": s.max_failures,
                        "idempotency_key": s.idempotency_key,
                        "undo": s.undo,
                        "attempt": 0,
                        "failure_count": 0,
                    }
                    for position, s in enumerate(new_steps)
                ],
            )
            tx = Tx(conn)
            tx.event(run_id, None, "transition", None, "pending", detail={"business_key": business_key})
            if reply_to is not None:
                tx.notify(run_id, reply_to, business_key, workflow, "received", state="pending")
            if on_insert is not None:
                on_insert(conn, run)
            tx.flush_events()
            return run, True, tx.outbox

    # -- reads ------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        return None if row is None else _as(RunRow, row)

    def find_run(self, workflow: str, business_key: str) -> RunRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(runs).where(runs.c.workflow == workflow, runs.c.business_key == business_key)
            ).first()
        return None if row is None else _as(RunRow, row)

    def get_steps(self, run_id: str) -> list[StepRow]:
        with self.engine.connect() as conn:
            return Tx(conn).steps_of(run_id)

    def get_events(self, run_id: str) -> list[EventRow]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.id))
            return [_as(EventRow, r) for r in rows]

    def list_runs(
        self, *, state: str | None = None, workflow: str | None = None, key: str | None = None, limit: int = 50
    ) -> list[RunRow]:
        """Newest first, filtered by state, workflow and a business-key prefix (``%`` and ``_`` in
        it are characters, not wildcards)."""
        query = select(runs).order_by(runs.c.created_at.desc()).limit(limit)
        if state is not None:
            query = query.where(runs.c.process_state == state)
        if workflow is not None:
            query = query.where(runs.c.workflow == workflow)
        if key is not None:
            escaped = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(runs.c.business_key.like(escaped + "%", escape="\\"))
        with self.engine.connect() as conn:
            return [_as(RunRow, r) for r in conn.execute(query)]

    def record_sweep(self, instance: str, recovered: int) -> None:
        """A Supervisor's heartbeat: one more sweep by ``instance``, now."""
        with self.engine.begin() as conn:
            conn.execute(self._record_sweep, {"b_instance": instance, "b_recovered": recovered})

    def count_runs_by_state(self) -> dict[str, int]:
        query = select(runs.c.process_state, func.count()).group_by(runs.c.process_state)
        with self.engine.connect() as conn:
            return {state: count for state, count in conn.execute(query)}

    def count_events(self, kind: str, run_id: str | None = None) -> int:
        query = select(func.count()).select_from(events).where(events.c.kind == kind)
        if run_id is not None:
            query = query.where(events.c.run_id == run_id)
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def now(self) -> float:
        """The database's clock, in epoch seconds."""
        with self.engine.connect() as conn:
            return float(conn.execute(select(db_now())).scalar_one())

    @contextmanager
    def listen_for_finished_runs(self) -> Iterator[Callable[[float], set[str]] | None]:
        """On PostgreSQL, yield ``wait(seconds) -> run ids`` that blocks until runs reach a terminal
        state (LISTEN/NOTIFY, on a connection of its own); elsewhere yield None."""
        if not self.is_postgresql:
            yield None
            return
        raw = self.engine.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()  # LISTEN and autocommit stay on this connection, never on a pooled one
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(f"LISTEN {RUN_DONE_CHANNEL}")

            def wait(seconds: float) -> set[str]:
                if select_module.select([conn], [], [], max(seconds, 0.0)) == ([], [], []):
                    return set()
                conn.poll()
                done = {note.payload for note in conn.notifies}
                conn.notifies.clear()
                return done

            yield wait
        finally:
            conn.close()

    # -- outbox -----------------------------------------------------------------------------

    def mark_sent(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        with self.engine.begin() as conn:
            conn.execute(update(outbox).where(outbox.c.id.in_(list(ids))).values(sent_at=db_now()))

    def unsent(self, older_than: float, limit: int) -> list[Notification]:
        """Notifications written more than ``older_than`` seconds ago and still not relayed."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(outbox.c.id, outbox.c.reply_to, outbox.c.body)
                .where(outbox.c.sent_at.is_(None), outbox.c.created_at < db_now() - older_than)
                .order_by(outbox.c.id)
                .limit(limit)
            ).all()
        return [Notification(int(i), reply_to, {"id": int(i), **body}) for i, reply_to, body in rows]


class Tx:
    """Transitions inside one transaction. Each returns whether this caller won the row."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        #: notifications written in this transaction, to relay once it commits
        self.outbox: list[Notification] = []
        self._events: list[dict[str, Any]] = []

    # -- history ----------------------------------------------------------------------------

    def event(
        self,
        run_id: str,
        position: int | None,
        kind: str,
        from_state: str | None,
        to_state: str | None,
        *,
        attempt: int | None = None,
        actor: str | None = None,
        detail: Any = None,
    ) -> None:
        """Append to the run's history; written with the transaction's other events, in one
        statement, just before it commits."""
        self._events.append({
            "run_id": run_id, "position": position, "kind": kind, "from_state": from_state,
            "to_state": to_state, "attempt": attempt, "actor": actor, "detail": detail,
        })

    def flush_events(self) -> None:
        if self._events:
            self.conn.execute(_INSERT_EVENTS, self._events)
            self._events = []

    def now(self) -> float:
        """The database's clock, in epoch seconds."""
        return float(self.conn.execute(select(db_now())).scalar_one())

    # -- runs -------------------------------------------------------------------------------

    def lock_run(self, run_id: str) -> RunRow | None:
        """Read the run and hold its row until commit (PostgreSQL), so that every transition of
        one run is serialised; on SQLite the whole write transaction already is."""
        row = self.conn.execute(_LOCK_RUN, {"b_run_id": run_id}).first()
        return None if row is None else _as(RunRow, row)

    def claim_pending_run(self, run_id: str, locked_by: str) -> RunRow | None:
        """pending → processing, locking the run, in one statement; None if it was not pending."""
        row = self.conn.execute(_CLAIM_RUN, {"b_run_id": run_id, "b_locked_by": locked_by}).first()
        if row is None:
            return None
        run = _as(RunRow, row)
        self.event(run_id, None, "transition", "pending", "processing", actor=locked_by)
        if run.reply_to is not None:
            self.notify(run_id, run.reply_to, run.business_key, run.workflow, "processing", state="processing")
        return run

    def finish_run(
        self,
        run_id: str,
        to_state: str,
        *,
        from_state: str = "processing",
        actor: str | None = None,
        error: str | None = None,
        failure_count: int | None = None,
        **extra: Any,
    ) -> bool:
        """processing → processed | error (or any ``from_state`` → ``to_state``)."""
        values: dict[str, Any] = {"locked_by": None, "complete_by": None, **extra}
        if error is not None:
            values["error"] = error
        if failure_count is not None:
            values["failure_count"] = failure_count
        won = self._update_run(run_id, from_state, to_state, **values)
        if won:
            detail = {"error": error} if error else None
            self.event(run_id, None, "transition", from_state, to_state, actor=actor, detail=detail)
        return won

    def count_run_failure(self, run_id: str) -> None:
        """The run's FailureCount: one more failed attempt of any of its steps."""
        self.conn.execute(
            update(runs).where(runs.c.id == run_id).values(failure_count=runs.c.failure_count + 1)
        )

    def _update_run(self, run_id: str, expected: str, new: str, **values: Any) -> bool:
        row = self.conn.execute(
            update(runs)
            .where(runs.c.id == run_id, runs.c.process_state == expected)
            .values(process_state=new, updated_at=db_now(), **values)
            .returning(runs.c.reply_to, runs.c.business_key, runs.c.workflow)
        ).first()
        if row is None:
            return False
        if row.reply_to is not None:
            self.notify(run_id, row.reply_to, row.business_key, row.workflow, new, state=new)
        if new in TERMINAL_RUN_STATES and self.conn.dialect.name == "postgresql":
            # Wakes every RunHandle.wait() LISTENing, when (and only if) this transaction commits.
            self.conn.execute(select(func.pg_notify(RUN_DONE_CHANNEL, run_id)))
        return True

    # -- alerts -------------------------------------------------------------------------------

    def record_alert(self, dedup_key: str, run_id: str, position: int | None, kind: str, attempt: int | None,
                     reason: str, actor: str, detail: dict[str, Any]) -> bool:
        """Store an alert once per ``dedup_key`` (and its event); False if it was raised before."""
        dialect_insert = postgresql.insert if self.conn.dialect.name == "postgresql" else sqlite.insert
        inserted = self.conn.execute(
            dialect_insert(alerts)
            .values(dedup_key=dedup_key, run_id=run_id, position=position, kind=kind, attempt=attempt,
                    reason=reason, at=db_now())
            .on_conflict_do_nothing(index_elements=["dedup_key"])
            .returning(alerts.c.id)
        ).first()
        if inserted is None:
            return False
        self.event(run_id, position, "alert", None, None, attempt=attempt, actor=actor, detail=detail)
        return True

    def at_risk_candidates(self, limit: int) -> list[StepRow]:
        """Running steps of live runs not yet past complete-by, most urgent first."""
        rows = self.conn.execute(
            select(steps)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.state == "running", steps.c.complete_by >= db_now(),
                   runs.c.process_state.in_(LIVE_RUN_STATES))
            .order_by(steps.c.complete_by)
            .limit(limit)
        )
        return [_as(StepRow, r) for r in rows]

    def completions_per_second(self, agent: str, window: float) -> float:
        """How fast ``agent`` has been completing steps: those completed in the last ``window``
        seconds, over the time since the first of them (not the whole window, so a burst that
        began a moment ago is not judged by the idle minute before it)."""
        count, first, now = self.conn.execute(
            select(func.count(), func.min(steps.c.completed_at), db_now())
            .where(steps.c.agent == agent, steps.c.completed_at >= db_now() - window)
        ).one()
        if not count:
            return 0.0
        return float(count) / max(float(now) - float(first), 1.0)

    # -- notifications --------------------------------------------------------------------------

    def notify(self, run_id: str, reply_to: str, business_key: str, workflow: str, kind: str,
               **detail: Any) -> Notification:
        """Write a progress notification in this transaction (relayed after the commit)."""
        body = {"run_id": run_id, "business_key": business_key, "workflow": workflow, "kind": kind, **detail}
        notification_id = self.conn.execute(
            insert(outbox)
            .values(run_id=run_id, reply_to=reply_to, body=body, created_at=db_now())
            .returning(outbox.c.id)
        ).scalar_one()
        note = Notification(int(notification_id), reply_to, {"id": int(notification_id), **body})
        self.outbox.append(note)
        return note

    # -- steps ------------------------------------------------------------------------------

    def steps_of(self, run_id: str) -> list[StepRow]:
        rows = self.conn.execute(
            select(steps).where(steps.c.run_id == run_id).order_by(steps.c.position)
        )
        return [_as(StepRow, r) for r in rows]

    def mark_step_running(self, step: StepRow, locked_by: str) -> StepRow | None:
        """not_started | pending → running with ``attempt + 1`` and ``complete_by = now + timeout``.

        Refused while a back-off (``not_before``) has not passed. Returns the step as dispatched,
        or None if another actor moved it first."""
        return self._mark_running(
            (steps.c.id == step.id, steps.c.state == step.state, steps.c.attempt == step.attempt), locked_by
        )

    def complete_and_advance(
        self, run_id: str, position: int, attempt: int, result: Any, locked_by: str
    ) -> tuple[RunRow, str, StepRow | None, bool] | None:
        """PostgreSQL's one-statement hot path (see ``_COMPLETE_AND_ADVANCE``): the run (as it was
        before), the name of the step completed, the next step now running (None if none is due),
        and whether the run is now processed. None when the step was not completed here (a stale
        reply, a run not processing or paused, an undo): take the general path."""
        row = self.conn.execute(_COMPLETE_AND_ADVANCE, {
            "b_run_id": run_id, "b_position": position, "b_attempt": attempt, "b_result": result,
            "b_locked_by": locked_by,
        }).first()
        if row is None or row.done_name is None:
            return None
        mapping = row._mapping
        run = RunRow(**{c: mapping[f"r_{c}"] for c in _RUN_COLUMNS})
        following = None if mapping["n_id"] is None else StepRow(**{c: mapping[f"n_{c}"] for c in _STEP_COLUMNS})
        finished = bool(row.finished)
        if run.reply_to is not None:  # the same notifications as the general path, in its order
            self.notify(run_id, run.reply_to, run.business_key, run.workflow, "step_completed",
                        step=row.done_name, position=position, attempt=attempt)
            if finished:
                self.notify(run_id, run.reply_to, run.business_key, run.workflow, "processed", state="processed")
        return run, row.done_name, following, finished

    def mark_next_running(self, run_id: str, position: int, locked_by: str) -> StepRow | None:
        """The hot path's shortcut: the workflow step at ``position``, not_started | pending →
        running, without reading the run's other steps first. None if it is not due."""
        row = self.conn.execute(
            _MARK_NEXT_RUNNING, {"b_run_id": run_id, "b_position": position, "b_locked_by": locked_by}
        )
        return self._dispatched(row.first(), locked_by)

    def _mark_running(self, where: tuple[Any, ...], locked_by: str) -> StepRow | None:
        now = db_now()
        row = self.conn.execute(
            update(steps)
            .where(*where, (steps.c.not_before.is_(None)) | (steps.c.not_before <= now))
            .values(
                state="running",
                attempt=steps.c.attempt + 1,
                locked_by=locked_by,
                complete_by=now + steps.c.timeout,
                not_before=None,
                updated_at=now,
            )
            .returning(*steps.c)
        ).first()
        return self._dispatched(row, locked_by)

    def _dispatched(self, row: Row[Any] | None, locked_by: str) -> StepRow | None:
        if row is None:
            return None
        running = _as(StepRow, row)
        # A first dispatch comes from not_started; any later one from pending (a retry, a deferral).
        previous = "not_started" if running.attempt == 1 and not running.is_undo else "pending"
        self.event(running.run_id, running.position, "transition", previous, "running", attempt=running.attempt,
                   actor=locked_by, detail={"complete_by": running.complete_by})
        return running

    def complete_step(
        self, run_id: str, position: int, attempt: int, result: Any, actor: str | None = None
    ) -> StepRow | None:
        """running → completed, only at the attempt that is still running (fenced)."""
        row = self.conn.execute(
            _COMPLETE_STEP, {"b_run_id": run_id, "b_position": position, "b_attempt": attempt, "b_result": result}
        ).first()
        if row is None:
            return None
        self.event(run_id, position, "transition", "running", "completed", attempt=attempt, actor=actor)
        return _as(StepRow, row)

    def running_step(self, run_id: str, position: int, attempt: int) -> StepRow | None:
        """The step at ``position`` if it is still running at ``attempt``."""
        row = self.conn.execute(
            select(steps).where(steps.c.run_id == run_id, steps.c.position == position,
                                steps.c.state == "running", steps.c.attempt == attempt)
        ).first()
        return None if row is None else _as(StepRow, row)

    def fail_step(
        self,
        run_id: str,
        position: int,
        attempt: int,
        error: str,
        *,
        actor: str | None = None,
        count_failure: bool = False,
    ) -> StepRow | None:
        """running → failed (fenced), optionally counting one more failure."""
        values: dict[str, Any] = {"error": error, "locked_by": None}
        if count_failure:
            values["failure_count"] = steps.c.failure_count + 1
        won = self._update_step(run_id, position, attempt, "running", "failed", **values)
        if won:
            self.event(
                run_id, position, "transition", "running", "failed",
                attempt=attempt, actor=actor, detail={"error": error},
            )
        return won

    def retry_step(
        self, step: StepRow, backoff: float, pickup_timeout: float, actor: str, reason: str
    ) -> StepRow | None:
        """running (expired, or its worker died) → pending: one more failure, LockedBy cleared, a
        back-off before the Scheduler may dispatch it again and a new complete-by for that pick-up."""
        now = db_now()
        won = self._update_step(
            step.run_id, step.position, step.attempt, "running", "pending",
            failure_count=steps.c.failure_count + 1,
            locked_by=None,
            not_before=now + backoff,
            complete_by=now + backoff + pickup_timeout,
        )
        if won:
            self.count_run_failure(step.run_id)
            self.event(
                step.run_id, step.position, "transition", "running", "pending",
                attempt=step.attempt, actor=actor,
                detail={"failure_count": step.failure_count + 1, "backoff": backoff, "reason": reason},
            )
        return won

    # -- compensation -------------------------------------------------------------------------

    def start_compensation(
        self,
        run: RunRow,
        reason: str,
        pickup_timeout: float,
        *,
        actor: str,
        cancelled_by: str | None = None,
    ) -> list[StepRow]:
        """``run.process_state`` → compensating, with one pending compensation row per step to
        undo, last step first. Returns the steps being undone (none: nothing changed).

        A step is undone if it has an undo action and its effect may have happened: it completed,
        it is still running or waiting for a retry (a late reply is fenced out), or the Supervisor
        failed it on expiry.
        A step the agent reported as a permanent failure did nothing, so it is not undone."""
        steps_now = self.steps_of(run.id)
        undoable = [
            s for s in reversed(steps_now)
            if not s.is_undo and s.undo is not None
            and (s.state in ("completed", "running") or (s.state == "pending" and s.attempt > 0)
                 or (s.state == "failed" and s.error == EXPIRED))
        ]
        if not undoable:
            return []
        values: dict[str, Any] = {"error": reason, "complete_by": None}
        if cancelled_by is not None:
            values["cancelled_by"] = cancelled_by
        if not self._update_run(run.id, run.process_state, "compensating", **values):
            return []
        self.event(run.id, None, "transition", run.process_state, "compensating", actor=actor,
                   detail={"reason": reason, "undo": [s.name for s in undoable]})
        now = db_now()
        first_free = len(steps_now)
        for offset, step in enumerate(undoable):
            self._update_step(run.id, step.position, step.attempt, step.state, "compensating")
            self.event(run.id, step.position, "transition", step.state, "compensating",
                       attempt=step.attempt, actor=actor)
            agent, _, action = (step.undo or "").partition(".")
            self.conn.execute(
                insert(steps).values(
                    run_id=run.id,
                    position=first_free + offset,
                    name=f"undo:{step.name}",
                    agent=agent,
                    action=action,
                    state="pending",
                    attempt=0,
                    complete_by=now + pickup_timeout,
                    timeout=step.timeout,
                    max_failures=step.max_failures,
                    failure_count=0,
                    idempotency_key=f"{step.idempotency_key}:undo",
                    compensates=step.position,
                    created_at=now,
                    updated_at=now,
                )
            )
        return undoable

    # -- operators ------------------------------------------------------------------------------

    def operator_event(self, run_id: str, position: int | None, action: str, by: str, reason: str) -> None:
        self.event(run_id, position, "operator", None, None, actor=by,
                   detail={"action": action, "by": by, "reason": reason})

    def reopen_run(self, run: RunRow, to_state: str, actor: str) -> bool:
        """error → processing | compensating, for an operator who fixed the cause."""
        won = self._update_run(run.id, run.process_state, to_state, error=None)
        if won:
            self.event(run.id, None, "transition", run.process_state, to_state, actor=actor)
        return won

    def resubmit_step(self, step: StepRow, pickup_timeout: float, actor: str, step_input: Any = None) -> bool:
        """failed → pending with its failure count reset (and an edited input, if given)."""
        now = db_now()
        values: dict[str, Any] = {
            "failure_count": 0, "not_before": None, "error": None, "locked_by": None,
            "complete_by": now + pickup_timeout,
        }
        if step_input is not None:
            values["input"] = step_input
        won = self._update_step(step.run_id, step.position, step.attempt, "failed", "pending", **values)
        if won:
            self.event(step.run_id, step.position, "transition", "failed", "pending", attempt=step.attempt, actor=actor)
        return won is not None

    def complete_by_hand(self, step: StepRow, result: Any, actor: str) -> bool:
        """not_started | pending | failed → completed, for a step an operator did by hand."""
        won = self._update_step(step.run_id, step.position, step.attempt, step.state, "completed",
                                result=result, locked_by=None, completed_at=db_now())
        if won:
            self.event(step.run_id, step.position, "transition", step.state, "completed", attempt=step.attempt,
                       actor=actor, detail={"by_hand": True})
        return won is not None

    def set_paused(self, run: RunRow, paused_by: str | None) -> bool:
        """Pause (``paused_by`` set) or resume (None) a pending or processing run."""
        condition = runs.c.paused_by.is_(None) if paused_by is not None else runs.c.paused_by.is_not(None)
        result = self.conn.execute(
            update(runs)
            .where(runs.c.id == run.id, runs.c.process_state.in_(("pending", "processing")), condition)
            .values(paused_by=paused_by, updated_at=db_now())
        )
        return result.rowcount == 1

    def mark_compensated(self, run_id: str, position: int, actor: str) -> None:
        """The step at ``position`` has been undone: compensating → compensated."""
        result = self.conn.execute(
            update(steps)
            .where(steps.c.run_id == run_id, steps.c.position == position, steps.c.state == "compensating")
            .values(state="compensated", updated_at=db_now())
        )
        if result.rowcount == 1:
            self.event(run_id, position, "transition", "compensating", "compensated", actor=actor)

    def defer_step(self, run_id: str, position: int, attempt: int, delay: float, pickup_timeout: float,
                   reason: str, actor: str) -> bool:
        """running → pending for ``delay`` seconds, its failure count untouched (the agent did not
        call its service, e.g. while its circuit breaker is open)."""
        now = db_now()
        won = self._update_step(run_id, position, attempt, "running", "pending", locked_by=None,
                                not_before=now + delay, complete_by=now + delay + pickup_timeout)
        if won:
            self.event(run_id, position, "transition", "running", "pending", attempt=attempt, actor=actor,
                       detail={"deferred": delay, "reason": reason})
        return won is not None

    def _update_step(
        self, run_id: str, position: int, attempt: int, expected: str, new: str, **values: Any
    ) -> StepRow | None:
        row = self.conn.execute(
            update(steps)
            .where(
                steps.c.run_id == run_id,
                steps.c.position == position,
                steps.c.state == expected,
                steps.c.attempt == attempt,
            )
            .values(state=new, updated_at=db_now(), **values)
            .returning(*steps.c)
        ).first()
        return None if row is None else _as(StepRow, row)

    # -- the Supervisor's reads ---------------------------------------------------------------

    def expired_steps(self, limit: int) -> list[StepRow]:
        """Running steps of processing runs whose complete-by has passed, oldest first, locked
        with ``SKIP LOCKED`` so that concurrent Supervisors take disjoint sets."""
        query = (
            select(steps)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(
                steps.c.state == "running",
                steps.c.complete_by < db_now(),
                runs.c.process_state.in_(LIVE_RUN_STATES),
            )
            .order_by(steps.c.complete_by)
            .limit(limit)
            .with_for_update(skip_locked=True, of=[steps, runs])
        )
        return [_as(StepRow, r) for r in self.conn.execute(query)]

    def requeue_stalled(self, pickup_timeout: float, limit: int, actor: str) -> list[str]:
        """Pending runs and pending steps that no Scheduler picked up by their complete-by (a lost
        message): push their complete-by forward and return their run ids to be re-enqueued."""
        now = db_now()
        stalled_runs = self.conn.execute(
            select(runs.c.id, runs.c.complete_by)
            .where(runs.c.process_state == "pending", runs.c.complete_by < now)
            .order_by(runs.c.complete_by)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        stalled_steps = self.conn.execute(
            select(steps.c.id, steps.c.run_id, steps.c.position, steps.c.attempt)
            .join(runs, runs.c.id == steps.c.run_id)
            .where(
                steps.c.state == "pending",
                steps.c.complete_by < now,
                runs.c.process_state.in_(LIVE_RUN_STATES),
            )
            .order_by(steps.c.complete_by)
            .limit(limit)
            .with_for_update(skip_locked=True, of=[steps, runs])
        ).all()
        requeued: list[str] = []
        for run_id, old in stalled_runs:
            result = self.conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.process_state == "pending", runs.c.complete_by == old)
                .values(complete_by=now + pickup_timeout, updated_at=now)
            )
            if result.rowcount == 1:
                self.event(run_id, None, "requeue", "pending", "pending", actor=actor)
                requeued.append(run_id)
        for step_id, run_id, position, attempt in stalled_steps:
            result = self.conn.execute(
                update(steps)
                .where(steps.c.id == step_id, steps.c.state == "pending", steps.c.attempt == attempt)
                .values(complete_by=now + pickup_timeout, updated_at=now)
            )
            if result.rowcount == 1:
                self.event(run_id, position, "requeue", "pending", "pending", attempt=attempt, actor=actor)
                requeued.append(run_id)
        return requeued


def dumps_payload(payload: Any) -> str:
    """Serialise a payload exactly as the store and the broker will, refusing NaN and non-JSON."""
    return json.dumps(payload, allow_nan=False, separators=(",", ":"), sort_keys=True)
