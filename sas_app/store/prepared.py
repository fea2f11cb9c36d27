"""Statements PostgreSQL plans once per connection instead of on every call.

PostgreSQL plans a statement every time it runs one, unless it was prepared. The hot path's
statement (complete a step, start the next: :mod:`~sas_app.store.hot_path`) costs more to plan
than to run — 0.8 ms of planning for 0.75 ms of execution, a third of the database's CPU per step.
A statement run with the execution option ``sas_prepare=True`` is therefore, on a psycopg2
connection, prepared (``PREPARE``) the first time that connection runs it, and run with ``EXECUTE``
from then on, so PostgreSQL reuses its plan. A prepared statement outlives a rolled-back
transaction and dies with its connection, so each connection prepares its own, once.

The hot statements (:func:`rows`) go one step further: they run their ``EXECUTE`` on the DBAPI
cursor of the transaction's connection, not through SQLAlchemy's execution. SQLAlchemy's own
execution of a statement built once (its compiled-cache lookup, execution context, result object
and row) cost 0.15-0.2 ms of the client's CPU a statement, as much as psycopg2 and the network:
five of them a run on the hot path. The statement's text, parameters and result types are worked
out once per statement (by SQLAlchemy, from the same construct), SQLAlchemy's cursor events still
fire (``before_cursor_execute``, ``after_cursor_execute``), and a DBAPI error is handed to
SQLAlchemy's own error handling (wrapped, the connection invalidated on a disconnect).

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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql.base import Executable

log = logging.getLogger("sas.store")

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


@dataclass
class Preparing:
    """Whether an engine's connections prepare the statements marked for it: on from
    :func:`install` until a pooler is found to lose them."""

    on: bool = True


def _preparing(dialect: Dialect) -> Preparing | None:
    return getattr(dialect, "sas_preparing", None)


def _prepared_names(conn: Connection) -> set[str]:
    """The statements prepared on ``conn``'s DBAPI connection (they live and die with it)."""
    names: set[str] = conn.info.setdefault("sas_prepared", set())
    return names


def install(engine: Engine) -> None:
    """Prepare the statements marked ``sas_prepare`` on ``engine``'s connections (psycopg2)."""
    state = Preparing()
    engine.dialect.sas_preparing = state  # type: ignore[attr-defined]

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _execute(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> Any:
        if executemany or context is None or not state.on or not context.execution_options.get(PREPARE):
            return statement, parameters
        name, prepare, execute = _forms(statement)
        prepared = _prepared_names(conn)
        if name not in prepared:
            cursor.execute(prepare)
            prepared.add(name)
        return execute, parameters

    @event.listens_for(engine, "handle_error")
    def _failed(ctx: Any) -> None:
        context = ctx.execution_context
        ours = (context.execution_options.get(PREPARE) if context is not None
                else str(ctx.statement or "").startswith(("EXECUTE sas_", "PREPARE sas_")))  # see rows()
        if not ours:
            return
        code = getattr(ctx.original_exception, "pgcode", None)
        if code in _POOLED:
            if state.on:
                log.error("a prepared statement was missing on its connection (%s): a pooler in transaction "
                          "mode sits in front of PostgreSQL; this process prepares no more statements. Set "
                          "SAS_PREPARED_STATEMENTS=false there", code)
            state.on = False
        if code in (*_POOLED, _STALE_PLAN):  # start again on a connection of its own
            ctx.is_disconnect = True
            ctx.invalidate_pool_on_disconnect = False


@dataclass
class _Shape:
    """What running one statement on the cursor needs, worked out once: its prepared forms, the
    values SQLAlchemy fills in itself, its parameters' and (after its first run) its columns' types."""

    name: str
    prepare: str
    execute: str
    defaults: dict[str, Any]
    binds: dict[str, Callable[[Any], Any]]
    types: dict[str, Any]
    #: its columns, and the result processors of those whose values need one (set once, whole:
    #: a worker's threads may run the statement for the first time together)
    described: tuple[tuple[str, ...], tuple[tuple[int, Callable[[Any], Any]], ...]] | None = None


_SHAPES: dict[tuple[int, str], tuple[Executable, _Shape]] = {}


def _shape(statement: Executable, dialect: Dialect) -> _Shape:
    key = (id(statement), dialect.name)
    found = _SHAPES.get(key)
    if found is not None and found[0] is statement:
        return found[1]
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    name, prepare, execute = _forms(compiled.string)
    binds = {}
    for bind_name, bind in compiled.binds.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            binds[bind_name] = process
    types = {column.name: column.type for column in getattr(statement, "exported_columns", ())}
    shape = _Shape(name, prepare, execute, compiled.construct_params(_check=False), binds, types)
    _SHAPES[key] = (statement, shape)
    return shape


def rows(conn: Connection, statement: Executable, parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Run ``statement`` (one marked :data:`PREPARED`) with ``parameters`` in ``conn``'s transaction
    and return its rows, each a dict by column name. Where ``conn`` prepares (psycopg2,
    SAS_PREPARED_STATEMENTS on), on its DBAPI cursor (see the module's docstring); otherwise
    through SQLAlchemy."""
    state = _preparing(conn.dialect)
    if state is None or not state.on:
        result = conn.execute(statement, dict(parameters))
        return [dict(row._mapping) for row in result] if result.returns_rows else []
    shape = _shape(statement, conn.dialect)
    values = {**shape.defaults, **parameters}
    for name, process in shape.binds.items():
        values[name] = process(values[name])
    sql: str = shape.execute
    cursor = conn.connection.cursor()
    try:
        prepared = _prepared_names(conn)
        if shape.name not in prepared:
            sql = shape.prepare
            cursor.execute(sql)
            prepared.add(shape.name)
            sql = shape.execute
        for before in conn.dispatch.before_cursor_execute:
            sql, values = before(conn, cursor, sql, values, None, False)
        cursor.execute(sql, values)
        for after in conn.dispatch.after_cursor_execute:
            after(conn, cursor, sql, values, None, False)
        if cursor.description is None:
            return []
        fetched = cursor.fetchall()
        if shape.described is None:
            shape.described = _describe(shape, cursor.description, conn.dialect)
    except conn.dialect.loaded_dbapi.Error as exc:
        # SQLAlchemy's own handling: wrapped as a DBAPIError, the connection (and the pool, on a
        # disconnect) invalidated, the handle_error events (install's) told
        conn._handle_dbapi_exception(exc, sql, values, cursor, None)
    finally:
        cursor.close()
    assert shape.described is not None
    columns, processors = shape.described
    out = []
    for fetched_row in fetched:
        values_of = list(fetched_row)
        for index, process in processors:
            values_of[index] = process(values_of[index])
        out.append(dict(zip(columns, values_of, strict=True)))
    return out


def _describe(shape: _Shape, description: Any,
              dialect: Dialect) -> tuple[tuple[str, ...], tuple[tuple[int, Callable[[Any], Any]], ...]]:
    """The statement's columns, and the result processors of those whose values need one."""
    columns = tuple(d[0] for d in description)
    processors = []
    for index, (name, type_code, *_rest) in enumerate(description):
        column_type = shape.types.get(name)
        process = column_type.dialect_impl(dialect).result_processor(dialect, type_code) if column_type else None
        if process is not None:
            processors.append((index, process))
    return columns, tuple(processors)
