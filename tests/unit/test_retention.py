"""Retention: finished runs that ended long enough ago are deleted with every row of theirs, in
bounded batches; a run not finished, a recent one, one in error (unless named) and a child whose
parent still runs are kept. On SQLite here and, as integration tests, on PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from sas_app import SasApp
from sas_app.interfaces.retention import parse_duration, parse_states, purge
from sas_app.messaging.routing import PURGE
from sas_app.store.tables import alerts, events, outbox, signals, steps
from tests.support import pass_time

pytestmark = pytest.mark.both_stores


def rows_of(sas, run_id: str) -> int:
    with sas.store.engine.connect() as conn:
        return sum(conn.execute(select(func.count()).select_from(t).where(t.c.run_id == run_id)).scalar_one()
                   for t in (steps, events, alerts, outbox, signals))


def test_old_finished_runs_go_with_every_row_of_theirs_and_nothing_else_does(sas, pump):
    done = sas.submit("three", {}, business_key="done", reply_to="replies")
    undone = sas.submit("saga", {"script": {"third": ["permanent"]}}, business_key="undone")
    failed = sas.submit("three", {"script": {"second": ["permanent"]}}, business_key="failed")
    waiting = sas.submit("claim", {}, business_key="waiting")
    parent = sas.submit("parent", {"script": {"after": ["hang"]}}, business_key="parent")  # still running
    pump.run()
    sas.signal(waiting.id, "approval", {"approved": True})
    sas.signal(waiting.id, "approval", {"approved": False})  # recorded, ignored: still a row of its own
    pump.run()
    assert [h.status().process_state for h in (done, undone, failed, waiting)] == [
        "processed", "compensated", "error", "processed"]
    assert rows_of(sas, done.id) and rows_of(sas, undone.id) and rows_of(sas, waiting.id)
    [child] = sas.store.children(parent.id)
    last = max(r.updated_at for r in sas.store.list_runs(limit=100))
    pass_time(sas, last + 0.5, "the runs to be old enough")
    recent = sas.submit("three", {}, business_key="recent")
    pump.run()

    kept = {done.id: False, undone.id: False, waiting.id: False, failed.id: True, recent.id: True, parent.id: True,
            child.id: True}  # the child has ended, but its parent has not
    assert child.process_state == "processed"
    assert sas.store.count_purgeable(0.5, parse_states("processed,compensated,cancelled")) == 3
    result = purge(sas.store, 0.5, ["processed", "compensated", "cancelled"], batch=2)  # two batches
    assert result.runs == 3 and result.rows > 3
    for run_id, stays in kept.items():
        assert (sas.store.get_run(run_id) is not None) == stays, run_id
    assert rows_of(sas, done.id) == rows_of(sas, undone.id) == rows_of(sas, waiting.id) == 0
    assert purge(sas.store, 0.5, ["error"]).runs == 1  # only when named
    assert sas.store.get_run(failed.id) is None


def test_durations_and_states_are_checked():
    assert parse_duration("30d") == 30 * 86400 and parse_duration("12h") == 43200 and parse_duration("90") == 90
    with pytest.raises(ValueError, match="'soon' is not a duration"):
        parse_duration("soon")
    with pytest.raises(ValueError, match="states must be finished ones"):
        parse_states("processing")


def test_sas_retention_adds_a_beat_schedule(settings):
    from dataclasses import replace

    assert PURGE not in SasApp(settings).celery.conf.beat_schedule
    app = SasApp(replace(settings, retention="30d"))
    assert app.celery.conf.beat_schedule[PURGE]["task"] == PURGE
    with pytest.raises(ValueError, match="is not a duration"):
        SasApp(replace(settings, retention="a month"))


def test_a_purge_forgets_idle_rate_limit_schedules_and_keeps_busy_ones(sas):
    slots = sas.store.rate_slots()
    now = sas.store.now()
    assert slots.reserve("sas:rate:pay:quiet-tenant", 0.1, 1.0) == (True, 0.0)
    assert slots.reserve("sas:rate:pay:busy-tenant", 7200.0, 1.0) == (True, 0.0)  # free again in two hours
    assert slots.reserve("sas:rate:pay:busy-tenant", 7200.0, 1.0)[0] is False  # turned away: a line
    pass_time(sas, now + 3700, "an hour and more")

    done = purge(sas.store, 30 * 86400, ["processed"])
    assert (done.runs, done.schedules) == (0, 1)
    from sas_app.store.service_tables import rate_limits

    with sas.store.engine.connect() as conn:
        left = sorted(conn.execute(select(rate_limits.c.key)).scalars())
    assert left == ["sas:rate-line:pay:busy-tenant", "sas:rate:pay:busy-tenant"]
    # the quiet tenant is as free as before, the busy one as busy
    assert slots.reserve("sas:rate:pay:quiet-tenant", 0.1, 1.0) == (True, 0.0)
    assert slots.reserve("sas:rate:pay:busy-tenant", 7200.0, 1.0)[0] is False
