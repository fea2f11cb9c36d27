"""Alerts reach the operator per incident: the steps one sweep fails for one cause (the same step
of the same workflow: its agent down, say) are told as one alert with a count, while each is still
stored once with its own run."""

from __future__ import annotations

from sqlalchemy import select

from sas_app import Step, Workflow
from sas_app.store.tables import alerts
from tests.support import expire


def test_steps_failed_together_by_one_sweep_are_told_as_one_alert(sas, pump):
    told = []
    sas.alerts.hook = told.append
    sas.register(Workflow("once", [Step("call", "svc.work", timeout=0.3, max_failures=1)]))
    runs = [sas.submit("once", {"script": {"call": ["hang"]}}, business_key=f"down-{i}").id for i in range(4)]
    pump.run()
    for run_id in runs:
        expire(sas, run_id)

    sas.supervisor.sweep()

    assert [sas.get_run(r).process_state for r in runs] == ["error"] * 4
    assert len(told) == 1
    alert = told[0]
    assert (alert.kind, alert.count, sorted(alert.runs)) == ("failed", 4, sorted(runs))
    assert alert.reason.startswith("4 steps of once at step 'call' raised 'failed' at once; the first: ")
    with sas.store.engine.connect() as conn:
        stored = conn.execute(select(alerts.c.run_id).where(alerts.c.kind == "failed")).scalars().all()
    assert sorted(stored) == sorted(runs)


def test_a_single_failure_is_told_as_it_is(sas, pump):
    told = []
    sas.alerts.hook = told.append
    sas.register(Workflow("once", [Step("call", "svc.work", timeout=0.3, max_failures=1)]))
    run_id = sas.submit("once", {"script": {"call": ["hang"]}}, business_key="alone").id
    pump.run()
    expire(sas, run_id)
    sas.supervisor.sweep()
    assert [(a.kind, a.count, a.runs) for a in told] == [("failed", 1, ())]
    assert told[0].reason.startswith("step 'call' passed its complete-by 1 times")
