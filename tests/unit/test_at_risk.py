"""At-risk warnings reach the operator as one alert per queue and sweep, not one per step: a
backlog of many steps is one incident. Each step is still recorded with its own run, once."""

from __future__ import annotations

from sqlalchemy import func, select

from sas_app.store.tables import alerts
from tests.support import pass_time


def test_the_steps_of_one_queue_found_at_risk_by_a_sweep_are_told_as_one_alert(sas, pump):
    told = []
    sas.alerts.hook = told.append
    runs = [sas.submit("three", {}, business_key=f"backlog-{i}").id for i in range(5)]
    pump.run(["sas.scheduler"])  # each run's first step dispatched: five messages wait for svc
    first = [sas.store.get_steps(run_id)[0] for run_id in runs]
    assert {s.state for s in first} == {"running"}
    # no consumer has taken any for more than half their budget: at risk
    pass_time(sas, max(s.complete_by - s.timeout * 0.4 for s in first), "half the steps' budget to pass")

    assert len(sas.supervisor.sweep().at_risk) == 5
    assert len(told) == 1
    alert = told[0]
    assert (alert.kind, alert.count, alert.workflow) == ("at_risk", 5, "three")
    assert sorted(alert.runs) == sorted(runs)
    assert alert.reason.startswith("5 steps waiting on sas.agent.svc are likely to miss their complete-by; the first:")
    assert alert.as_dict()["runs"] == list(alert.runs)
    with sas.store.engine.connect() as conn:  # each step's own record, once
        assert conn.execute(select(func.count()).select_from(alerts).where(alerts.c.kind == "at_risk")).scalar() == 5

    assert sas.supervisor.sweep().at_risk == [] and len(told) == 1  # the same steps: nothing new
