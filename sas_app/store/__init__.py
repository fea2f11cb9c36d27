"""The state store: every SQL statement sas_app runs lives in this package, one concern a module.

``tables`` the schema; ``rows`` the rows handed out; ``connection`` the connection and the database's
clock; ``transitions`` the fenced transitions of runs and steps; ``submission`` writing a new run;
``hot_path`` and ``graph_path`` completing a step and starting what follows; ``fan_out`` a
``for_each`` step's; ``waits`` a sleep's or a wait's, ``signals`` the signals that end waits,
``slots`` one run at a time per key, ``schedules`` scheduled starts; ``compensation``,
``operations`` and ``sweep`` the transitions of undoing a run, of operators and the Supervisor's
queries; ``retention`` deleting old finished runs; ``breakers`` agents' circuit breakers;
``queries``, ``observe`` and ``diagnosis`` (what ``sas doctor`` checks) the read-only ones;
``database`` the :class:`Store` that opens transactions. Nothing here sends a message.
"""

from sas_app.store.connection import db_now, make_engine
from sas_app.store.database import Store, Tx, dumps_payload, stored_object
from sas_app.store.hot_path import Completion
from sas_app.store.rows import EventRow, NewStep, RunRow, SignalRow, StepRow
from sas_app.store.submission import NewRun
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
    "stored_object",
]
