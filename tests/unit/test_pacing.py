"""No retry storm: when an agent's queue is too deep to take a new message within a step's timeout,
the Supervisor holds the retries of that agent's expired steps until the queue has drained to half
a timeout's worth, then lets them go one after another at the pace the agent keeps — instead of
adding them all to the backlog at once, to expire there again. The held retries wait in the store
(no message held meanwhile), and the sweep wakes each when its turn comes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import delete, select, update

from sas_app import SasApp, Step, Workflow
from sas_app.store.tables import alerts, steps
from sas_app.store.tables import runs as runs_table
from tests.support import FakeClock, Pump, look, pass_time
from tests.testapp import install_test_workflows


def backlog(sas, pump, n: int) -> tuple[list[str], float]:
    """Three runs completed (the agent's pace), then ``n`` runs whose step waits in the agent's
    queue past its complete-by, with ``n`` more behind them, sent 6 s later and still in time (no
    agent consumes any); the first ``n`` runs, and when the first of the three completed."""
    sas.register(Workflow("call", [Step("call", "svc.work", timeout=10, max_failures=3)]))
    warm = [sas.submit("call", {}, business_key=f"warm-{i}").id for i in range(3)]
    pump.run()
    runs = [sas.submit("call", {}, business_key=f"old-{i}").id for i in range(n)]
    pump.run(["sas.scheduler"])
    look(sas)  # the Supervisor watching all along: from here it has seen the queue
    pass_time(sas, sas.store.now() + 6, "6 s")
    for i in range(n):
        sas.submit("call", {}, business_key=f"new-{i}")
    pump.run(["sas.scheduler"])
    pass_time(sas, sas.store.now() + 2.5, "2.5 s more: the last fifth of the first ones' budget")
    look(sas)  # warns of the steps the queue will not reach in time
    pass_time(sas, max(sas.store.get_steps(r)[0].complete_by for r in runs), "the first ones' complete-by")
    return runs, min(sas.store.get_steps(r)[0].completed_at for r in warm)


def test_retries_into_a_queue_too_deep_to_take_them_wait_their_turn_in_the_store(sas, pump):
    runs, first_completed = backlog(sas, pump, 40)
    now = sas.store.now()
    # the three completed at one instant: the agent's pace is 3 over the time since
    per_second = 3 / (now - first_completed)

    report = sas.supervisor.sweep()

    # the steps warned of as at risk in their backlog are paced (not the first one or two, which the
    # queue was to reach in time); a wait of a few seconds is a message's countdown, as a back-off
    # is; longer ones wait in the store, and the sweep wakes each when due
    assert len(report.retried) + len(report.paced) == 40 and len(report.paced) >= 34
    assert all(wait <= 5 for _, _, wait in report.retried) and all(wait > 5 for _, _, wait in report.paced)
    assert len(pump.take("sas.scheduler")) == len({wait for _, _, wait in report.retried})  # a message a back-off
    backed_off = {r for r, _, wait in report.retried if wait == sas.settings.retry_backoff}
    due = sorted(sas.store.get_steps(r)[0].not_before for r in runs if r not in backed_off)
    # the 40 expired messages cost nothing; of the 40 behind them, still in time, those the agent
    # will work before their complete-by keep it busy a while (no more than their 5 s left and
    # one gap); the paced retries begin then, less half a timeout, and follow one another at the
    # agent's pace
    gap = 1 / per_second
    assert now + gap <= due[0] <= now + 2 * gap + 2  # (rounded up to half a second)
    assert due[-1] - due[0] == pytest.approx((len(due) - 1) * gap, abs=1.0)
    assert {sas.store.get_steps(r)[0].state for r in runs} == {"pending"}

    pump.run()  # the agent works through its queue: the later 40, and the expired attempts dropped unworked
    assert [sas.get_run(r).process_state for r in runs] == ["processing"] * 40
    pass_time(sas, due[0], "the first paced retry to be due")  # the back-offs' are due by then too
    woken = sas.supervisor.sweep()
    held = {r for r, _, _ in report.paced}
    assert woken.retried == [] and len(set(woken.requeued) & held) <= 1  # one by one, not all at once
    pump.run()
    assert sum(sas.store.get_steps(r)[0].state == "pending" for r in held) >= len(held) - 1


def test_a_retry_whose_message_still_waits_in_the_backlog_is_paced_whether_or_not_it_was_warned_of(sas, pump):
    """Pacing goes by the queue, not by the alert: a step whose at-risk alert was not raised (its
    backlog too young to judge when it was last looked at, or the warning's sweep lost) but whose
    message still waits in its agent's queue when it expires is a retry into that backlog."""
    backlog(sas, pump, 40)
    with sas.store.begin() as tx:
        assert tx.conn.execute(delete(alerts).where(alerts.c.kind == "at_risk")).rowcount > 30

    report = sas.supervisor.sweep()

    assert len(report.retried) + len(report.paced) == 40 and len(report.paced) >= 34


@pytest.mark.parametrize("off", [{"pace_retries": False}, {"at_risk_forecast": False}], ids=["pacing", "forecast"])
def test_without_pacing_every_retry_goes_back_into_the_backlog_at_once(sas, pump, off):
    """SAS_PACE_RETRIES=false, or the whole forecast off (SAS_AT_RISK_FORECAST=false)."""
    forecast = sas.supervisor.forecast
    forecast.settings = replace(forecast.settings, **off)
    backlog(sas, pump, 40)

    report = sas.supervisor.sweep()

    assert len(report.retried) == 40 and report.paced == []


def test_with_the_forecast_off_a_backlog_raises_no_at_risk_alert_and_no_look_is_taken(settings, tmp_path):
    """SAS_AT_RISK_FORECAST=false: the steps of a queue that will not reach them in time are not
    warned of (the sweep still retries them at their complete-by), and no worker starts looking."""
    clock = FakeClock()
    sas = SasApp(replace(settings, at_risk_forecast=False), clock=clock)
    sas.test_clock = clock
    install_test_workflows(sas, timeout=0.3)
    sas.migrate()
    pump = Pump(sas)
    pump.purge()
    try:
        told = []
        sas.alerts.hook = told.append
        backlog(sas, pump, 5)
        sas.supervisor.forecast.start()

        assert look(sas) == [] and told == []
        assert not sas.supervisor.forecast.lookout.running
        with sas.store.engine.connect() as conn:
            assert conn.execute(select(alerts.c.id).where(alerts.c.kind == "at_risk")).all() == []
        assert len(sas.supervisor.sweep().retried) == 5
    finally:
        sas.supervisor.forecast.stop()
        sas.store.dispose()


def test_a_queue_with_room_retries_after_the_back_off_alone(sas, pump):
    runs, _ = backlog(sas, pump, 1)  # one message in time: 3.4 s of work at 0.29 a second
    report = sas.supervisor.sweep()
    assert sorted(r for r, _, _ in report.retried) == sorted(runs) and report.paced == []


def test_retries_of_an_agent_whose_queue_is_empty_are_not_paced_by_how_rarely_work_comes(sas, pump):
    """An agent that completes a step now and then (its pace is how often work comes, not how fast
    it can go) loses a worker with ten messages: the queue is empty, so nothing is held."""
    sas.register(Workflow("call", [Step("call", "svc.work", timeout=10, max_failures=3)]))
    for i in range(3):
        sas.submit("call", {}, business_key=f"warm-{i}")
    pump.run()
    runs = [sas.submit("call", {}, business_key=f"lost-{i}").id for i in range(10)]
    pump.run(["sas.scheduler"])
    assert len(pump.take("sas.agent.svc")) == 10  # taken by a worker that died with them
    pass_time(sas, max(sas.store.get_steps(r)[0].complete_by for r in runs), "the steps' complete-by")

    report = sas.supervisor.sweep()

    assert sorted(r for r, _, _ in report.retried) == sorted(runs) and report.paced == []
    assert {backoff for _, _, backoff in report.retried} == {sas.settings.retry_backoff}


def test_only_paced_retries_hold_back_the_next_ones(sas, pump):
    """A step of the same agent waiting out a long back-off or an escalation is not a retry in the
    queue's line: the next paced retries do not wait behind it."""
    runs, _ = backlog(sas, pump, 40)
    now = sas.store.now()
    with sas.store.begin() as tx:  # another step of svc waits an hour, as an escalation's wait does
        other = tx.conn.execute(select(steps.c.id).join(runs_table, runs_table.c.id == steps.c.run_id)
                                .where(runs_table.c.business_key == "new-0")).scalar_one()
        tx.conn.execute(update(steps).where(steps.c.id == other).values(
            state="pending", not_before=now + 3600, complete_by=now + 3600, escalated=1))
    sas.supervisor.sweep()
    due = sorted(sas.store.get_steps(r)[0].not_before for r in runs)
    assert due[-1] < now + 600


def test_a_retry_into_a_queue_too_deep_to_take_it_in_time_is_paced_though_its_own_message_is_gone(sas, pump):
    """Its message was dropped unworked, or its worker died with it, before any sweep warned of
    it (an at-risk alert comes only in a step's last fifth): a retry sent now into a queue that
    will not reach it in time would expire there all the same."""
    sas.register(Workflow("call", [Step("call", "svc.work", timeout=10, max_failures=3)]))
    for i in range(3):
        sas.submit("call", {}, business_key=f"warm-{i}")
    pump.run()  # the agent's pace
    gone = [sas.submit("call", {}, business_key=f"gone-{i}").id for i in range(5)]
    pump.run(["sas.scheduler"])
    assert len(pump.take("sas.agent.svc")) == 5  # taken, and never answered
    pass_time(sas, sas.store.now() + 6, "6 s")
    for i in range(40):  # a backlog the agent will not drain within a timeout
        sas.submit("call", {}, business_key=f"deep-{i}")
    pump.run(["sas.scheduler"])
    pass_time(sas, max(sas.store.get_steps(r)[0].complete_by for r in gone), "the first ones' complete-by")

    report = sas.supervisor.sweep()

    with sas.store.begin() as tx:  # none of them was warned of
        assert tx.conn.execute(select(alerts.c.run_id).where(alerts.c.kind == "at_risk")).all() == []
    # each waits its turn (the first few as a countdown, the rest in the store), none its bare back-off
    waits = {run_id: wait for run_id, _, wait in report.retried + report.paced}
    assert sorted(waits) == sorted(gone) and len(report.paced) >= 3
    assert all(wait > sas.settings.retry_backoff for wait in waits.values())
