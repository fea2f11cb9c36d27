"""Statements PostgreSQL plans once per connection instead of on every call.

PostgreSQL plans a statement every time it runs one, unless it was prepared. The hot path's
statement (complete a step, start the next: :mod:`~sas_app.store.hot_path`) costs more to plan
than to run. A statement run with the execution option ``sas_prepare=True`` is therefore, on a
psycopg2 or psycopg 3 connection, prepared (``PREPARE``) the first time that connection runs it,
and run with ``EXECUTE`` from then on, so PostgreSQL reuses its plan. A prepared statement
outlives a rolled-back transaction and dies with its connection, so each connection prepares its
own, once.

The hot statements (:func:`rows`) go one step further: they run their ``EXECUTE`` on the DBAPI
cursor of the transaction's connection, not through SQLAlchemy's execution. SQLAlchemy's own
execution of a statement built once (its compiled-cache lookup, execution context, result object
and row) costs the client as much CPU as psycopg2 and the network together, on every statement of
the hot path. The statement's text, parameters and result types are worked
out once per statement and engine (by SQLAlchemy, from the same construct), SQLAlchemy's cursor
events still fire (``before_cursor_execute``, ``after_cursor_execute``, with no execution context),
and a DBAPI error (or an interrupt) is handed to SQLAlchemy's own error handling (wrapped, the
connection and its pool invalidated on a disconnect). Skipped there: the statement-level
``before_execute``/``after_execute`` events, ``echo`` logging and psycopg2's server notices. A
statement SQLAlchemy would rewrite at execution (an expanding ``IN``, a Python-side default) goes
through SQLAlchemy as before.

Behind a connection pooler in transaction mode (PgBouncer), a session's prepared statements do
not follow it from one transaction to the next: set ``SAS_PREPARED_STATEMENTS=false`` there. Were
it left on, the first statement that missed its preparation (or met another client's) fails like
any failed transaction — its message is retried, or the Supervisor recovers the step — the
connection is dropped and this process stops preparing, with an error in its log naming the setting.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql.base import Executable

log = logging.getLogger(__name__)

#: the execution option that marks a statement to prepare
PREPARE = "sas_prepare"
#: ``statement.execution_options(**PREPARED)``
PREPARED = {PREPARE: True}
#: SQLSTATEs of a prepared statement missing, or already there under its name: a pooler moved us
_POOLED = ("26000", "42P05")
#: "cached plan must not change result type": the tables changed under a prepared statement
_STALE_PLAN = "0A000"
_PARAMETER = re.compile(r"%\((\w+)\)s")


#: the statement each prepared name stands for, as SQLAlchemy built it
_BUILT: dict[str, str] = {}


def built(sent: str) -> str:
    """The statement as built of one sent to the cursor: ``sent`` itself, or, for the ``EXECUTE``
    of a statement prepared here, the statement it runs (what a reader of the log wants to see)."""
    if sent.startswith("EXECUTE sas_"):
        return _BUILT.get(sent.split()[1].split("(")[0], sent)
    return sent


@lru_cache(maxsize=64)
def _forms(statement: str) -> tuple[str, str, str]:
    """The prepared name of a psycopg2 statement (``%(name)s`` parameters), its ``PREPARE`` and
    the ``EXECUTE`` that runs it with the same parameters."""
    order: dict[str, int] = {}
    for name in _PARAMETER.findall(statement):
        order.setdefault(name, len(order) + 1)
    name = "sas_" + hashlib.sha1(statement.encode()).hexdigest()[:16]
    _BUILT[name] = statement
    body = _PARAMETER.sub(lambda m: f"${order[m[1]]}", statement).replace("%%", "%")
    arguments = ", ".join(f"%({p})s" for p in order)
    return name, f"PREPARE {name} AS {body}", f"EXECUTE {name}({arguments})" if order else f"EXECUTE {name}"


#: a statement's columns, and the result processors (by column index) of those that need one
_Described = tuple[tuple[str, ...], tuple[tuple[int, Callable[[Any], Any]], ...]]


@dataclass
class Preparing:
    """Whether an engine's connections prepare the statements marked for it — on from
    :func:`install` until a pooler is found to lose them — and what :func:`rows` worked out of
    each statement it ran on that engine's cursors."""

    on: bool = True
    shapes: dict[int, tuple[Executable, _Shape | None]] = field(default_factory=dict)
    #: columns and result processors of a statement's rows, by its prepared name (each set once,
    #: whole, from the first cursor's description)
    described: dict[str, _Described] = field(default_factory=dict)


def _preparing(dialect: Dialect) -> Preparing | None:
    return getattr(dialect, "sas_preparing", None)


def _prepare_once(conn: Connection, cursor: Any, name: str, prepare: str) -> None:
    """``PREPARE`` ``name`` on ``conn``'s DBAPI connection unless it was already (a prepared
    statement outlives a rolled-back transaction and dies with its connection, whose ``info`` goes
    with it)."""
    prepared: set[str] = conn.info.setdefault("sas_prepared", set())
    if name not in prepared:
        cursor.execute(prepare)
        prepared.add(name)


