"""The :class:`Store`: the state store's handle. It opens transactions (:meth:`Store.begin`, which
yields a :class:`Tx` holding every transition), writes a submitted run, relays the outbox's
bookkeeping, records Supervisors' sweeps and at-risk looks, and measures this host's clock against
the database's."""

from __future__ import annotations

import json
import select as select_module
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from sqlalchemy import bindparam, delete, select, update

from sas_app.messaging.routing import Notification
from sas_app.store.audit import AuditQueries
from sas_app.store.breakers import StoreState
from sas_app.store.checkpoints import CheckpointQueries
from sas_app.store.children import ChildTx
from sas_app.store.compensation import CompensationTx
from sas_app.store.connection import Clock, db_now, dialect_insert, make_engine
from sas_app.store.diagnosis import Diagnosis
from sas_app.store.fan_out import FanOutTx
from sas_app.store.hot_path import HotPathTx
from sas_app.store.operations import OperationsTx
from sas_app.store.queries import Queries
from sas_app.store.rate_limits import StoreSlots
from sas_app.store.reruns import RerunTx
from sas_app.store.retention import RetentionQueries
from sas_app.store.retries import RetryTx
from sas_app.store.runs import RunTx
from sas_app.store.schedules import ScheduleTx
from sas_app.store.service_tables import looks, supervisors
from sas_app.store.signals import SignalTx
from sas_app.store.slots import SlotTx
from sas_app.store.steps import StepTx
from sas_app.store.submission import SubmissionTx
from sas_app.store.sweep import SweepTx
from sas_app.store.tables import outbox
from sas_app.store.tokens import TokenQueries
from sas_app.store.transitions import RUN_DONE_CHANNEL, TxBase
from sas_app.store.waits import WaitTx


class Tx(TxBase):
    """One transaction (see :meth:`Store.begin`): the history and notifications every transition
    writes (:class:`TxBase`), and each concern's statements under the name of its module in
    ``sas_app/store/`` — ``tx.runs.lock_run(...)`` is in ``runs.py``, ``tx.waits.start_sleep(...)``
    in ``waits.py``. Each is made on first use, once per transaction."""

    @cached_property
    def runs(self) -> RunTx:
        return RunTx(self)

    @cached_property
    def steps(self) -> StepTx:
        return StepTx(self)

    @cached_property
    def hot_path(self) -> HotPathTx:
        return HotPathTx(self, self.runs, self.steps, self.compensation)

    @cached_property
    def submission(self) -> SubmissionTx:
        return SubmissionTx(self)

    @cached_property
    def fan_out(self) -> FanOutTx:
        return FanOutTx(self, self.steps)

    @cached_property
    def children(self) -> ChildTx:
        return ChildTx(self, self.steps)

    @cached_property
    def waits(self) -> WaitTx:
        return WaitTx(self, self.runs, self.steps)

    @cached_property
    def signals(self) -> SignalTx:
        return SignalTx(self)

    @cached_property
    def slots(self) -> SlotTx:
        return SlotTx(self, self.runs)

    @cached_property
    def schedules(self) -> ScheduleTx:
        return ScheduleTx(self)

    @cached_property
    def compensation(self) -> CompensationTx:
        return CompensationTx(self, self.runs, self.steps)

    @cached_property
    def operations(self) -> OperationsTx:
        return OperationsTx(self, self.runs, self.steps)

    @cached_property
    def sweep(self) -> SweepTx:
        return SweepTx(self)

    @cached_property
    def retries(self) -> RetryTx:
        return RetryTx(self, self.steps)

    @cached_property
    def reruns(self) -> RerunTx:
        return RerunTx(self)


