"""Statements PostgreSQL plans once per connection instead of on every call.

PostgreSQL plans a statement every time it runs one, unless it was prepared. The hot path's
statement (complete a step, start the next: :mod:`~sas_app.store.hot_path`) costs more to plan
than to run — 0.8 ms of planning for 0.75 ms of execution, a third of the database's CPU per step.
A statement run with the execution option ``sas_prepare=True`` is therefore, on a psycopg2
connection, prepared (``PREPARE``) the first time that connection runs it, and run with ``EXECUTE``
from then on, so PostgreSQL reuses its plan. A prepared statement outlives a rolled-back
transaction and dies with its connection, so each connection prepares its own, once.

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
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, event

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


@lru_cache(maxsize=64)
def _forms(statement: str) -> tuple[str, str, str]:
    """The prepared name of a psycopg2 statement (``%(name)s`` parameters), its ``PREPARE`` and
    the ``EXECUTE`` that runs it with the same parameters."""
    order: dict[str, int] = {}
    for name in _PARAMETER.findall(statement):
        order.setdefault(name, len(order) + 1)
    name = "sas_" + hashlib.sha1(statement.encode()).hexdigest()[:16]
    body = _PARAMETER.sub(lambda m: f"${order[m[1]]}", statement).replace("%%", "%")
    arguments = ", ".join(f"%({p})s" for p in order)
    return name, f"PREPARE {name} AS {body}", f"EXECUTE {name}({arguments})" if order else f"EXECUTE {name}"


def install(engine: Engine) -> None:
    """Prepare the statements marked ``sas_prepare`` on ``engine``'s connections (psycopg2)."""
    state = {"on": True}

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _execute(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> Any:
        if executemany or context is None or not state["on"] or not context.execution_options.get(PREPARE):
            return statement, parameters
        name, prepare, execute = _forms(statement)
        prepared = conn.info.setdefault("sas_prepared", set())
        if name not in prepared:
            cursor.execute(prepare)
            prepared.add(name)
        return execute, parameters

    @event.listens_for(engine, "handle_error")
    def _failed(ctx: Any) -> None:
        context = ctx.execution_context
        if context is None or not context.execution_options.get(PREPARE):
            return
        code = getattr(ctx.original_exception, "pgcode", None)
        if code in _POOLED:
            if state["on"]:
                log.error("a prepared statement was missing on its connection (%s): a pooler in transaction "
                          "mode sits in front of PostgreSQL; this process prepares no more statements. Set "
                          "SAS_PREPARED_STATEMENTS=false there", code)
            state["on"] = False
        if code in (*_POOLED, _STALE_PLAN):  # start again on a connection of its own
            ctx.is_disconnect = True
            ctx.invalidate_pool_on_disconnect = False
