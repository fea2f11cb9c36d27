"""Waiting in a queue is not failing: a step whose message still waits in its agent's queue past its
complete-by — no worker has taken it — spends no attempt. The Supervisor leaves it alone (by the
queue's depth), the agent that takes it late starts its complete-by again, and a message that is
lost, or waits longer than SAS_QUEUE_WAIT_MAX, is recovered as before."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import select

from sas_app import SasApp, Settings
from sas_app.states import EventKind
from sas_app.store.tables import events
from sas_app.supervision.supervisor import TAKE_GRACE
from sas_app.testing import Environment
from tests.support import FakeClock, backoff_over, expire, pass_time
from tests.testapp import install_test_workflows


@pytest.fixture
def env(settings: Settings, db_url: str):
    """The engine tests' environment, with replies handled in the agent's process (the default a
    deployment runs with): what lets an agent start a late message."""
    user = SasApp(replace(settings, inline_replies=True, queue_wait_max=5.0))
    install_test_workflows(user)
    with Environment(user, clock=FakeClock(), database_url=None if db_url.startswith("sqlite") else db_url) as env:
        env.app.test_clock = env.clock  # type: ignore[attr-defined]
        yield env


def queued_events(sas: SasApp, run_id: str) -> list[dict]:
    with sas.store.engine.connect() as conn:
        return [dict(r.detail or {}, attempt=r.attempt) for r in conn.execute(
            select(events).where(events.c.run_id == run_id, events.c.kind == EventKind.QUEUED.value)
            .order_by(events.c.id))]


def backlog(env: Environment, n: int) -> list[str]:
    """``n`` runs whose first step waits in svc's queue, untaken, past its complete-by."""
    runs = [env.app.submit("three", {}, business_key=f"q-{i}").id for i in range(n)]
    env.pump.run(["sas.scheduler"])
    for run_id in runs:
        expire(env.app, run_id)
    return runs


@pytest.mark.both_stores
def test_a_step_left_waiting_in_its_queue_past_complete_by_spends_no_attempt_and_runs_when_taken(env):
    sas = env.app
    runs = backlog(env, 3)

    report = sas.supervisor.sweep()
    assert (report.queued, report.retried, report.paced, report.failed) == (3, [], [], [])
    for run_id in runs:
        first = sas.store.get_steps(run_id)[0]
        assert (first.state, first.attempt, first.failure_count) == ("running", 1, 0)
    assert sas.supervisor.sweep().queued == 0  # looked at again later, not every sweep

    env.pump.run()  # a worker takes them at last
    for run_id in runs:
        view = sas.get_run(run_id)
        assert view.process_state == "processed"
        assert (view.step("first").attempt, view.step("first").failure_count) == (1, 0)
        assert queued_events(sas, run_id) == [{"left": "its message waits in the queue", "attempt": 1},
                                              {"started_late": True, "attempt": 1}]
    assert len([c for c in env.calls("svc.work") if c.step == "first"]) == 3  # each called once


def test_a_message_taken_with_little_of_its_time_left_gets_its_whole_timeout(env):
    """Taken before its complete-by but with less than half its time left (it waited in the
    queue), a step would be given up for the wait: it starts with its whole timeout instead."""
    sas = env.app
    run_id = sas.submit("three", {}, business_key="late-ish").id
    env.pump.run(["sas.scheduler"])
    first = sas.store.get_steps(run_id)[0]
    pass_time(sas, first.complete_by - first.timeout * 0.2, "four-fifths of its time to pass in the queue")

    env.pump.run(["sas.agent.svc"])
    assert queued_events(sas, run_id) == [{"started_late": True, "attempt": 1}]
    restarted = sas.store.get_steps(run_id)[0]
    assert restarted.not_before == pytest.approx(sas.store.now() + first.timeout, abs=0.01)  # ends a timeout on
    view = env.finish(run_id)
    assert view.process_state == "processed" and view.step("first").attempt == 1


