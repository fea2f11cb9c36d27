"""Waits for an event, ended by a signal: consumed while the run waits, kept when it comes before
the run gets there, ignored the second time; a timeout that undoes the run, leaves it in error or
goes on; signals the run cannot take refused with nothing written. On SQLite here (a timeout of
days on the injected clock) and, as integration tests, on PostgreSQL."""

from __future__ import annotations

import pytest

from sas_app import InvalidSignal, Step, UnknownRun, WaitFor, Workflow
from sas_app.errors import WorkflowDefinitionError
from sas_app.messaging.routing import SIGNAL
from tests.support import pass_time

pytestmark = pytest.mark.both_stores


def test_a_signal_ends_the_wait_and_its_payload_is_the_result(sas, pump):
    handle = sas.submit("claim", {"amount": 120}, business_key="c1")
    pump.run()
    view = handle.status()
    manager = view.step("manager")
    assert (view.process_state, manager.state) == ("processing", "pending")
    assert manager.complete_by == pytest.approx(view.step("file").completed_at + 2 * 86400, abs=1)
    assert [m for q in pump.queues() for m in pump.take(q)] == []  # no message held while it waits

    receipt = sas.signal(handle.id, "approval", {"approved": True, "by": "ana"}, by="ana")
    assert (receipt.run_id, receipt.status) == (handle.id, "consumed")
    again = sas.signal(workflow="claim", business_key="c1", event="approval", payload={"approved": False},
                       by="bob")  # before pay ends
    assert again.status == "ignored"
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert view.step("manager").result == {"approved": True, "by": "ana"}
    got = [(s.status, s.payload, s.sent_by) for s in sas.store.signals_of(handle.id)]
    assert got == [("consumed", {"approved": True, "by": "ana"}, "ana"), ("ignored", {"approved": False}, "bob")]
    history = [e.detail["status"] for e in view.events if e.kind == "signal"]
    assert history == ["kept", "ignored"]


def test_a_signal_sent_before_the_run_waits_is_kept_and_consumed_when_it_gets_there(sas, pump):
    handle = sas.submit("claim", {}, business_key="c2")  # `file` dispatched, not yet done
    early = sas.signal(handle.id, "approval", {"approved": True})
    second = sas.signal(handle.id, "approval", {"approved": False})
    assert (early.status, second.status) == ("kept", "ignored")
    assert handle.status().step("manager").state == "not_started"
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert view.step("manager").result == {"approved": True}
    assert [s.status for s in sas.store.signals_of(handle.id)] == ["consumed", "ignored"]


def test_a_signal_sent_through_the_broker(sas, pump):
    handle = sas.submit("claim", {}, business_key="c3")
    pump.run()
    sas.celery.send_task(SIGNAL, kwargs={"workflow": "claim", "business_key": "c3", "event": "approval",
                                         "payload": {"approved": True}, "by": "webhook"})
    sas.celery.send_task(SIGNAL, kwargs={"run_id": handle.id, "event": "nope"})  # refused, logged
    pump.run()
    assert handle.status().process_state == "processed"
    assert [(s.event, s.sent_by) for s in sas.store.signals_of(handle.id)] == [("approval", "webhook")]


def test_the_wait_itself_names_its_event(sas, pump):
    """``sas.signal(run, approval)`` with the ``WaitFor`` step, as ``after=`` and ``result_of``
    take steps: the event it waits for is sent."""
    approval = WaitFor("manager", "approval", timeout=3600)
    sas.register(Workflow("by_object", [Step("file", "svc.work", timeout=5), approval,
                                        Step("pay", "svc.work", timeout=5)]))
    handle = sas.submit("by_object", {}, business_key="o1")
    pump.run()
    receipt = sas.signal(handle.id, approval, {"approved": True})
    by_key = sas.signal(workflow="by_object", business_key="o1", event=approval, payload={"approved": False})
    assert (receipt.status, by_key.status) == ("consumed", "ignored")
    pump.run()
    view = handle.status()
    assert (view.process_state, view.step("manager").result) == ("processed", {"approved": True})
    assert [s.event for s in sas.store.signals_of(handle.id)] == ["approval", "approval"]


def _waits(sas, on_timeout: str) -> str:
    name = f"wait_{on_timeout}"
    timeout = 3600
    sas.register(Workflow(name, [Step("file", "svc.work", timeout=5, compensate="svc.undo"),
                                 WaitFor("manager", "approval", timeout=timeout, on_timeout=on_timeout),
                                 Step("pay", "svc.work", timeout=5)]))
    return name


@pytest.mark.parametrize("on_timeout, state, manager, file_undone", [
    ("compensate", "compensated", "failed", True),
    ("error", "error", "failed", False),
    ("continue", "processed", "completed", False),
])
def test_a_wait_that_times_out(sas, pump, on_timeout, state, manager, file_undone):
    handle = sas.submit(_waits(sas, on_timeout), {}, business_key="t1")
    pump.run()
    sas.supervisor.sweep()
    pump.run()
    assert handle.status().step("manager").state == "pending"  # not yet
    pass_time(sas, handle.status().step("manager").not_before, "the wait's timeout")
    sas.supervisor.sweep()
    pump.run()
    view = handle.status()
    assert (view.process_state, view.step("manager").state) == (state, manager)
    assert any(s.name == "undo:file" and s.state == "completed" for s in view.steps) == file_undone
    alerts = [e.detail for e in view.events if e.kind == "alert"]
    if on_timeout == "continue":
        assert view.step("manager").result == {"timed_out": True} and alerts == []
    else:
        assert "no 'approval' signal came within" in view.step("manager").error
        assert len(alerts) == 1
    with pytest.raises(InvalidSignal, match=f"is {state}: it takes no more signals"):
        sas.signal(handle.id, "approval", {"approved": True})


