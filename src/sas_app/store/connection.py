"""The database connection and its clock.

:func:`make_engine` tunes an engine for the state store; :class:`db_now` is the clock every
deadline is compared against. On PostgreSQL that is the server's ``statement_timestamp()``, so
hosts whose clocks disagree still agree on whether a complete-by has passed. On SQLite (one host,
the embedded default) it is SQLite's own ``julianday('now')``, or, when a test injects a clock it can
move forward instead of waiting, ``sas_now()``: a function of each connection of that engine (and
of no other: compiled statements are cached per engine) that calls the injected clock.

A test may inject a clock on PostgreSQL too, into a schema of its own whose ``statement_timestamp()``
reads the setting :data:`PG_CLOCK_SETTING` (``sas_app.testing`` makes one): each transaction of the
engine sets it from the clock first.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Double, Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from sas_app.store.prepared import install as install_prepared

Clock = Callable[[], float]

#: the SQL of the database's clock on PostgreSQL, for the statements written as text
PG_NOW = "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"
#: the PostgreSQL setting an injected clock's time is written to, each transaction
PG_CLOCK_SETTING = "sas.now"
#: what libpq is told for every PostgreSQL connection, unless the URL says otherwise: give up a
#: connect after 10 s; probe an idle connection after 30 s, every 10 s, three times; and give up on
#: a connection whose data has gone unacknowledged for 30 s (ms)
CONNECTION_LIMITS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                     "keepalives_count": 3, "tcp_user_timeout": 30_000}

#: the most PostgreSQL connections one process holds at once, which a worker of threads shares
#: among its slots
POOL_SIZE = 10


class db_now(FunctionElement[float]):
    """The database's clock, in epoch seconds: every deadline is compared against this."""

    type = Double()
    inherit_cache = True


def dialect_insert(dialect: str) -> Callable[..., Any]:
    """The INSERT construct of the store's database (``engine.dialect.name``), PostgreSQL's or
    SQLite's: each has ``on_conflict_do_update`` and ``on_conflict_do_nothing``, which plain
    SQLAlchemy's has not."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


@compiles(db_now)
def _db_now_sqlite(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    if getattr(compiler.dialect, "sas_injected_clock", False):
        return "sas_now()"
    # julianday('now') is fixed for the whole statement, to the millisecond
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_now, "postgresql")
def _db_now_postgresql(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    return PG_NOW


def make_engine(url: str, clock: Clock | None = None, *, prepared: bool = True) -> Engine:
    """An engine tuned for the state store: WAL and ``BEGIN IMMEDIATE`` on SQLite, so that
    concurrent worker processes serialise their writes instead of failing, and ``sas_now()`` on
    each SQLite connection reading ``clock`` when one is injected (on PostgreSQL, each transaction
    writing it to :data:`PG_CLOCK_SETTING`).

    On a server database connections are not pinged before use: that was one more round trip in
    every transaction, a fifth of a step's cost. After a PostgreSQL restart the first transaction
    on a stale connection fails, SQLAlchemy discards the pool, and what that transaction was doing
    is recovered like any lost message (the Supervisor's sweep).

    A PostgreSQL connection gives up on a server that stopped answering (:data:`CONNECTION_LIMITS`,
    each unless the URL sets it): a connect after 10 s, where libpq would wait without end for a
    server that accepted the connection and never answers (a hung server, a proxy whose backend is
    gone); a statement after 30 s unacknowledged, where a server that vanished from the network (a
    failover that moved its address, a host gone) would hold the worker slot for TCP's own
    fifteen-odd minutes. Neither limit cuts a long statement short: the server's kernel
    acknowledges the statement and answers the probes while it runs. Giving up is an error like
    any other lost connection: the transaction fails and what it was doing is retried or recovered.

    With ``prepared`` (SAS_PREPARED_STATEMENTS), the statements marked for it are prepared on
    each connection (see :mod:`~sas_app.store.prepared`), each under a name its text gives.
    psycopg 3 binds parameters on the client here (its ``ClientCursor``), as psycopg2 does: SQL
    ``EXECUTE`` takes no server-side parameters, and psycopg 3's own preparing, which a
    ``ClientCursor`` never does, names statements ``_pg3_0``, ``_pg3_1``… in each process, so
    behind a pooler in transaction mode a process could run another's statement of that name.

    A process's pool opens at most :data:`POOL_SIZE` connections, as it needs them, and keeps each
    one it opened (a submitter's ``handle.wait()`` on PostgreSQL takes one more for its LISTEN). A
    pool that closed the connections it kept over a smaller number (SQLAlchemy's ``max_overflow``)
    would, in a worker of threads with more slots than that, open a new connection every few
    dozen steps: a new PostgreSQL backend, and the statements prepared again."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        client_side = {"cursor_factory": _client_cursor()} if parsed.get_driver_name() == "psycopg" else {}
        engine = create_engine(url, pool_size=POOL_SIZE, max_overflow=0,
                               connect_args={**connection_limits(url), **client_side})
        if prepared and engine.dialect.driver in ("psycopg2", "psycopg"):
            install_prepared(engine)
        if clock is not None:
            _tell_the_time(engine, clock)
        return engine
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": 30})
    if clock is not None:
        engine.dialect.sas_injected_clock = True  # type: ignore[attr-defined]

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        if clock is not None:
            dbapi_connection.create_function("sas_now", 0, clock)
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


def _client_cursor() -> Any:
    """psycopg 3's cursor that binds parameters on the client (imported only for a psycopg URL)."""
    import psycopg

    return psycopg.ClientCursor


def connection_limits(url: str | URL, **override: Any) -> dict[str, Any]:
    """The ``connect_args`` of :data:`CONNECTION_LIMITS` for a libpq driver (psycopg2, psycopg),
    less those ``url`` sets itself, and ``override`` over both; none for another driver."""
    parsed = make_url(url)
    driver = parsed.get_driver_name()
    if parsed.get_backend_name() != "postgresql" or driver not in ("psycopg2", "psycopg"):
        return {}
    limits = {name: value for name, value in CONNECTION_LIMITS.items() if name not in parsed.query} | override
    if _libpq_version(driver) < 120000:  # tcp_user_timeout is libpq 12's: an older one refuses to connect
        limits.pop("tcp_user_timeout", None)
    return limits


def _libpq_version(driver: str) -> int:
    """The version of the libpq ``driver`` runs on (120000 for 12.0), 0 if it cannot say."""
    try:
        module: Any = import_module(driver)
        return int(module.__libpq_version__ if driver == "psycopg2" else module.pq.version())
    except (ImportError, AttributeError):
        return 0


def _tell_the_time(engine: Engine, clock: Clock) -> None:
    """Each transaction on ``engine`` first sets :data:`PG_CLOCK_SETTING` to ``clock``'s time, for
    a test schema's ``statement_timestamp()`` to read. A connection whose ``statement_timestamp()``
    is PostgreSQL's own is refused: the clock would be ignored."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("SELECT 'statement_timestamp()'::regprocedure::oid = 'pg_catalog.statement_timestamp()'"
                       "::regprocedure::oid")
        own = cursor.fetchone()[0]
        cursor.close()
        dbapi_connection.rollback()
        if own:
            raise ValueError("a clock injected on PostgreSQL needs a schema whose statement_timestamp() reads "
                             f"{PG_CLOCK_SETTING} (sas_app.testing.Environment makes one); this database keeps "
                             "its own clock")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(f"SELECT set_config('{PG_CLOCK_SETTING}', '{float(clock())!r}', false)")
