"""The state store: every SQL statement sas_app runs lives in this package, one concern a module.

``database`` the :class:`Store` and the :class:`Tx` it opens. A transaction's statements are
grouped by concern, each reached by its module's name: ``tx.runs`` and ``tx.steps`` the fenced
transitions of runs and steps; ``tx.submission`` writing a new run; ``tx.hot_path`` (with
``graph_path``) completing a step and starting what follows; ``tx.fan_out`` a ``for_each`` step's;
``tx.waits`` a sleep's or a wait's; ``tx.signals`` the signals that end waits; ``tx.children``
child runs; ``tx.slots`` one run at a time per key; ``tx.schedules`` scheduled starts;
``tx.compensation`` undoing a run; ``tx.operations`` an operator's; ``tx.sweep`` and
``tx.retries`` the Supervisor's. ``transitions`` is what they share: the history and the
notifications each writes.

Outside a transaction: ``tables`` the schema; ``rows`` the rows handed out; ``connection`` the
connection and the database's clock; ``prepared`` and ``recordset`` statements prepared once and
rows sent as one parameter; ``queries``, ``observe`` and ``diagnosis`` (what ``sas doctor``
checks) the read-only ones; ``retention`` deleting old finished runs; ``breakers`` and ``rate_limits`` agents'
circuit breakers and rate limits; ``migrate`` the schema's migrations. Nothing here sends a message.
"""

from sas_app.store.connection import db_now, make_engine
from sas_app.store.database import Store, Tx, dumps_payload, stored_object
from sas_app.store.hot_path import Completion
from sas_app.store.rows import EventRow, NewStep, RunRow, SignalRow, StepRow
from sas_app.store.submission import NewRun, starts_in_one_statement
from sas_app.store.transitions import RUN_DONE_CHANNEL

__all__ = [
    "RUN_DONE_CHANNEL",
    "Completion",
    "EventRow",
    "NewRun",
    "NewStep",
    "RunRow",
    "SignalRow",
    "StepRow",
    "Store",
    "Tx",
    "db_now",
    "dumps_payload",
    "make_engine",
    "starts_in_one_statement",
    "stored_object",
]