def test_signals_a_run_cannot_take_are_refused_with_nothing_written(sas, pump):
    handle = sas.submit("claim", {}, business_key="c4")
    pump.run()
    before = len(handle.status().events)
    with pytest.raises(UnknownRun, match="no run with id 'nope'"):
        sas.signal("nope", "approval")
    with pytest.raises(UnknownRun, match="no run of workflow 'claim' with business key 'c9'"):
        sas.signal(workflow="claim", business_key="c9", event="approval")
    with pytest.raises(InvalidSignal, match="never waits for event 'shipped'; it waits for 'approval'"):
        sas.signal(handle.id, "shipped")
    with pytest.raises(InvalidSignal, match="payload must be a JSON object"):
        sas.signal(handle.id, "approval", ["yes"])
    with pytest.raises(InvalidSignal, match="event must be a name"):
        sas.signal(handle.id, "")
    three = sas.submit("three", {}, business_key="c4")
    with pytest.raises(InvalidSignal, match="never waits for event 'approval'; it waits for no event"):
        sas.signal(three.id, "approval")
    assert sas.store.signals_of(handle.id) == [] and len(handle.status().events) == before
    assert handle.status().step("manager").state == "pending"


def test_an_operator_resubmits_a_wait_that_timed_out_and_it_waits_again(sas, pump):
    handle = sas.submit(_waits(sas, "error"), {}, business_key="t2")
    pump.run()
    pass_time(sas, handle.status().step("manager").not_before, "the wait's timeout")
    sas.supervisor.sweep()
    pump.run()
    assert handle.status().process_state == "error"
    sas.resubmit(handle.id, by="ops", reason="the manager is back")
    pump.run()
    assert handle.status().step("manager").state == "pending"
    assert sas.signal(handle.id, "approval", {"approved": True}).status == "consumed"
    pump.run()
    assert handle.status().process_state == "processed"


@pytest.mark.parametrize("steps, message", [
    ([WaitFor("w", "approval", timeout=-1)], "a wait's timeout must be more than 0 and at most"),
    ([WaitFor("w", "approval", timeout=31 * 86400)], "at most 2.592e\\+06 seconds"),
    ([WaitFor("w", "approval", timeout=60, on_timeout="retry")], "on_timeout must be one of compensate, error, "
                                                                  "continue; got 'retry'"),
    ([WaitFor("w", "not an event", timeout=60)], "event 'not an event' must be a name"),
    ([WaitFor("w", "approval", timeout=60), WaitFor("v", "approval", timeout=60)],
     "more than one step waits for event 'approval'"),
])
def test_a_wait_that_cannot_be_is_refused_when_registered(sas, steps, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        sas.register(Workflow("bad", [Step("a", "svc.work"), *steps]))
    assert "bad" not in sas.workflows


def test_a_signal_after_the_wait_s_timeout_is_ignored_even_before_the_sweep_sees_it(sas, pump):
    handle = sas.submit(_waits(sas, "compensate"), {}, business_key="late")
    pump.run()
    pass_time(sas, handle.status().step("manager").not_before, "the wait's timeout")
    late = sas.signal(handle.id, "approval", {"approved": True})  # the sweep has not run yet
    assert late.status == "ignored"
    assert [e.detail["why"] for e in handle.status().events if e.kind == "signal"] == ["after the wait's timeout"]
    sas.supervisor.sweep()
    pump.run()
    assert handle.status().process_state == "compensated"


def test_a_run_cancelled_while_it_waits_waits_no_more(sas, pump):
    sas.register(Workflow("just_wait", [WaitFor("w", "go", timeout=3600)]))
    handle = sas.submit("just_wait", {}, business_key="jw")
    pump.run()
    assert sas.cancel(handle.id, by="ops") == "cancelled"  # nothing to undo
    assert handle.status().step("w").state == "stopped"
    from sas_app.store.observe import Observer

    assert dict(Observer(sas.store).waiting_by_kind()).get("event", 0) == 0


@pytest.mark.parametrize("call, problem", [
    (lambda sas: sas.signal(event="approval"), "name the run by its id, or by workflow= and business_key="),
    (lambda sas: sas.signal("r1", event="approval", workflow="claim", business_key="c1"), "not both"),
    (lambda sas: sas.signal(workflow="claim", event="approval"), "needs both workflow= and business_key="),
    (lambda sas: sas.signal("r1"), "name the event to send"),
])
def test_a_signal_that_does_not_name_its_run_or_event_is_refused(sas, call, problem):
    with pytest.raises(InvalidSignal, match=problem):
        call(sas)


def test_a_signal_names_its_run_by_id_or_by_workflow_object_and_key(sas, pump):
    handle = sas.submit("claim", {}, business_key="c-obj")
    pump.run()
    receipt = sas.signal(workflow=sas.workflows["claim"], business_key="c-obj", event="approval",
                         payload={"approved": True})
    assert (receipt.run_id, receipt.status) == (handle.id, "consumed")