class Store(Queries, Diagnosis, RetentionQueries, TokenQueries, AuditQueries, CheckpointQueries):
    """The durable truth: runs, steps and their history. ``clock`` (SQLite only) replaces the
    database's clock, for tests that move time forward instead of waiting."""

    #: seconds between two measurements of this host's clock against the database's
    CLOCK_CHECK_INTERVAL = 60.0
    #: how long a measured offset serves while the database cannot be asked again
    CLOCK_OFFSET_KEPT = 3600.0

    def __init__(self, url: str, clock: Clock | None = None, *, prepared: bool = True) -> None:
        self.url = url
        self.engine = make_engine(url, clock, prepared=prepared)
        self._clock_offset = 0.0
        self._clock_checked: float | None = None
        insert_fn = dialect_insert(self.engine.dialect.name)
        recovered = bindparam("b_recovered", type_=supervisors.c.recovered.type)
        upsert = insert_fn(supervisors).values(instance=bindparam("b_instance"), sweeps=1, recovered=recovered,
                                               last_sweep_at=db_now())
        self._record_sweep = upsert.on_conflict_do_update(
            index_elements=["instance"],
            set_={"sweeps": supervisors.c.sweeps + 1, "recovered": supervisors.c.recovered + recovered,
                  "last_sweep_at": db_now()},
        )
        apart = bindparam("b_apart", type_=looks.c.at.type)
        self._take_look = insert_fn(looks).values(name=bindparam("b_name"), at=db_now()).on_conflict_do_update(
            index_elements=["name"], set_={"at": db_now()}, where=looks.c.at <= db_now() - apart,
        ).returning(looks.c.name)

    @property
    def is_postgresql(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def db_clock(self) -> float | None:
        """The database's clock, read as this host's clock plus its offset from the database's,
        measured at most a minute ago (one query then; none in between). While the database
        cannot be asked, the last offset measured serves for up to :attr:`CLOCK_OFFSET_KEPT`
        (hosts' clocks drift apart by milliseconds an hour); None when there is none that recent."""
        checked = self._clock_checked
        if checked is None or time.monotonic() - checked > self.CLOCK_CHECK_INTERVAL:
            try:
                before = time.time()
                database = self.now()
                after = time.time()
            except Exception:
                if checked is None or time.monotonic() - checked > self.CLOCK_OFFSET_KEPT:
                    return None
                return time.time() + self._clock_offset
            self._clock_offset = database - (before + after) / 2
            self._clock_checked = time.monotonic()
        return time.time() + self._clock_offset

    def dispose(self) -> None:
        self.engine.dispose()

    def breaker_state(self) -> StoreState:
        """Agents' circuit breakers kept here (when no Redis keeps them)."""
        return StoreState(self.engine)

    def rate_slots(self) -> StoreSlots:
        """Agents' rate limits kept here (when no Redis keeps them)."""
        return StoreSlots(self.engine)

    @contextmanager
    def begin(self) -> Iterator[Tx]:
        """One transaction: every transition made through the yielded :class:`Tx` commits together."""
        with self.engine.begin() as conn:
            tx = Tx(conn)
            yield tx
            tx.flush_events()

    @contextmanager
    def alone(self) -> Iterator[Tx]:
        """A :class:`Tx` on PostgreSQL whose every statement is a transaction of its own
        (autocommit), for a caller that writes in one statement: psycopg2 sends no ``BEGIN`` and
        no ``COMMIT``, two round trips fewer than the same statement in :meth:`begin`. Events and
        notifications written apart from a transition's statement are refused."""
        if not self.is_postgresql:
            raise RuntimeError("Store.alone() is for PostgreSQL, whose statements commit on their own")
        with self.engine.connect() as conn:
            # psycopg2's own switch, which sends nothing. SQLAlchemy's isolation_level="AUTOCOMMIT"
            # would send a SET default_transaction_isolation on every use of the pooled connection.
            driver: Any = conn.connection.driver_connection
            driver.autocommit = True
            try:
                tx = Tx(conn)
                tx.alone = True
                yield tx
                conn.commit()  # nothing is sent: each statement has committed
            finally:
                if not driver.closed:
                    driver.autocommit = False

    @contextmanager
    def listen_for_finished_runs(self) -> Iterator[Callable[[float], set[str]] | None]:
        """On PostgreSQL, yield ``wait(seconds) -> run ids`` that blocks until runs reach a terminal
        state (LISTEN/NOTIFY, on a connection of its own); elsewhere yield None."""
        if not self.is_postgresql:
            yield None
            return
        psycopg2 = self.engine.dialect.driver == "psycopg2"
        raw = self.engine.raw_connection()
        conn: Any = raw.driver_connection
        raw.detach()  # LISTEN and autocommit stay on this connection, never on a pooled one
        try:
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute(f"LISTEN {RUN_DONE_CHANNEL}")

            def wait(seconds: float) -> set[str]:
                if not psycopg2:  # psycopg 3: a generator of the notifications as they arrive
                    return {note.payload for note in conn.notifies(timeout=max(seconds, 0.0), stop_after=1)}
                if select_module.select([conn], [], [], max(seconds, 0.0)) == ([], [], []):
                    return set()
                conn.poll()
                done = {note.payload for note in conn.notifies}
                conn.notifies.clear()
                return done

            yield wait
        finally:
            conn.close()

    # -- the outbox and the Supervisors' heartbeats ------------------------------------------

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

    def take_look(self, name: str, apart: float) -> bool:
        """Whether a periodic look (``name``) is to be taken now: none was taken in the last
        ``apart`` seconds, by this process or another (the database's clock); if so, it is
        recorded as taken now. One statement; two processes asking at once, one of them is told
        yes (the row is locked until the first commits)."""
        with self.engine.begin() as conn:
            return conn.execute(self._take_look, {"b_name": name, "b_apart": apart}).first() is not None

    def record_sweep(self, instance: str, recovered: int, forget_after: float) -> None:
        """A Supervisor's heartbeat: one more sweep by ``instance``, now; the rows of Supervisors
        not heard from for ``forget_after`` seconds (stopped processes) deleted."""
        with self.engine.begin() as conn:
            conn.execute(self._record_sweep, {"b_instance": instance, "b_recovered": recovered})
            conn.execute(delete(supervisors).where(supervisors.c.last_sweep_at < db_now() - forget_after))


def dumps_payload(payload: Any) -> str:
    """Serialise a payload exactly as the store and the broker will, refusing NaN and non-JSON."""
    return json.dumps(payload, allow_nan=False, separators=(",", ":"), sort_keys=True)


def stored_object(value: Any, limit: int, what: str = "payload") -> Any:
    """``value`` as the store will hold it: a JSON object of at most ``limit`` bytes encoded.
    ``ValueError`` naming the problem otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    try:
        encoded = dumps_payload(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from None
    if len(encoded.encode()) > limit:
        raise ValueError(f"{what} is {len(encoded.encode())} bytes, over the {limit}-byte limit")
    return json.loads(encoded)


