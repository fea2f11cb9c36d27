"""The service's own tables, beside the runs': schedules' last ticks, the Supervisors' sweeps and
looks, and agents' circuit breakers kept in the store. Times are the database's clock, as in
:mod:`sas_app.store.tables`."""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Column, Double, String, Table

from sas_app.store.tables import metadata

# One row per schedule (``SasApp.schedule``): the last tick it started a run for (or skipped), so a
# tick is handled once whichever beat sends it, and ticks missed while beat was down are found.
schedules = Table(
    "schedules",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("last_tick", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
)


# One row per Supervisor process: how many sweeps it made and when it last swept, for the
# dashboard ("is a Supervisor alive?") and the sweeps metric. One UPSERT per sweep.
supervisors = Table(
    "supervisors",
    metadata,
    Column("instance", String(200), primary_key=True),
    Column("sweeps", BigInteger, nullable=False),
    Column("recovered", BigInteger, nullable=False),
    Column("last_sweep_at", Double, nullable=False),
)

# When each kind of periodic look was last taken (the database's clock): one row, the at-risk
# watch's. Each Supervisor worker looks, and a look held up arrives beside the next; the one that
# finds the last less than half an interval ago is skipped (see sas_app.supervision.forecast.watch).
# One UPSERT per look.
looks = Table(
    "looks",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("at", Double, nullable=False),
)

#: Agents' circuit breakers, when no Redis holds them (see sas_app.agents.breaker): a few keys per
#: agent; ``expires_at`` (the database's clock) for the probe lock only.
breakers = Table(
    "breakers",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("value", String(100), nullable=False),
    Column("expires_at", Double),
)

#: Agents' rate limits shared by the fleet, when no Redis holds them (see
#: sas_app.agents.rate_limit): one row per limit (per agent, or per agent and key), when its next
#: free slot starts (the database's clock), and one per limit's line of refused calls; a purge
#: deletes those idle for an hour.
rate_limits = Table(
    "rate_limits",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("next_at", Double, nullable=False),
)

#: How far a reader of the events table has counted (the dashboard's Prometheus counters:
#: sas_app.web.metrics): the id of the last event counted and the counts, by the reader's name. A
#: dashboard started over a long history resumes from it instead of reading the history whole.
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("last_id", BigInteger, nullable=False),
    Column("state", JSON, nullable=False),
    Column("at", Double, nullable=False),
)

__all__ = ["breakers", "checkpoints", "looks", "rate_limits", "schedules", "supervisors"]
