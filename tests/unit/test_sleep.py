"""Durable sleeps: the run waits in the store — no message, no worker slot — and the Supervisor's
sweep wakes it on the database's clock. On SQLite here (the clock moved, not waited for: a sleep
of days) and, as integration tests, on PostgreSQL."""

from __future__ import annotations

import pytest

from sas_app import Sleep, Step, Workflow
from sas_app.errors import WorkflowDefinitionError
from tests.support import pass_time
from tests.testapp import CALLS

pytestmark = pytest.mark.both_stores


def queued(pump) -> dict[str, int]:
    return {queue: len(messages) for queue in pump.queues() if (messages := pump.take(queue))}


def test_a_run_sleeps_in_the_store_and_the_sweep_wakes_it(sas, pump):
    handle = sas.submit("nap", {}, business_key="zz")  # three days, on the test's clock
    pump.run()

    nap = handle.status().steps[1]
    assert (nap.state, handle.status().process_state) == ("pending", "processing")
    assert queued(pump) == {}  # nothing waits on any queue: no countdown held by a worker
    sas.supervisor.sweep()
    pump.run()
    assert handle.status().steps[1].state == "pending"  # not yet: its time has not come

    pass_time(sas, nap.not_before, "the sleep's time to come")
    sas.supervisor.sweep()
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert view.steps[1].result == {"slept_until": nap.not_before}
    # the sleep starts in the transaction that completes the step before it (on PostgreSQL a later
    # statement of it, whose clock has moved on by however long the statements between took)
    slept = view.steps[1].not_before - view.steps[0].completed_at
    assert 3 * 86400 <= slept < 3 * 86400 + 0.25
    assert CALLS[view.step("last").idempotency_key] == [(1, "ok")]


def test_a_sleep_until_a_time_in_the_payload(sas, pump):
    now = sas.store.now()
    soon = sas.submit("alarm", {"wake_at": now + 2.0}, business_key="alarm-1")
    past = sas.submit("alarm", {"wake_at": "2020-01-01T00:00:00Z"}, business_key="alarm-2")  # already due
    pump.run()
    assert past.status().process_state == "processed"
    assert soon.status().step("until_then").state == "pending"
    pass_time(sas, now + 2.0, "the wake time to come")
    sas.supervisor.sweep()
    pump.run()
    assert soon.status().process_state == "processed"


@pytest.mark.parametrize("payload, reason", [
    ({}, "the payload has no key 'wake_at'"),
    ({"wake_at": "tomorrow"}, "'tomorrow' is not an ISO 8601 time"),
    ({"wake_at": "2999-01-01T00:00:00Z"}, "s away (SAS_MAX_SLEEP)"),
])
def test_a_sleep_whose_time_is_no_time_fails_with_that_reason(sas, pump, payload, reason):
    handle = sas.submit("alarm", payload, business_key="alarm-bad")
    pump.run()
    view = handle.status()
    assert reason in view.step("until_then").error
    assert view.process_state == "error"  # nothing before it to undo
    assert view.step("last").state == "not_started"


@pytest.mark.parametrize("step, message", [
    (Sleep("s", seconds=-1), "more than 0 and at most"),
    (Sleep("s", seconds=31 * 86400), "more than 0 and at most 2.592e\\+06 seconds"),
    (Sleep("s", until="nope.when"), "names no step of this workflow"),
])
def test_a_sleep_that_cannot_be_is_refused_when_registered(sas, step, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        sas.register(Workflow("bad", [Step("a", "svc.work"), step]))
    with pytest.raises(WorkflowDefinitionError, match="needs seconds or until=, exactly one"):
        Sleep("s")


def test_the_sweep_tells_a_sleep_whose_time_has_come_from_a_message_that_was_lost(sas, pump):
    asleep = sas.submit("nap", {}, business_key="due")
    pump.run()
    lost = sas.submit("three", {}, business_key="lost")
    pump.take("sas.scheduler")  # its Scheduler's message, lost: the run stays pending
    pass_time(sas, max(asleep.status().steps[1].not_before, lost.status().run.complete_by),
              "the sleep's time and the lost run's pick-up time to come")

    with sas.store.begin() as tx:
        stalled, woken = tx.sweep.requeue_stalled(sas.settings.pickup_timeout, 100, "test")

    assert (stalled, woken) == ([lost.id], [asleep.id])  # the sleep's wake was planned; the message was lost
