"""The engine's transitions, driven message by message through a real kombu broker.

These run on SQLite here and, unchanged, on PostgreSQL in tests/integration/test_engine_postgresql.py.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from sas_app import SasApp, Step, Submission
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance
from tests.support import backoff_over, expire, pass_time, statements_run, sweep_after_expiry
from tests.testapp import install_test_workflows

# On SQLite here and, as integration tests, on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.both_stores

SCHEDULER = ["sas.scheduler"]
AGENT = ["sas.agent.svc"]


def transitions(sas: SasApp, run_id: str, position: int | None) -> list[tuple[str | None, str | None, int | None]]:
    return [
        (e.from_state, e.to_state, e.attempt)
        for e in sas.store.get_events(run_id)
        if e.kind == "transition" and e.position == position
    ]


def test_happy_path_runs_every_step_once_and_records_the_history(sas, pump):
    handle = sas.submit("three", {"n": 1}, business_key="order-1")

    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    assert [(s.state, s.attempt, s.failure_count) for s in view.steps] == [("completed", 1, 0)] * 3
    assert view.step("second").result["attempt"] == 1
    assert transitions(sas, handle.id, None) == [(None, "pending", None), ("pending", "processing", None),
                                                 ("processing", "processed", None)]
    assert transitions(sas, handle.id, 1) == [("not_started", "running", 1), ("running", "completed", 1)]


def test_agent_message_carries_key_attempt_and_complete_by_with_matching_expiry(sas, pump):
    handle = sas.submit("three", {}, business_key="k")
    pump.run(SCHEDULER)

    [message] = pump.take("sas.agent.svc")
    step = sas.store.get_steps(handle.id)[0]
    assert message.task == "sas.agent.svc.work"
    assert message.kwargs["idempotency_key"] == step.idempotency_key == f"{handle.id}:first"
    assert message.kwargs["attempt"] == step.attempt == 1
    assert message.kwargs["complete_by"] == step.complete_by
    assert message.headers["expires"] is not None
    assert message.headers["timelimit"][1] == pytest.approx(step.timeout + 1)


def test_same_business_key_twice_gives_one_run(sas, pump):
    first = sas.submit("three", {"n": 1}, business_key="order-7")
    second = sas.submit("three", {"n": 1}, business_key="order-7")

    assert second.id == first.id
    assert (first.created, second.created) == (True, False)
    assert len(sas.store.list_runs()) == 1
    pump.run()
    assert first.status().process_state == "processed"


def test_a_duplicated_advance_dispatches_the_step_once(sas, pump):
    handle = sas.submit("three", {}, business_key="dup-advance")
    sas.celery.send_task("sas.scheduler.advance", args=[handle.id], queue="sas.scheduler")

    pump.run(SCHEDULER)

    assert len(pump.take("sas.agent.svc")) == 1
    assert sas.store.get_steps(handle.id)[0].attempt == 1


def test_a_duplicated_reply_completes_the_step_once(sas, pump):
    handle = sas.submit("three", {}, business_key="dup-reply")
    pump.run(SCHEDULER)
    pump.run(AGENT)
    [reply] = pump.take("sas.scheduler")
    pump.execute(reply)
    pump.execute(reply)

    assert transitions(sas, handle.id, 0).count(("running", "completed", 1)) == 1
    assert len(pump.take("sas.agent.svc")) == 1  # the second step, dispatched once
    assert sas.store.count_events("stale_reply", handle.id) == 1


def test_a_reply_with_fields_from_a_newer_release_is_still_handled(sas, pump):
    """During a rolling upgrade an agent of the next release may send a field this one does not
    know: the reply is handled with what is known, not refused and left to expire."""
    handle = sas.submit("three", {}, business_key="newer-reply")
    pump.run(SCHEDULER)
    pump.run(AGENT)
    [reply] = pump.take("sas.scheduler")
    pump.execute(replace(reply, kwargs={**reply.kwargs, "from_a_newer_release": {"x": 1}}))

    assert transitions(sas, handle.id, 0).count(("running", "completed", 1)) == 1


def test_a_late_reply_from_an_old_attempt_changes_nothing(sas, pump):
    handle = sas.submit("three", {}, business_key="late")
    pump.run(SCHEDULER)
    pump.take("sas.agent.svc")  # attempt 1 is lost in flight (its agent is a zombie)
    expire(sas, handle.id)
    sas.supervisor.sweep()
    backoff_over(sas, handle.id)
    pump.run(SCHEDULER)  # attempt 2 dispatched
    assert sas.store.get_steps(handle.id)[0].attempt == 2

    sas.scheduler.step_done(handle.id, 0, 1, {"zombie": True})

    step = sas.store.get_steps(handle.id)[0]
    assert (step.state, step.attempt, step.result) == ("running", 2, None)
    assert sas.store.count_events("stale_reply", handle.id) == 1
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert view.steps[0].result["attempt"] == 2


def test_a_transient_fault_is_retried_inside_the_agent(sas, pump):
    handle = sas.submit("three", {"script": {"first": ["transient", "transient", "ok"]}}, business_key="t")

    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    assert (view.steps[0].attempt, view.steps[0].failure_count) == (1, 0)


def test_a_permanent_fault_puts_the_run_in_error_with_one_alert(sas, pump):
    handle = sas.submit("three", {"script": {"second": ["permanent"]}}, business_key="p")

    pump.run()

    view = handle.status()
    assert view.process_state == "error"
    assert [s.state for s in view.steps] == ["completed", "failed", "not_started"]
    assert "second" in view.run.error and "refused" in view.run.error
    assert sas.store.count_events("alert", handle.id) == 1


def test_the_supervisor_retries_an_expired_step_after_a_back_off(sas, pump):
    handle = sas.submit("three", {"script": {"first": ["hang", "ok"]}}, business_key="h")
    pump.run()
    assert handle.status().steps[0].state == "running"
    expire(sas, handle.id)

    report = sas.supervisor.sweep()

    step = sas.store.get_steps(handle.id)[0]
    assert [(r[0], r[1]) for r in report.retried] == [(handle.id, 0)]
    assert (step.state, step.failure_count, step.locked_by) == ("pending", 1, None)
    assert step.not_before is not None and step.complete_by > step.not_before
    backoff_over(sas, handle.id)
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert (view.steps[0].attempt, view.steps[0].failure_count, view.run.failure_count) == (2, 1, 1)


def test_an_early_retry_request_waits_for_the_back_off(sas, pump):
    # a back-off long enough that no slow machine's pause between the sweep and the request ends it
    for name in ("retry_backoff", "retry_backoff_max"):
        object.__setattr__(sas.settings, name, 30.0)
    handle = sas.submit("three", {"script": {"first": ["hang", "ok"]}}, business_key="early")
    pump.run()
    expire(sas, handle.id)
    sas.supervisor.sweep()
    pump.take("sas.scheduler")  # the Supervisor's hint (sent with a countdown)

    sas.scheduler.advance(handle.id)  # arrives before the back-off is over

    assert sas.store.get_steps(handle.id)[0].state == "pending"
    [later] = pump.take("sas.scheduler")
    assert later.task == "sas.scheduler.advance" and later.headers["eta"] is not None


def test_a_step_that_always_expires_ends_in_error_at_the_threshold_with_one_alert(sas, pump):
    alerts = []
    sas.alerts.hook = alerts.append
    handle = sas.submit("three", {"script": {"first": ["hang"]}}, business_key="always")

    sweep_after_expiry(sas, pump, handle.id, times=3)

    view = handle.status()
    assert view.process_state == "error"
    assert (view.steps[0].state, view.steps[0].failure_count, view.steps[0].attempt) == ("failed", 3, 3)
    assert view.run.failure_count == 3
    assert sas.store.count_events("alert", handle.id) == 1
    assert [(a.run_id, a.step) for a in alerts] == [(handle.id, "first")]
    sas.supervisor.sweep()
    assert sas.store.count_events("alert", handle.id) == 1


def test_a_lost_submit_message_is_re_enqueued_by_the_supervisor(sas, pump):
    handle = sas.submit("three", {}, business_key="lost-submit")
    pump.take("sas.scheduler")  # the message never arrives
    assert sas.supervisor.sweep().requeued == []  # not yet past its pick-up complete-by
    pass_time(sas, sas.store.get_run(handle.id).complete_by, "the pending run's complete-by")

    assert sas.supervisor.sweep().requeued == [handle.id]
    assert sas.supervisor.sweep().requeued == []  # its complete-by moved on: asked once
    pump.run()
    assert handle.status().process_state == "processed"


def test_a_batch_of_lost_messages_is_asked_again_once_each_in_the_statements_of_one(sas, pump):
    """Runs and steps left pending by lost messages (a purged queue) are asked about again in a
    sweep that costs as many statements for 30 as for one, each once, and then complete."""
    one = sas.submit("three", {}, business_key="lost-one")
    pump.take("sas.scheduler")
    pass_time(sas, sas.store.get_run(one.id).complete_by, "the pending run's complete-by")
    with statements_run(sas.store.engine) as statements:
        assert sas.supervisor.sweep_once().requeued == [one.id]
    few = len(statements)
    pump.run()

    handles = [h.handle for h in sas.submit_many([Submission("three", {}, f"lost{i}") for i in range(30)])]
    pump.take("sas.scheduler")
    pass_time(sas, max(sas.store.get_run(h.id).complete_by for h in handles), "the pending runs' complete-by")
    with statements_run(sas.store.engine) as statements:
        assert sorted(sas.supervisor.sweep_once().requeued) == sorted(h.id for h in handles)
    assert len(statements) == few, "30 lost messages cost the statements of one"
    assert sas.supervisor.sweep_once().requeued == []  # their complete-by moved on: asked once
    pump.run()
    assert {h.status().process_state for h in [one, *handles]} == {"processed"}
    assert {sas.store.count_events("requeue", h.id) for h in handles} == {1}


def test_a_stalled_run_is_not_asked_about_again_while_the_schedulers_queue_is_not_empty(sas, pump):
    """A Scheduler with messages waiting is behind, not deaf: asking again would deepen its queue."""
    handle = sas.submit("three", {}, business_key="behind")
    behind = sas.submit("three", {}, business_key="queued")
    pump.take("sas.scheduler")  # both messages lost; then one for the second run waits there
    sas.router.send(Advance(behind.id, Publish.SUBMITTED))
    pass_time(sas, sas.store.get_run(handle.id).complete_by, "the pending run's complete-by")

    report = sas.supervisor.sweep()
    assert (report.requeued, report.scheduler_behind) == ([], 1)

    pump.run()  # the Scheduler catches up
    assert sas.supervisor.sweep().requeued == [handle.id]
    pump.run()
    assert handle.status().process_state == "processed" and behind.status().process_state == "processed"


def test_a_lost_agent_message_is_recovered_once_complete_by_passes(sas, pump):
    handle = sas.submit("three", {}, business_key="lost-agent")
    pump.run(SCHEDULER)
    pump.run(AGENT)
    pump.run(SCHEDULER)
    pump.take("sas.agent.svc")  # the second step's agent message is lost

    expire(sas, handle.id)
    sas.supervisor.sweep()
    backoff_over(sas, handle.id)
    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    # no worker tried the lost attempt: it is sent again with no failure counted
    assert [(s.attempt, s.failure_count) for s in view.steps] == [(1, 0), (2, 0), (1, 0)]
    [retry] = [e for e in view.events if e.from_state == "running" and e.to_state == "pending"]
    assert (retry.position, retry.detail["reason"]) == (1, "silent")


@pytest.mark.both_stores
def test_an_attempt_its_agent_gave_up_on_counts_a_failure_and_a_silent_one_does_not(sas, pump):
    """An attempt the agent took and stopped at complete-by (the service hung) is a failed
    attempt; one that passed its complete-by with no word from any agent (its message lost, its
    worker killed whole) is sent again with no failure counted — up to max_failures such times a
    step, after which each counts, so a step that kills its whole worker every time still ends."""
    hung = sas.submit("three", {"script": {"second": ["hang", "ok"]}}, business_key="hung")
    pump.run(SCHEDULER)
    pump.run(AGENT)
    pump.run(SCHEDULER)
    pump.run(AGENT)  # the second step: the agent gives up at complete-by and says so
    pump.run(SCHEDULER)
    expire(sas, hung.id)
    sas.supervisor.sweep()
    backoff_over(sas, hung.id)
    pump.run()
    view = hung.status()
    assert view.process_state == "processed"
    assert [(s.attempt, s.failure_count) for s in view.steps] == [(1, 0), (2, 1), (1, 0)]
    assert [e.attempt for e in view.events if e.kind == "gave_up"] == [1]

    lost = sas.submit("three", {}, business_key="always-lost")
    pump.run(SCHEDULER)
    counted = []
    for _ in range(20):
        pump.take("sas.agent.svc")  # this attempt's message is lost
        expire(sas, lost.id)
        sas.supervisor.sweep()
        first = sas.store.get_steps(lost.id)[0]
        counted.append(first.failure_count)
        if first.state == "failed":
            break
        backoff_over(sas, lost.id)
        pump.run(SCHEDULER)  # sent again
    limit = first.max_failures
    assert counted == [0] * limit + list(range(1, limit + 1)), counted
    assert lost.status().process_state == "error"


def test_messages_for_unknown_runs_or_finished_runs_change_nothing(sas, pump):
    handle = sas.submit("three", {}, business_key="fin")
    pump.run()
    before = sas.store.get_events(handle.id)

    sas.scheduler.advance("0" * 32)
    sas.scheduler.step_done("0" * 32, 0, 1, {})
    sas.scheduler.advance(handle.id)
    sas.scheduler.step_failed(handle.id, 2, 1, "late error")

    assert handle.status().process_state == "processed"
    after = sas.store.get_events(handle.id)
    assert [e.kind for e in after[len(before):]] == ["stale_reply"]
    assert pump.run() == 0


def test_two_supervisors_sweeping_at_once_recover_each_step_once(sas, pump, settings):
    other = SasApp(sas.settings, clock=sas.test_clock)  # the same store, on the same clock
    install_test_workflows(other)
    handles = [sas.submit("three", {"script": {"first": ["hang"]}}, business_key=f"c{i}") for i in range(40)]
    pump.run()
    for h in handles:
        expire(sas, h.id)

    barrier = threading.Barrier(2)
    reports = []

    def sweep(app: SasApp) -> None:
        barrier.wait()
        reports.append(app.supervisor.sweep())

    threads = [threading.Thread(target=sweep, args=(app,)) for app in (sas, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    other.store.dispose()

    recovered = [r[0] for report in reports for r in report.retried]
    assert sorted(recovered) == sorted(h.id for h in handles)
    for h in handles:
        step = sas.store.get_steps(h.id)[0]
        assert (step.state, step.failure_count) == ("pending", 1)
        assert transitions(sas, h.id, 0).count(("running", "pending", 1)) == 1


def test_supervisors_recover_a_fleet_of_expired_steps_in_batches_each_once_and_in_a_statement_per_batch(
        sas, pump, settings):
    """A fleet of agents died: 120 steps expired at once, three Supervisors sweeping together
    in batches of 20 recover each exactly once; a batch costs as many statements whatever its size;
    the Scheduler then starts every one again."""
    apps = [SasApp(replace(sas.settings, sweep_batch=batch), clock=sas.test_clock)  # the same store and clock
            for batch in (5, 20, 20, 20)]
    for app in apps:
        install_test_workflows(app)
    # Steps of 2 s, not "three"'s 0.3 s: these apps' agents time each call on the real clock, and
    # 360 calls in one pump could see one pass its complete-by in a stall.
    fleet = [Step(name, "svc.work", timeout=2) for name in ("first", "second", "third")]
    for app in (sas, *apps):
        app.workflow("fleet", fleet)
    handles = sas.submit_many([Submission("fleet", {"script": {"first": ["hang", "ok"]}}, f"fleet{i}")
                               for i in range(120)])
    pump.run()
    for h in handles:
        expire(sas, h.handle.id)

    with statements_run(apps[0].store.engine) as statements:
        assert len(apps[0].supervisor.sweep_once().retried) == 5
    few = len(statements)
    with statements_run(apps[1].store.engine) as statements:
        assert len(apps[1].supervisor.sweep_once().retried) == 20
    assert len(statements) == few, "a batch of 20 costs the statements of a batch of 5"

    barrier = threading.Barrier(3)
    reports = []

    def sweep(app: SasApp) -> None:
        barrier.wait()
        reports.append(app.supervisor.sweep())

    threads = [threading.Thread(target=sweep, args=(app,)) for app in apps[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for app in apps:
        app.store.dispose()

    recovered = [r[0] for report in reports for r in report.retried]
    assert len(recovered) == 120 - 25 and len(set(recovered)) == len(recovered)
    for h in handles:
        [first] = [s for s in sas.store.get_steps(h.handle.id) if s.position == 0]
        assert (first.state, first.failure_count) == ("pending", 1)
        assert transitions(sas, h.handle.id, 0).count(("running", "pending", 1)) == 1
        assert h.handle.status().run.failure_count == 1

    # the Scheduler restarts each batch in one go once the back-off is over, and every order completes
    for h in handles:
        backoff_over(sas, h.handle.id)
    sas.supervisor.sweep()  # the 25 the probes took
    for h in handles:
        backoff_over(sas, h.handle.id)
    pump.run(limit=10_000)
    for h in handles:
        view = h.handle.status()
        assert (view.process_state, view.step("first").attempt) == ("processed", 2)
def test_a_failing_alert_hook_changes_nothing_for_the_run(sas, pump):
    def broken(alert):
        raise RuntimeError("pager down")

    sas.alerts.hook = broken
    handle = sas.submit("three", {"script": {"first": ["permanent"]}}, business_key="broken-hook")

    pump.run()

    assert handle.status().process_state == "error"
    assert sas.store.count_events("alert", handle.id) == 1


@pytest.mark.parametrize("script, ends, kept", [
    # retried in-process, then done: one attempt, its two faults on its history
    (["transient", "transient", "ok"], "processed", [2]),
    # a permanent fault after a transient one: both the reply's error and the fault kept
    (["transient", "permanent"], "error", [1]),
    # failing until complete-by at every attempt: no reply, but each attempt's faults still kept
    (["transient"], "error", None),
])
def test_an_attempt_s_transient_faults_are_kept_in_the_run_s_history(env, sas, script, ends, kept):
    from sas_app.web.formatting import detail_text

    handle = sas.submit("three", {"script": {"second": script}}, business_key=f"faults-{ends}-{len(script)}")
    env.finish(handle.id)

    view = handle.status()
    assert view.process_state == ends
    faults = [e for e in view.events if e.kind == "faults"]
    assert all(e.position == 1 for e in faults)
    if kept is not None:
        assert [e.detail["count"] for e in faults] == kept
    else:  # one account per attempt, each from the agent that gave up at its complete-by
        assert [e.attempt for e in faults] == [1, 2, 3] and all(e.detail["count"] >= 2 for e in faults)
    assert all(e.detail["first"] == "second busy" for e in faults)
    assert detail_text(faults[0].detail).startswith(f"{faults[0].detail['count']} transient fault")
