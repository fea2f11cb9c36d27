"""A deadline for the whole run: past it the Supervisor raises one alert, starts no further step
and undoes the run (or, with nothing to undo, puts it in error). On SQLite here (hours on the
injected clock) and, as integration tests, on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from sas_app import InvalidOperation, Step, WaitFor, Workflow
from sas_app.errors import WorkflowDefinitionError
from sas_app.store.tables import alerts
from tests.support import pass_time

pytestmark = pytest.mark.both_stores


def _claim(sas) -> str:
    deadline = timedelta(hours=2)
    sas.register(Workflow("due_claim", [Step("file", "svc.work", timeout=5, compensate="svc.undo"),
                                        WaitFor("manager", "approval", timeout=86400),
                                        Step("pay", "svc.work", timeout=5)], deadline=deadline))
    return "due_claim"


def _alerts(sas, run_id: str) -> list[tuple[str, str]]:
    with sas.store.engine.connect() as conn:
        return [(kind, reason) for kind, reason in conn.execute(
            select(alerts.c.kind, alerts.c.reason).where(alerts.c.run_id == run_id))]


def test_a_run_past_its_deadline_is_undone_with_one_alert(sas, pump):
    handle = sas.submit(_claim(sas), {}, business_key="d1")
    pump.run()
    view = handle.status()
    assert view.run.deadline == pytest.approx(view.run.created_at + 7200, abs=0.01)
    sas.supervisor.sweep()
    pump.run()
    assert handle.status().process_state == "processing"  # not yet

    pass_time(sas, view.run.deadline, "the deadline")
    sas.supervisor.sweep()
    sas.supervisor.sweep()  # a second sweep changes nothing more
    pump.run()
    view = handle.status()
    assert view.process_state == "compensated"
    assert (view.step("undo:file").state, view.step("manager").state, view.step("pay").state) == (
        "completed", "stopped", "not_started")
    [(kind, reason)] = _alerts(sas, handle.id)
    assert kind == "deadline" and reason == "run passed its deadline (7200 s after it was submitted)"
    assert "deadline" in view.run.error


def test_a_run_never_picked_up_before_its_deadline_goes_to_error(sas, pump):
    handle = sas.submit(_claim(sas), {}, business_key="d2")
    pump.purge()  # the Scheduler's message lost, and no step ran
    pass_time(sas, handle.status().run.deadline, "the deadline")
    sas.supervisor.sweep()
    pump.run()
    view = handle.status()
    assert view.process_state == "error" and "passed its deadline" in view.run.error
    assert [k for k, _ in _alerts(sas, handle.id)] == ["deadline"]


def test_a_run_never_picked_up_before_its_deadline_can_be_resubmitted_and_then_runs_from_its_start(sas, pump):
    handle = sas.submit(_claim(sas), {}, business_key="d2-again")
    pump.purge()
    pass_time(sas, handle.status().run.deadline, "the deadline")
    sas.supervisor.sweep()
    assert handle.status().process_state == "error"

    sas.resubmit(handle.id, by="ops", reason="the Scheduler is back")
    pump.run()
    view = handle.status()
    assert (view.process_state, view.run.deadline, view.step("file").state) == ("processing", None, "completed")
    sas.signal(handle.id, "approval", {"approved": True})
    pump.run()
    assert handle.status().process_state == "processed"
    assert [e.detail["action"] for e in handle.status().events if e.kind == "operator"] == ["resubmit"]


def test_a_run_stopped_at_its_deadline_with_nothing_to_undo_resumes_where_it_stopped(sas, pump):
    """Its wait was stopped by the deadline; resubmitted, the wait starts again (no failed step to
    give an edited input to: that is refused, nothing changed)."""
    deadline = timedelta(hours=2)
    sas.register(Workflow("due_wait", [WaitFor("manager", "approval", timeout=86400),
                                       Step("pay", "svc.work", timeout=5)], deadline=deadline))
    handle = sas.submit("due_wait", {}, business_key="d4")
    pump.run()
    pass_time(sas, handle.status().run.deadline, "the deadline")
    sas.supervisor.sweep()
    view = handle.status()
    assert (view.process_state, view.step("manager").state) == ("error", "stopped")

    with pytest.raises(InvalidOperation, match="it has no failed step to give it to"):
        sas.resubmit(handle.id, by="ops", step_input={"x": 1})
    assert handle.status().process_state == "error"
    sas.resubmit(handle.id, by="ops", reason="approver back from leave")
    pump.run()
    assert (handle.status().process_state, handle.status().step("manager").state) == ("processing", "pending")
    sas.signal(handle.id, "approval", {"approved": True})
    pump.run()
    assert handle.status().process_state == "processed"


def test_a_run_that_ends_in_time_is_left_alone(sas, pump):
    handle = sas.submit(_claim(sas), {}, business_key="d3")
    pump.run()
    sas.signal(handle.id, "approval", {"approved": True})
    pump.run()
    assert handle.status().process_state == "processed"
    pass_time(sas, handle.status().run.deadline, "the deadline")
    sas.supervisor.sweep()
    assert handle.status().process_state == "processed" and _alerts(sas, handle.id) == []


@pytest.mark.parametrize("deadline, message", [
    (-1, "deadline must be more than 0 and at most 7.776e\\+06 seconds \\(SAS_MAX_DEADLINE\\), got -1"),
    (timedelta(days=91), "at most 7.776e\\+06 seconds"),
    ("soon", "deadline must be more than 0"),
])
def test_a_deadline_that_cannot_be_is_refused_when_registered(sas, deadline, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        sas.register(Workflow("bad", [Step("a", "svc.work")], deadline=deadline))
    assert "bad" not in sas.workflows
