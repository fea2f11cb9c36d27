"""The whole schema on one ``MetaData``, as Alembic compares it with the migrations: the tables of
runs (:mod:`sas_app.store.tables`), the service's own (:mod:`sas_app.store.service_tables`) and
who may act and what they did (:mod:`sas_app.store.access_tables`)."""

from __future__ import annotations

from sas_app.store.access_tables import api_tokens, audit
from sas_app.store.service_tables import breakers, checkpoints, looks, rate_limits, schedules, supervisors
from sas_app.store.tables import alerts, events, metadata, outbox, runs, signals, steps

#: every table, the runs' and the service's, each on ``metadata``
TABLES = (runs, steps, events, signals, outbox, alerts, schedules, supervisors, looks, breakers, rate_limits,
          checkpoints, api_tokens, audit)

__all__ = ["TABLES", "metadata"]
