"""The pattern's escalation at a step's failure threshold: the step waits an extended period (in
the store, woken by the sweep), makes its escalation's retries, and only then undoes the run or
leaves it in error — one alert on each rung. On SQLite here (half an hour on the injected clock)
and, as integration tests, on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from sas_app import Escalate, Step, Workflow
from sas_app.errors import WorkflowDefinitionError
from sas_app.store.tables import alerts
from tests.support import backoff_over, expire, pass_time, sweep_after_expiry

pytestmark = pytest.mark.both_stores


def _workflow(sas, then: str) -> str:
    wait = timedelta(minutes=30)
    name = f"escalating_{then}"
    sas.register(Workflow(name, [
        Step("first", "svc.work", timeout=0.3, compensate="svc.undo"),
        Step("flaky", "svc.work", timeout=0.3, max_failures=2, compensate="svc.undo",
             on_exhausted=Escalate(wait=wait, retries=1, then=then)),
    ]))
    return name


def _alerts(sas, run_id: str) -> list[str]:
    with sas.store.engine.connect() as conn:
        return list(conn.execute(select(alerts.c.kind).where(alerts.c.run_id == run_id).order_by(alerts.c.id))
                    .scalars())


@pytest.mark.parametrize("then, script, state, undone", [
    ("compensate", ["hang", "hang", "hang"], "compensated", True),
    ("error", ["hang", "hang", "hang"], "error", False),
    ("compensate", ["hang", "hang", "ok"], "processed", False),  # the fault was resolved meanwhile
])
def test_a_step_at_its_threshold_waits_retries_then_gives_up(sas, pump, then, script, state, undone):
    handle = sas.submit(_workflow(sas, then), {"script": {"flaky": script}}, business_key="e1")
    sweep_after_expiry(sas, pump, handle.id)  # attempt 1 expires: retried after a back-off
    expire(sas, handle.id)  # attempt 2 too: the threshold
    sas.supervisor.sweep()
    flaky = handle.status().step("flaky")
    assert (flaky.state, flaky.escalated, flaky.attempt) == ("pending", 1, 2)
    assert _alerts(sas, handle.id) == ["escalated"]
    assert [m for q in pump.queues() for m in pump.take(q)] == []  # no delayed message: the sweep wakes it
    sas.supervisor.sweep()
    pump.run()
    assert handle.status().step("flaky").attempt == 2  # not yet: the extended wait is not over

    pass_time(sas, flaky.not_before, "the extended wait")
    sas.supervisor.sweep()  # its complete-by is the end of the wait: the Scheduler is asked again
    pump.run()
    assert handle.status().step("flaky").attempt == 3
    if script[2] == "hang":
        sweep_after_expiry(sas, pump, handle.id)
        backoff_over(sas, handle.id)
        pump.run()
    view = handle.status()
    assert view.process_state == state
    assert any(s.name == "undo:flaky" for s in view.steps) == undone
    expected = ["escalated"] if state == "processed" else ["escalated", "failed"]
    assert _alerts(sas, handle.id) == expected
    if state != "processed":
        assert f"again after waiting {flaky.not_before - flaky.updated_at:g} s; then: {then}" in view.run.error
    if state == "error":  # an operator's resubmit starts the step afresh: its escalation too
        sas.resubmit(handle.id, by="ops", step="flaky")
        assert handle.status().step("flaky").escalated == 0


@pytest.mark.parametrize("escalate, message", [
    (Escalate(wait=-5), "Escalate wait must be more than 0 and at most"),
    (Escalate(wait=timedelta(days=40)), "at most 2.592e\\+06 seconds"),
    (Escalate(wait=60, retries=0), "retries must be an integer from 1 to the step's max_failures \\(3\\), got 0"),
    (Escalate(wait=60, then="retry"), "then must be 'compensate' or 'error', got 'retry'"),
    ("later", "on_exhausted must be an Escalate"),
])
def test_an_escalation_that_cannot_be_is_refused_when_registered(sas, escalate, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        sas.register(Workflow("bad", [Step("a", "svc.work", on_exhausted=escalate)]))
    assert "bad" not in sas.workflows
