"""One run at a time per key: runs with the same key wait pending in submission order and start
when the one before ends — in any way — and a lost "your turn" message is recovered by the
Supervisor. On SQLite here and, as integration tests, on PostgreSQL."""

from __future__ import annotations

import pytest

from sas_app import InvalidOperation, InvalidSubmission, Step, WaitFor, Workflow
from sas_app.errors import WorkflowDefinitionError
from tests.support import pass_time

pytestmark = pytest.mark.both_stores


def _per_customer(sas, max_running: int = 1) -> str:
    name = f"per_customer_{max_running}"
    sas.register(Workflow(name, [Step("a", "svc.work", timeout=5), WaitFor("done", "done", timeout=3600)],
                          concurrency_key="customer", max_running=max_running))
    return name


def submit(sas, wf: str, customer, key: str):
    """One submission after another, a moment apart on the test's clock (submission order is the
    order of their times)."""
    sas.test_clock.advance(0.001)
    return sas.submit(wf, {"customer": customer}, business_key=key)


def states(*handles) -> list[str]:
    return [h.status().process_state for h in handles]


def test_runs_with_one_key_go_one_at_a_time_in_submission_order(sas, pump):
    wf = _per_customer(sas)
    first, second, third = (submit(sas, wf, 7, f"k{i}") for i in range(3))
    other = submit(sas, wf, "8", "other")
    pump.run()
    assert states(first, second, third, other) == ["processing", "pending", "pending", "processing"]
    view = second.status()
    assert view.run.slot == "7" and view.run.slot_since is not None and view.steps[0].state == "not_started"
    sas.supervisor.sweep()  # nothing is due: re-asking a parked run changes nothing
    pump.run()
    assert states(first, second, third) == ["processing", "pending", "pending"]

    sas.signal(first.id, "done")
    pump.run()
    assert states(first, second, third) == ["processed", "processing", "pending"]
    sas.cancel(second.id, by="ops")  # ending in any way frees the slot
    pump.run()
    assert states(second, third) == ["cancelled", "processing"]
    parked = [e for e in third.status().events if e.kind == "requeue" and (e.detail or {}).get("waiting_for_slot")]
    assert len(parked) == 1  # recorded once, however often it was asked


def test_max_running_two_fills_both_slots_again(sas, pump):
    wf = _per_customer(sas, max_running=2)
    runs = [submit(sas, wf, "c", f"m{i}") for i in range(4)]
    pump.run()
    assert states(*runs) == ["processing", "processing", "pending", "pending"]
    sas.signal(runs[0].id, "done")
    sas.signal(runs[1].id, "done")
    pump.run()
    assert states(*runs) == ["processed", "processed", "processing", "processing"]


def test_a_lost_turn_is_recovered_by_the_supervisor(sas, pump):
    wf = _per_customer(sas)
    first, second = submit(sas, wf, 1, "l1"), submit(sas, wf, 1, "l2")
    pump.run()
    sas.signal(first.id, "done")
    pump.purge()  # the message telling the next in line was lost
    assert states(first, second) == ["processed", "pending"]
    pass_time(sas, second.status().run.complete_by, "the parked run's re-ask")
    sas.supervisor.sweep()
    pump.run()
    assert second.status().process_state == "processing"


@pytest.mark.parametrize("payload, message", [
    ({}, "needs that key, a string or an integer, got None"),
    ({"customer": True}, "got True"),
    ({"customer": {"id": 1}}, "got {'id': 1}"),
])
def test_a_payload_without_its_concurrency_key_is_refused_with_nothing_written(sas, payload, message):
    wf = _per_customer(sas)
    with pytest.raises(InvalidSubmission, match=message):
        sas.submit(wf, payload, business_key="bad")
    assert sas.store.find_run(wf, "bad") is None


@pytest.mark.parametrize("options, message", [
    ({"concurrency_key": "not a key"}, "concurrency_key must name a payload key"),
    ({"concurrency_key": "customer", "max_running": 0}, "max_running must be an integer >= 1, got 0"),
])
def test_a_concurrency_limit_that_cannot_be_is_refused_when_registered(sas, options, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        sas.register(Workflow("bad", [Step("a", "svc.work")], **options))


def test_a_run_in_error_put_back_to_work_takes_a_slot_again(sas, pump):
    sas.register(Workflow("one_by_one", [Step("a", "svc.work", timeout=5, max_failures=1),
                                         WaitFor("done", "done", timeout=3600)], concurrency_key="customer"))
    broken = sas.submit("one_by_one", {"customer": 5, "script": {"a": ["permanent", "ok"]}}, business_key="e1")
    pump.run()
    assert broken.status().process_state == "error"  # it ended: its slot is free again
    holder = submit(sas, "one_by_one", 5, "e2")
    pump.run()
    assert holder.status().process_state == "processing"
    with pytest.raises(InvalidOperation, match=f"runs at most 1 at once and {holder.id} hold"):
        sas.resubmit(broken.id, by="ops")
    assert broken.status().process_state == "error"
    sas.signal(holder.id, "done")
    pump.run()
    sas.resubmit(broken.id, by="ops")  # the slot is free: it takes it
    pump.run()
    assert (broken.status().process_state, broken.status().step("done").state) == ("processing", "pending")
