"""Child runs: a step that starts another registered workflow and waits for it. The child's
outcome is the step's; undoing or cancelling the parent cancels a live child; a lost "the child
ended" is found by the Supervisor. On SQLite here and, as integration tests, on PostgreSQL."""

from __future__ import annotations

import pytest

from sas_app import ChildRun, SasApp, Step, Workflow
from sas_app.errors import WorkflowDefinitionError
from tests.support import Pump, pass_time
from tests.testapp import CALLS

pytestmark = pytest.mark.both_stores


def child_of(sas: SasApp, run_id: str):
    [child] = sas.store.children(run_id)
    return sas.get_run(child.id)


def test_a_child_run_s_results_are_its_step_s_result(sas, pump):
    handle = sas.submit("parent", {}, business_key="p-ok")
    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    child = child_of(sas, handle.id)
    assert child.process_state == "processed"
    assert (child.run.parent_run_id, child.run.parent_position, child.run.depth) == (handle.id, 1, 1)
    assert child.run.business_key == f"{handle.id}:spawn:1"
    assert view.step("spawn").result == {"k1": child.step("k1").result}
    after = view.step("after")
    assert CALLS[after.idempotency_key] == [(1, "ok")]
    assert view.step("spawn").complete_by is None  # the child is supervised, not the step


def test_a_child_that_fails_fails_its_step_and_the_parent_is_undone(sas, pump):
    handle = sas.submit("parent", {"script": {"k1": ["permanent"]}}, business_key="p-fail")
    pump.run()

    child = child_of(sas, handle.id)
    assert child.process_state == "error"  # its one step refused: nothing of it to undo
    view = handle.status()
    assert view.process_state == "compensated"
    spawn = view.step("spawn")
    assert spawn.state == "failed" and f"child run {child.id} (kid) ended error" in spawn.error
    assert [s.name for s in view.steps if s.compensates is not None] == ["undo:before"]
    assert sas.store.count_events("alert", handle.id) == 1 and sas.store.count_events("alert", child.id) == 1
    assert view.step("after").state == "not_started"


def test_cancelling_the_parent_cancels_a_live_child(sas, pump):
    handle = sas.submit("parent", {}, business_key="p-cancel")
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])  # "before"
    pump.run(["sas.scheduler"])  # "spawn" starts the child, whose k1 is dispatched
    [k1] = pump.take("sas.agent.svc")
    assert k1.kwargs["step"] == "k1"

    assert sas.cancel(handle.id, by="ops", reason="customer called") == "compensating"
    pump.execute(k1)  # the child's agent was already at work: its reply is fenced out
    pump.run()

    child = child_of(sas, handle.id)
    assert child.process_state == "cancelled" and child.run.cancelled_by == "ops"
    assert child.step("undo:k1").state == "completed"
    view = handle.status()
    assert view.process_state == "cancelled"
    assert view.step("spawn").state == "stopped"


def test_a_lost_word_that_the_child_ended_is_found_by_the_supervisor(sas, pump):
    handle = sas.submit("parent", {}, business_key="p-lost")
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])  # "before" completed, the child started
    for _ in range(5):  # the child runs; every message to the Scheduler about the parent is lost
        pump.run(["sas.agent.svc"])
        for message in pump.take("sas.scheduler"):
            if (message.args[:1] or [message.kwargs.get("run_id")])[0] != handle.id:
                pump.execute(message)
    child = child_of(sas, handle.id)
    assert child.process_state == "processed" and handle.status().step("spawn").state == "running"

    pass_time(sas, child.run.updated_at + sas.settings.pickup_timeout, "the parent's pick-up time to pass")
    assert handle.id in sas.supervisor.sweep().requeued
    pump.run()
    assert handle.status().process_state == "processed"


def test_a_child_step_of_a_workflow_not_registered_is_refused(sas):
    with pytest.raises(WorkflowDefinitionError, match="child workflow 'nope' is not registered"):
        sas.register(Workflow("bad", [ChildRun("c", "nope")]))
    assert "bad" not in sas.workflows


def test_a_step_is_one_kind_an_impossible_mix_cannot_be_written():
    with pytest.raises(TypeError):
        Step("c", "svc.work", child="kid")  # type: ignore[call-arg]  # a child run is a ChildRun
    with pytest.raises(TypeError):
        ChildRun("c", "kid", for_each="items")  # type: ignore[call-arg]  # a child run does not fan out
    with pytest.raises(TypeError):
        Step("c")  # type: ignore[call-arg]  # an action step names its action


def test_child_runs_nested_past_the_bound_fail_with_that_reason(sas, pump):
    object.__setattr__(sas.settings, "max_child_depth", 1)
    middle = sas.register(Workflow("mid", [ChildRun("down", sas.workflows["kid"])]))
    sas.register(Workflow("top", [ChildRun("down", middle)]))
    handle = sas.submit("top", {}, business_key="deep")
    pump.run()

    mid = child_of(sas, handle.id)
    assert mid.run.depth == 1 and sas.store.children(mid.id) == []
    assert "would nest 2 deep, over SAS_MAX_CHILD_DEPTH (1)" in mid.step("down").error
    assert mid.process_state == "error"
    assert handle.status().process_state == "error"


def test_a_child_workflow_gone_from_the_deployed_code_fails_its_step(sas, pump, settings):
    handle = sas.submit("parent", {}, business_key="p-gone")
    pump.run(["sas.scheduler"])
    [before] = pump.take("sas.agent.svc")

    # the next deployment has "parent" (unchanged) but no "kid" any more
    new = SasApp(sas.settings, clock=sas.test_clock)
    svc = new.agent("svc")
    svc.action(lambda call: {"ok": True}, name="work")
    svc.undo(lambda call: {"undone": True}, name="undo")
    Pump(new).execute(before)
    Pump(new).run()

    view = handle.status()
    assert "child workflow 'kid' is not in the deployed code" in view.step("spawn").error
    assert sas.store.children(handle.id) == []
    assert view.process_state == "compensated"  # "before" undone
