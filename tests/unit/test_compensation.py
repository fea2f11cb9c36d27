"""Compensation: when a run fails for good, what may have been done is undone, last step first,
each undo supervised like a step. Runs on SQLite here and on PostgreSQL in tests/integration."""

from __future__ import annotations

import pytest

from sas_app import InvalidOperation
from tests.support import backoff_over, sweep_after_expiry
from tests.testapp import CALLS

# On SQLite here and, as integration tests, on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.both_stores


def undo_calls(handle) -> list[str]:
    """The undos the agent received for this run, in the order it received them."""
    view = handle.status()
    undo_rows = [s for s in view.steps if s.compensates is not None]
    return [s.name for s in sorted(undo_rows, key=lambda s: s.completed_at or 0) if CALLS.get(s.idempotency_key)]


def test_a_permanent_failure_after_two_steps_undoes_both_in_reverse_once(sas, pump):
    handle = sas.submit("saga", {"script": {"third": ["permanent"]}}, business_key="s1")

    pump.run()

    view = handle.status()
    assert view.process_state == "compensated"
    assert [s.state for s in view.steps[:3]] == ["compensated", "compensated", "failed"]
    assert [s.name for s in view.steps[3:]] == ["undo:second", "undo:first"]
    assert [(s.state, s.attempt) for s in view.steps[3:]] == [("completed", 1), ("completed", 1)]
    assert undo_calls(handle) == ["undo:second", "undo:first"]
    for undo in view.steps[3:]:
        assert len(CALLS[undo.idempotency_key]) == 1
        assert undo.idempotency_key == view.step(undo.name.removeprefix("undo:")).idempotency_key + ":undo"
    assert sas.store.count_events("alert", handle.id) == 1
    assert "third" in view.run.error


def test_an_undo_sees_the_result_of_the_step_it_undoes(sas, pump):
    sas.submit("saga", {"script": {"second": ["permanent"]}}, business_key="s-results")
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])

    [undo] = pump.take("sas.agent.svc")
    assert undo.kwargs["step"] == "undo:first"
    assert undo.kwargs["results"]["first"]["step"] == "first"


def test_a_step_past_its_threshold_is_undone_too_as_its_effect_is_unknown(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["hang"]}}, business_key="s2")
    sweep_after_expiry(sas, pump, handle.id, times=3)

    view = handle.status()
    assert view.process_state == "compensated"
    assert [s.name for s in view.steps[3:]] == ["undo:second", "undo:first"]
    assert [s.state for s in view.steps[:3]] == ["compensated", "compensated", "not_started"]
    assert view.step("second").failure_count == 3


def test_an_undo_whose_agent_dies_is_recovered_by_the_supervisor(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": ["hang", "ok"]}},
                        business_key="s3")
    pump.run()
    assert handle.status().process_state == "compensating"

    sweep_after_expiry(sas, pump, handle.id)

    view = handle.status()
    assert view.process_state == "compensated"
    undo = view.step("undo:first")
    assert (undo.attempt, undo.failure_count) == (2, 1)


def test_an_undo_that_keeps_expiring_is_never_given_up_and_raises_one_alert(sas, pump):
    """An expiry says nothing of the service's answer (a backed-up queue, a broker down): an undo
    goes on past its threshold, one alert when it gets there, until it completes."""
    told = []
    sas.alerts.hook = told.append
    hangs = ["hang"] * 4
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": [*hangs, "ok"]}},
                        business_key="s-stuck")
    sweep_after_expiry(sas, pump, handle.id, times=4)

    view = handle.status()
    assert view.process_state == "compensated"
    undo = view.step("undo:first")
    assert (undo.state, undo.attempt, undo.failure_count, undo.max_failures) == ("completed", 5, 4, 3)
    assert [(a.kind, a.step, a.attempt) for a in told] == [("failed", "second", 1),
                                                           ("compensation_stuck", "undo:first", 3)]


def test_an_undo_past_its_threshold_that_loses_a_worker_once_goes_on(sas, pump):
    """Only a worker lost at every attempt (a poison undo) stops an undo: one loss after expiries
    does not."""
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": ["hang"] * 4 + ["ok"]}},
                        business_key="s-lost")
    sweep_after_expiry(sas, pump, handle.id, times=3)       # three expiries: at the threshold, retried
    undo = handle.status().step("undo:first")
    assert (undo.state, undo.attempt) == ("running", 4)

    sas.scheduler.step_lost(handle.id, undo.position, 4, "worker exited")
    backoff_over(sas, handle.id)
    pump.run()

    view = handle.status()
    assert view.process_state == "compensated"
    assert view.step("undo:first").attempt == 5


def test_an_undo_that_loses_its_worker_at_every_attempt_fails_for_good(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": ["hang"] * 3}},
                        business_key="s-poison")
    pump.run()
    for attempt in (1, 2, 3):
        position = handle.status().step("undo:first").position
        sas.scheduler.step_lost(handle.id, position, attempt, "worker exited")
        backoff_over(sas, handle.id)
        pump.run()

    view = handle.status()
    assert view.process_state == "error"
    assert "lost its worker 3 times" in view.run.error


def test_an_operator_marks_a_stuck_undo_done_while_it_runs(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": ["hang"] * 9}},
                        business_key="s-by-hand")
    sweep_after_expiry(sas, pump, handle.id, times=3)
    assert handle.status().step("undo:first").state == "running"

    sas.mark_done(handle.id, "undo:first", by="carol", reason="released by hand")
    pump.run()
    sas.scheduler.step_done(handle.id, handle.status().step("undo:first").position, 4, {"late": True})

    view = handle.status()
    assert view.process_state == "compensated"
    assert view.step("undo:first").result is None
    with pytest.raises(InvalidOperation, match="only an undo may be marked done while it runs"):
        running = sas.submit("saga", {"script": {"first": ["hang"]}}, business_key="s-running")
        pump.run()
        sas.mark_done(running.id, "first", by="carol", reason="not yet")


def test_an_undo_overtakes_the_work_waiting_on_its_agents_queue(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"]}}, business_key="s-urgent", priority=2)
    pump.run(["sas.scheduler"])
    [first] = pump.take("sas.agent.svc")
    pump.execute(first)
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])

    [undo] = pump.take("sas.agent.svc")
    assert undo.kwargs["step"] == "undo:first"
    assert (undo.priority, first.priority) == (sas.router.broker_priority(9), sas.router.broker_priority(2))
    assert handle.status().process_state == "compensating"


def test_an_undo_that_fails_for_good_ends_the_run_in_error_with_an_alert(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": ["permanent"]}},
                        business_key="s4")

    pump.run()

    view = handle.status()
    assert view.process_state == "error"
    assert view.run.error.startswith("compensation failed")
    assert view.step("first").state == "compensating"
    assert sas.store.count_events("alert", handle.id) == 2


def test_a_late_forward_reply_during_compensation_changes_nothing(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"]}}, business_key="s5")
    pump.run()
    before = handle.status()

    sas.scheduler.step_done(handle.id, 0, 1, {"late": True})
    sas.scheduler.step_done(handle.id, 1, 1, {"late": True})

    after = handle.status()
    assert after.steps == before.steps and after.run == before.run
    assert pump.run() == 0


def test_nothing_to_undo_leaves_the_run_in_error(sas, pump):
    handle = sas.submit("saga", {"script": {"first": ["permanent"]}}, business_key="s6")
    pump.run()
    view = handle.status()
    assert view.process_state == "error"
    assert len(view.steps) == 3