@pytest.mark.both_stores
def test_a_step_waiting_longer_than_queue_wait_max_counts_a_failure_and_its_old_message_is_dropped(env):
    sas = env.app
    [run_id] = backlog(env, 1)
    assert sas.supervisor.sweep().queued == 1
    first = sas.store.get_steps(run_id)[0]
    pass_time(sas, first.complete_by + sas.settings.queue_wait_max + 0.01, "SAS_QUEUE_WAIT_MAX to pass")

    report = sas.supervisor.sweep()
    assert (report.queued, len(report.retried)) == (0, 1)
    assert sas.store.get_steps(run_id)[0].failure_count == 1
    env.finish(run_id)  # the old message is taken first: attempt 1 is no longer wanted
    view = sas.get_run(run_id)
    assert view.process_state == "processed" and view.step("first").attempt == 2
    assert [c.attempt for c in env.calls("svc.work") if c.step == "first"] == [2]  # attempt 1 never called


def test_a_lost_message_is_recovered_though_a_queue_is_backed_up_with_no_failure_counted(env):
    sas = env.app
    lost = sas.submit("three", {}, business_key="lost").id
    env.pump.run(["sas.scheduler"])
    assert len(env.pump.take("sas.agent.svc")) == 1  # its message gone
    waiting = sas.submit("three", {}, business_key="waiting").id  # dispatched after it: still queued
    env.pump.run(["sas.scheduler"])
    for run_id in (lost, waiting):
        expire(sas, run_id)
    pass_time(sas, sas.store.now() + TAKE_GRACE, "the grace an agent taking a message at its complete-by has")

    report = sas.supervisor.sweep()
    assert report.queued == 1 and [run_id for run_id, _, _ in report.retried] == [lost]
    # no agent took the lost attempt: it is sent again, and no failure is counted for it
    assert [sas.store.get_steps(r)[0].failure_count for r in (lost, waiting)] == [0, 0]
    [retry] = [e for e in sas.store.get_events(lost) if e.from_state == "running" and e.to_state == "pending"]
    assert retry.detail["reason"] == "silent"


@pytest.mark.both_stores
def test_a_step_taken_from_its_queue_just_before_a_look_is_left_for_its_agent_to_claim(env):
    """A step left waiting in its queue is taken by its agent a moment before the next look reads
    the queue's depth, and not yet claimed (CI saw it on a busy machine): the queue no longer holds
    it, yet it was not lost. It is given a moment once; claimed meanwhile it runs at its attempt,
    and one never claimed is recovered at the look after, no failure counted."""
    sas = env.app
    claimed, unclaimed = backlog(env, 2)
    assert sas.supervisor.sweep().queued == 2
    taken = {message.run_ids()[0]: message for message in env.pump.take("sas.agent.svc")}  # the queue is empty
    first = sas.store.get_steps(unclaimed)[0]
    pass_time(sas, max(first.not_before, first.complete_by + TAKE_GRACE), "the next look, past a moment's grace")

    report = sas.supervisor.sweep()
    assert (report.queued, report.retried) == (0, [])
    assert [e for e in queued_events(sas, unclaimed) if "taken" in e] == [
        {"taken": "no longer in the queue; its agent may be claiming it", "attempt": 1}]
    env.pump.execute(taken[claimed])  # its agent claims it now: it runs with its whole timeout
    backoff_over(sas, unclaimed)

    report = sas.supervisor.sweep()
    assert [run_id for run_id, _, _ in report.retried] == [unclaimed]
    for run_id in (claimed, unclaimed):
        env.finish(run_id)
    assert [(sas.get_run(r).process_state, sas.get_run(r).step("first").attempt) for r in (claimed, unclaimed)] == [
        ("processed", 1), ("processed", 2)]
    assert sas.store.get_steps(unclaimed)[0].failure_count == 0
    assert sorted((c.run_id, c.attempt) for c in env.calls("svc.work") if c.step == "first") == sorted(
        [(claimed, 1), (unclaimed, 2)])


def test_sas_queue_wait_max_is_a_number_of_seconds_or_zero():
    assert Settings.from_env({"SAS_QUEUE_WAIT_MAX": "0"}).queue_wait_max == 0
    with pytest.raises(ValueError, match=r"queue_wait_max must be 0 \(off\) or more seconds, got -1\.0"):
        Settings.from_env({"SAS_QUEUE_WAIT_MAX": "-1"})