def install(engine: Engine) -> None:
    """Prepare the statements marked ``sas_prepare`` on ``engine``'s connections (psycopg2, or
    psycopg 3 binding parameters on the client), and let :func:`rows` run them on the cursor."""
    state = Preparing()
    engine.dialect.sas_preparing = state  # type: ignore[attr-defined]

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _execute(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> Any:
        if executemany or context is None or not state.on or not context.execution_options.get(PREPARE):
            return statement, parameters
        name, prepare, execute = _forms(statement)
        _prepare_once(conn, cursor, name, prepare)
        return execute, parameters

    @event.listens_for(engine, "handle_error")
    def _failed(ctx: Any) -> None:
        context = ctx.execution_context
        ours = (context.execution_options.get(PREPARE) if context is not None
                else str(ctx.statement or "").startswith(("EXECUTE sas_", "PREPARE sas_")))  # see rows()
        if not ours:
            return
        # psycopg2 calls it pgcode, psycopg 3 sqlstate
        code = getattr(ctx.original_exception, "pgcode", None) or getattr(ctx.original_exception, "sqlstate", None)
        if code in _POOLED:
            if state.on:
                log.error("a prepared statement was missing on its connection (%s): a pooler in transaction "
                          "mode sits in front of PostgreSQL; this process prepares no more statements. Set "
                          "SAS_PREPARED_STATEMENTS=false there", code)
            state.on = False
        if code in (*_POOLED, _STALE_PLAN):  # start again on a connection of its own
            ctx.is_disconnect = True
            ctx.invalidate_pool_on_disconnect = False


@dataclass(frozen=True)
class _Shape:
    """What running one statement on the cursor needs, worked out once: its prepared forms, the
    values SQLAlchemy fills in itself, the parameters a caller must give, its parameters' and its
    columns' types."""

    name: str
    prepare: str
    execute: str
    defaults: dict[str, Any]
    required: frozenset[str]
    binds: dict[str, Callable[[Any], Any]]
    types: dict[str, Any]


def _shape(state: Preparing, statement: Executable, dialect: Dialect) -> _Shape | None:
    """``statement``'s shape on this engine, or None if it must go through SQLAlchemy: not marked
    for preparing, or rewritten by SQLAlchemy at execution (an expanding ``IN``, a literal rendered
    then, a Python-side default, a bind whose value is computed by a callable)."""
    found = state.shapes.get(id(statement))
    if found is not None and found[0] is statement:
        return found[1]
    shape = None
    options = statement.get_execution_options()
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    rewritten = (compiled.post_compile_params or compiled.literal_execute_params or compiled.escaped_bind_names
                 or compiled.insert_prefetch or compiled.update_prefetch
                 or any(bind.callable is not None for bind in compiled.binds.values()))
    if options.get(PREPARE) and not rewritten:
        name, prepare, execute = _forms(compiled.string)
        binds = {}
        for bind_name, bind in compiled.binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                binds[bind_name] = process
        required = frozenset(bind_name for bind_name, bind in compiled.binds.items() if bind.required)
        types = {column.name: column.type for column in getattr(statement, "exported_columns", ())}
        shape = _Shape(name, prepare, execute, compiled.construct_params(_check=False), required, binds, types)
    state.shapes[id(statement)] = (statement, shape)
    return shape


def rows(conn: Connection, statement: Executable, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Run ``statement`` (one built once, marked :data:`PREPARED`) with ``parameters`` in
    ``conn``'s transaction and return its rows, each a dict by column name. Where ``conn``
    prepares (SAS_PREPARED_STATEMENTS on), on its DBAPI cursor (see the module's
    docstring); otherwise through SQLAlchemy."""
    state = _preparing(conn.dialect)
    shape = _shape(state, statement, conn.dialect) if state is not None and state.on else None
    if state is None or shape is None:
        result = conn.execute(statement, dict(parameters))
        return [dict(row._mapping) for row in result] if result.returns_rows else []
    missing = shape.required.difference(parameters)
    if missing:
        raise ValueError(f"a value is required for the parameter(s) {', '.join(sorted(missing))}")
    values = {**shape.defaults, **parameters}
    for name, process in shape.binds.items():
        values[name] = process(values[name])
    if not conn.in_transaction():  # as SQLAlchemy's own execution would: so that commit() commits
        conn.begin()
    sql: str = shape.prepare
    cursor = conn.connection.cursor()
    try:
        _prepare_once(conn, cursor, shape.name, shape.prepare)
        sql = shape.execute
        for before in conn.dispatch.before_cursor_execute:
            sql, values = before(conn, cursor, sql, values, None, False)
        cursor.execute(sql, values)
        for after in conn.dispatch.after_cursor_execute:
            after(conn, cursor, sql, values, None, False)
        if cursor.description is None:
            return []
        fetched = cursor.fetchall()
        described = state.described.get(shape.name)
        if described is None:
            described = state.described[shape.name] = _describe(shape, cursor.description, conn.dialect)
    except BaseException as exc:
        # SQLAlchemy's own handling of what its execution would hand it: a DBAPI error wrapped as
        # a DBAPIError, the connection (and the pool, on a disconnect) invalidated, install's
        # handle_error told; an interrupt mid-statement taken as a disconnect. Anything else (a
        # Celery time limit) goes on as it is.
        if isinstance(exc, conn.dialect.loaded_dbapi.Error) or not isinstance(exc, Exception):
            conn._handle_dbapi_exception(exc, sql, values, cursor, None)
        raise
    finally:
        cursor.close()
    columns, processors = described
    out = []
    for fetched_row in fetched:
        values_of = list(fetched_row)
        for index, process in processors:
            values_of[index] = process(values_of[index])
        out.append(dict(zip(columns, values_of, strict=True)))
    return out


def _describe(shape: _Shape, description: Any, dialect: Dialect) -> _Described:
    """The statement's columns, and the result processors of those whose values need one."""
    columns = tuple(d[0] for d in description)
    processors = []
    for index, (name, type_code, *_rest) in enumerate(description):
        column_type = shape.types.get(name)
        process = column_type.dialect_impl(dialect).result_processor(dialect, type_code) if column_type else None
        if process is not None:
            processors.append((index, process))
    return columns, tuple(processors)
