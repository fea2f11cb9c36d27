"""The audit trail in the store (both stores): append-only, kept apart from the runs' retention,
and deleted only by its own."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from sas_app.interfaces.access import Actor
from sas_app.interfaces.retention import purge
from sas_app.states import Role

pytestmark = pytest.mark.both_stores

ANN = Actor("ann", Role.OPERATOR, "api", "10.0.0.7")


def test_no_statement_can_update_a_row_of_the_trail(sas):
    with sas.audit.acting(ANN, "pause", run_id="r1", reason="checking"):
        pass
    with pytest.raises(DBAPIError, match="append-only"), sas.store.engine.begin() as conn:
        conn.execute(text("UPDATE audit SET actor = 'mallory'"))
    [row] = sas.store.audit_rows()
    assert (row.actor, row.role, row.via, row.origin, row.action, row.outcome) == \
        ("ann", "operator", "api", "10.0.0.7", "pause", "done")


def test_the_runs_retention_keeps_the_trail_and_the_trails_own_deletes_only_old_rows(sas, pump, env):
    handle = sas.submit("three", {}, business_key="kept-in-trail")
    pump.run()
    with sas.audit.acting(ANN, "cancel", run_id=handle.id):
        pass
    env.clock.advance(40 * 86400)
    assert purge(sas.store, 30 * 86400, ["processed"]).runs == 1
    assert [r.run_id for r in sas.store.audit_rows()] == [handle.id]
    with sas.audit.acting(ANN, "resume", run_id="newer"):
        pass
    assert sas.store.purge_audit(30 * 86400, 100) == 1
    assert [r.run_id for r in sas.store.audit_rows()] == ["newer"]
