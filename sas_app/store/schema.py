"""The whole schema on one ``MetaData``, as Alembic compares it with the migrations: the tables of
runs (:mod:`sas_app.store.tables`) and the service's own (:mod:`sas_app.store.service_tables`)."""

from __future__ import annotations

from sas_app.store.service_tables import breakers, looks, schedules, supervisors
from sas_app.store.tables import alerts, events, metadata, outbox, runs, signals, steps

#: every table, the runs' and the service's, each on ``metadata``
TABLES = (runs, steps, events, signals, outbox, alerts, schedules, supervisors, looks, breakers)

__all__ = ["TABLES", "metadata"]
