"""The hot path's statements prepared on PostgreSQL (SAS_PREPARED_STATEMENTS), and kombu's Redis
transport keeping one client per channel: what a user relies on is that runs go through either
way, that a pooler which loses prepared statements costs one transaction and not the service,
and that the broker still shows (and Flower reads) its URL as redis://."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import redis
from kombu import Connection, Queue
from kombu.common import ignore_errors
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError

from sas_app import SasApp, Settings, migrate
from sas_app.store import Store
from sas_app.store.hot_path import START_NEW_RUN
from sas_app.store.prepared import PREPARE, rows
from sas_app.store.recordset import rows_parameter
from sas_app.store.steps import MARK_NEXT_RUNNING
from sas_app.store.transitions import INSERT_EVENTS_JSON
from tests.support import Pump, through_psycopg_3
from tests.testapp import install_test_workflows

pytestmark = pytest.mark.integration


def sent(store: Store) -> list[str]:
    """Every statement the store sends to PostgreSQL from now on (as sent: EXECUTE when prepared)."""
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *args: statements.append(statement))
    return statements


@pytest.mark.parametrize("prepared", [True, False])
def test_runs_go_through_with_prepared_statements_on_and_off(db_url, tmp_path, prepared):
    settings = Settings(database_url=db_url, broker_url="memory://localhost/", home=tmp_path, task_events=False,
                        prepared_statements=prepared, inline_replies=False)
    app = SasApp(settings)
    install_test_workflows(app, timeout=10)
    app.migrate()
    statements = sent(app.store)
    pump = Pump(app)
    pump.purge()
    try:
        handles = [app.submit("three", {}, business_key=f"p-{i}") for i in range(3)]
        pump.run()

        assert [app.get_run(h.id).process_state for h in handles] == ["processed"] * 3
        executed = [s for s in statements if s.startswith("EXECUTE sas_")]
        prepares = [s for s in statements if s.startswith("PREPARE sas_")]
        if prepared:  # every reply ran the one statement, prepared once on the one connection used
            assert len(executed) >= 3 * 3 and len({p.split()[1] for p in prepares}) == len(prepares)
        else:
            assert executed == [] and prepares == []
    finally:
        app.store.dispose()


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg 3"])
def test_a_pooler_that_loses_prepared_statements_costs_one_transaction(db_url, caplog, driver):
    url = db_url if driver == "psycopg2" else through_psycopg_3(db_url)
    migrate(url)
    store = Store(url)
    statements = sent(store)
    try:
        with store.begin() as tx:
            assert tx.runs.lock_run("no-such-run") is None  # prepared on the pool's one connection
        with store.engine.connect() as conn:  # what a pooler in transaction mode does to a session
            conn.exec_driver_sql("DEALLOCATE ALL")
            conn.commit()

        with caplog.at_level(logging.ERROR, logger="sas_app.store.prepared"), \
                pytest.raises(DBAPIError, match="does not exist"):
            with store.begin() as tx:
                tx.runs.lock_run("no-such-run")

        assert "Set SAS_PREPARED_STATEMENTS=false" in caplog.text
        statements.clear()
        with store.begin() as tx:  # a fresh connection, and nothing prepared from now on
            assert tx.runs.lock_run("no-such-run") is None
        assert statements and not any(s.startswith(("EXECUTE", "PREPARE")) for s in statements)
    finally:
        store.dispose()


def test_a_worker_of_threads_keeps_its_connections(db_url):
    """Eight slots of a worker of threads (``-P threads -c 8``) in transactions at once, then all
    idle, twenty times: they open eight connections once and keep them, where a pool that closed
    what it held idle over five opened three new backends each time (each preparing the hot
    statements again)."""
    migrate(db_url)
    store = Store(db_url)
    slots, rounds = 8, 20
    together = threading.Barrier(slots, timeout=30)
    backends: list[int] = []

    def slot() -> None:
        for _ in range(rounds):
            with store.begin() as tx:
                assert tx.runs.lock_run("no-such-run") is None
                backends.append(tx.conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
                together.wait()  # every slot holds a connection
            together.wait()  # every slot has given its connection back

    try:
        threads = [threading.Thread(target=slot) for _ in range(slots)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(backends) == slots * rounds
        assert len(set(backends)) == slots
    finally:
        store.dispose()


def test_the_hot_path_on_the_cursor_hands_a_pooler_that_lost_its_statements_to_the_same_handling(db_url, caplog):
    """The hot statements run their EXECUTE on the DBAPI cursor, past SQLAlchemy's execution:
    a statement missing on the connection must still cost one transaction and stop the preparing."""
    migrate(db_url)
    store = Store(db_url)
    statements = sent(store)
    try:
        with store.begin() as tx:
            assert tx.hot_path.start_new_run("no-such-run", "test") == (None, None)
        assert any(s.startswith("EXECUTE sas_") for s in statements)  # the cursor's, seen by the events too
        with store.engine.connect() as conn:
            conn.exec_driver_sql("DEALLOCATE ALL")
            conn.commit()

        with caplog.at_level(logging.ERROR, logger="sas_app.store.prepared"), \
                pytest.raises(DBAPIError, match="does not exist"):
            with store.begin() as tx:
                tx.hot_path.start_new_run("no-such-run", "test")

        assert "Set SAS_PREPARED_STATEMENTS=false" in caplog.text
        statements.clear()
        with store.begin() as tx:
            assert tx.hot_path.start_new_run("no-such-run", "test") == (None, None)
        assert statements and not any(s.startswith(("EXECUTE", "PREPARE")) for s in statements)
    finally:
        store.dispose()


def test_the_hot_path_on_a_dropped_connection_fails_one_transaction_and_the_next_reconnects(db_url, tmp_path):
    """A PostgreSQL restart (here: every connection of the store's terminated) under the hot path on
    the cursor: the transaction fails as SQLAlchemy's would (a DBAPIError saying the connection was
    invalidated, nothing written), and the next one runs on a new connection."""
    app = SasApp(Settings(database_url=db_url, broker_url="memory://localhost/", home=tmp_path, task_events=False,
                          inline_replies=False))
    install_test_workflows(app, timeout=10)
    app.migrate()
    pump = Pump(app)
    pump.purge()
    try:
        before = app.submit("three", {}, business_key="before-drop")
        with app.store.engine.connect() as conn:
            database = conn.exec_driver_sql("SELECT current_database()").scalar_one()
        admin = Store(db_url)
        with admin.engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = %(db)s AND pid <> pg_backend_pid()", {"db": database})
            conn.commit()
        admin.dispose()

        with pytest.raises(DBAPIError) as failed:
            app.submit("three", {}, business_key="dropped")
        assert failed.value.connection_invalidated
        after = app.submit("three", {}, business_key="after-drop")
        pump.run()

        assert [app.get_run(h.id).process_state for h in (before, after)] == ["processed"] * 2
        assert app.store.find_run("three", "dropped") is None
    finally:
        app.store.dispose()


def test_the_cursor_path_keeps_what_sqlalchemys_execution_promises(db_url):
    """rows() skips SQLAlchemy's execution, not its promises: a missing parameter is refused before
    anything is sent, a statement SQLAlchemy rewrites at execution (an expanding IN) still runs
    through it, and on a connection with no transaction begun the write is committed by commit()."""
    migrate(db_url)
    store = Store(db_url)
    on_cursor: list[bool] = []  # per statement sent: run on the cursor (no execution context)?
    event.listen(store.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, parameters, context, many: on_cursor.append(context is None))
    try:
        with store.begin() as tx, pytest.raises(ValueError, match="b_locked_by"):
            rows(tx.conn, START_NEW_RUN, {"b_run_id": "no-such-run"})
        assert on_cursor == []
        with store.begin() as tx:  # state IN (...) is expanded by SQLAlchemy: not on the cursor
            assert rows(tx.conn, MARK_NEXT_RUNNING, {"b_run_id": "x", "b_position": 0, "b_locked_by": "t"}) == []
        assert on_cursor == [False]
        on_cursor.clear()
        with store.engine.connect() as conn:
            rows(conn, INSERT_EVENTS_JSON, rows_parameter([{"run_id": "r-1", "position": None, "kind": "test",
                                                             "from_state": None, "to_state": None, "attempt": None,
                                                             "actor": "t", "detail": None}]))
            conn.commit()
        assert on_cursor == [True] and [e.kind for e in store.get_events("r-1")] == ["test"]
    finally:
        store.dispose()


def test_the_setting_reads_from_the_environment():
    assert Settings.from_env({"SAS_PREPARED_STATEMENTS": "false"}).prepared_statements is False
    assert Settings.from_env({}).prepared_statements is True


def kill_connections_on_its_database(redis_url: str) -> int:
    """Close every client connection on the database of ``redis_url`` (this test's own number):
    the other tests' connections, on theirs, live on. How many were closed."""
    admin = redis.Redis.from_url(redis_url)
    db, me = admin.connection_pool.connection_kwargs.get("db", 0), admin.client_id()
    killed = 0
    for client in admin.client_list():
        if int(client["db"]) == db and int(client["id"]) != me:
            killed += admin.client_kill_filter(_id=client["id"])
    admin.close()
    return killed


def test_the_redis_broker_shows_as_redis_and_survives_its_connections_being_killed(redis_url, tmp_path):
    app = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", broker_url=redis_url, home=tmp_path))
    queue = Queue("sas.test.kept-client")
    with app.celery.connection_for_write() as conn:
        assert conn.as_uri().startswith("redis://")  # worker banners and Flower's broker page read this
        assert type(conn.transport).__module__ == "sas_app.messaging.redis_transport"
        producer = conn.Producer()
        producer.publish({"n": 1}, routing_key=queue.name, declare=[queue])
        assert kill_connections_on_its_database(redis_url) >= 1  # the producer's among them
        producer.publish({"n": 2}, routing_key=queue.name, declare=[queue], retry=True)
        received: list[Any] = []
        with Connection(redis_url) as plain, plain.SimpleQueue(queue) as simple:
            for _ in range(2):
                message = simple.get(timeout=5)
                received.append(message.payload)
                message.ack()
    assert received == [{"n": 1}, {"n": 2}]


def test_prepared_statements_find_their_rows_by_key_whatever_plan_they_were_prepared_with(db_url, tmp_path):
    """A prepared statement keeps the plan it got on a young, small table. The hot path's join with
    its locked run was once planned as a scan of every step, prepared early and never replanned:
    3,300 rows read a step at 1,500 runs, PostgreSQL's CPU a step more than doubled. Here every
    prepared statement runs with the generic plan PostgreSQL makes for an empty table."""
    settings = Settings(database_url=db_url, broker_url="memory://localhost/", home=tmp_path, task_events=False,
                        inline_replies=False)
    app = SasApp(settings)
    install_test_workflows(app, timeout=10)
    app.migrate()
    def generic_plans(dbapi: Any, record: Any) -> None:
        dbapi.cursor().execute("SET plan_cache_mode = force_generic_plan")
        dbapi.commit()  # a session setting, kept whatever the first transaction does

    event.listen(app.store.engine, "connect", generic_plans)
    app.store.engine.dispose()
    scans: list[int] = []

    def seq_scans(cursor: Any) -> int:
        reader = cursor.connection.cursor()
        reader.execute("SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables "
                       "WHERE relname IN ('steps', 'runs')")
        return reader.fetchone()[0]

    @event.listens_for(app.store.engine, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        # a statement marked for it goes through SQLAlchemy's execution (context) or, on the hot
        # path, straight to the cursor (no context): either way it must go as EXECUTE
        if statement.startswith("EXECUTE sas_") or (context is not None and context.execution_options.get(PREPARE)):
            assert statement.startswith("EXECUTE sas_"), statement  # prepared, so on its generic plan
            conn.info["scans_before"] = seq_scans(cursor)

    @event.listens_for(app.store.engine, "after_cursor_execute")
    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "scans_before" in conn.info:
            scans.append(seq_scans(cursor) - conn.info.pop("scans_before"))

    pump = Pump(app)
    pump.purge()
    try:
        handles = [app.submit(workflow, {}, business_key=f"scan-{i}") for i in range(8)
                   for workflow in ("three", "diamond")]
        pump.run()

        assert [app.get_run(h.id).process_state for h in handles] == ["processed"] * 16
        assert len(scans) >= 8 * 3 + 8 * 4 and set(scans) == {0}, scans  # each reply at least
    finally:
        app.store.dispose()


def test_a_channel_closed_after_its_connection_raises_only_what_celery_ignores(redis_url, tmp_path):
    """Seen in a chaos run: Redis killed while a worker held unacknowledged messages; Celery's
    consumer closed its connection's transport, then the channel, which tried to put those messages
    back through a pool it could no longer build (its transport had no URL left): an AttributeError,
    which Celery takes as unrecoverable — the worker exited. It must be a connection error, which
    Celery ignores there and reconnects after; the messages stay in Redis's unacked set, which the
    next consumer restores after the visibility timeout."""
    app = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 's.db'}", broker_url=redis_url, home=tmp_path))
    queue = Queue("sas.test.closing")
    conn = app.celery.connection_for_write()
    channel = conn.default_channel
    conn.Producer(channel).publish({"n": 1}, routing_key=queue.name, declare=[queue])
    assert channel.basic_get(queue.name, no_ack=False) is not None  # delivered, not acknowledged
    transport = conn.transport
    channel._disconnect_pools()  # the channel's pools gone with the broker connection
    transport.client = None  # the connection's transport closed before the channel (kombu's collect)

    ignore_errors(conn, channel.close)  # as Celery's consumer closes it: no exception may get out

    assert redis.Redis.from_url(redis_url).hlen("unacked") == 1
