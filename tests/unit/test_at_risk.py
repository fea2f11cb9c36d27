"""At-risk warnings reach the operator as one alert per queue and incident, not one per step: a
backlog of many steps, looked at several times a second, is one incident. Each step is still
recorded with its own run, once."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from sas_app import SasApp, Step
from sas_app.store.rows import StepRow
from sas_app.store.tables import alerts
from sas_app.supervision.forecast.lookout import Lookout
from sas_app.supervision.forecast.queue_model import DROPPED_S, clear_at, draining, forecast, pace
from tests.support import look, pass_time, statements_run, wait_for
from tests.testapp import install_test_workflows


def backlog_of(sas, pump, n: int, key: str) -> list:
    """``n`` runs whose first step waits for svc, which takes none, into the last fifth of its budget."""
    runs = [sas.submit("three", {}, business_key=f"{key}-{i}").id for i in range(n)]
    pump.run(["sas.scheduler"])  # each run's first step dispatched: n messages wait for svc
    first = [sas.store.get_steps(run_id)[0] for run_id in runs]
    assert {s.state for s in first} == {"running"}
    look(sas)  # the Supervisor watching all along: from here it has seen the queue
    pass_time(sas, max(s.complete_by - s.timeout * 0.15 for s in first), "four-fifths of the steps' budget to pass")
    return runs


def test_the_steps_of_one_queue_found_at_risk_by_a_look_are_told_as_one_alert(sas, pump):
    told = []
    sas.alerts.hook = told.append
    runs = backlog_of(sas, pump, 5, "backlog")  # no consumer has taken any: at risk

    assert len(look(sas)) == 5
    assert len(told) == 1
    alert = told[0]
    assert (alert.kind, alert.count, alert.workflow) == ("at_risk", 5, "three")
    assert sorted(alert.runs) == sorted(runs)
    assert alert.reason.startswith("5 steps waiting on sas.agent.svc are likely to miss their complete-by; the first:")
    assert alert.as_dict()["runs"] == list(alert.runs)
    with sas.store.engine.connect() as conn:  # each step's own record, once
        assert conn.execute(select(func.count()).select_from(alerts).where(alerts.c.kind == "at_risk")).scalar() == 5

    assert look(sas) == [] and len(told) == 1  # the same steps: nothing new


def test_a_queue_looked_at_again_and_again_is_told_of_at_most_once_a_sweep_interval(sas, pump):
    """A backlog grows for seconds and its queue is looked at several times a second: the steps
    found in the looks after the first are told together, with their count, a sweep interval on."""
    told = []
    sas.alerts.hook = told.append
    sas.supervisor.forecast.watch.settings = replace(sas.supervisor.forecast.watch.settings, supervisor_interval=3600.0)
    backlog_of(sas, pump, 2, "first")
    assert len(look(sas)) == 2 and len(told) == 1  # the first of the incident at once
    later = backlog_of(sas, pump, 3, "later")
    assert len(look(sas)) == 3 and len(told) == 1  # recorded, not told yet

    sas.supervisor.forecast.watch.settings = replace(sas.supervisor.forecast.watch.settings, supervisor_interval=0.001)
    assert look(sas) == []  # nothing new, but an interval on: the three told now
    assert len(told) == 2 and told[1].count == 3 and sorted(told[1].runs) == sorted(later)
    assert look(sas) == [] and len(told) == 2


def test_a_look_sooner_than_half_an_interval_after_the_last_is_skipped_whichever_supervisor_takes_it(
        sas, pump, settings):
    """Each Supervisor worker's lookout looks, and a look held up arrives beside the next: each
    more look in a step's last interval is one more coin toss at the margin. A look less than half
    an interval after the last one taken, by any Supervisor process, is skipped: one statement."""
    other = SasApp(sas.settings, clock=sas.test_clock)  # a second Supervisor process on the same store
    install_test_workflows(other)
    backlog_of(sas, pump, 2, "margin")
    assert len(look(sas)) == 2

    with statements_run(other.store.engine) as ran:
        assert other.supervisor.forecast.look() == []  # the other Supervisor worker's look, just after
    assert [statement.split()[0] for statement in ran if statement != "BEGIN IMMEDIATE"] == ["INSERT"]

    pass_time(sas, sas.store.now() + settings.at_risk_interval / 2, "half an interval")
    with statements_run(other.store.engine) as ran:
        assert other.supervisor.forecast.look() == []  # taken: the same steps, told already
    assert any("FROM steps" in statement for statement in ran)
    other.store.dispose()


@pytest.mark.both_stores
def test_of_supervisors_asking_at_once_one_takes_the_look(sas):
    with ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(lambda _: sas.store.take_look("at once", 60.0), range(8)))
    assert taken.count(True) == 1
    assert sas.store.take_look("another look", 60.0)


def at_risk(queued: list[StepRow], now: float, per_second: float, every: float = 0.0, former: float = 0.0) -> list:
    return forecast(queued, now, per_second, every=every, former=former)


def waiting(n: int, dispatched: float, timeout: float, every: float = 0.0) -> list[StepRow]:
    """``n`` steps of one agent dispatched ``every`` seconds apart from ``dispatched``, oldest first."""
    template = StepRow(**{f.name: None for f in fields(StepRow)})
    return [replace(template, run_id=f"run-{i}", position=0, name="ship", attempt=1, timeout=timeout,
                    complete_by=dispatched + i * every + timeout) for i in range(n)]


def test_a_step_is_at_risk_early_only_if_it_would_miss_even_at_three_times_its_agents_pace():
    """Steps told early at twice their queue's pace were taken at two or three times it, in time:
    agents sharing the cores take turns at them."""
    # 1.45 s left each, drained at 5 a second: even at 15 a second the 23rd and those behind it miss
    assert at_risk(waiting(22, -8.55, 10.0), now=0.0, per_second=5.0) == []
    risks = at_risk(waiting(100, -8.55, 10.0), now=0.0, per_second=5.0)
    assert [r.ahead for r in risks] == list(range(22, 100))
    # told at the pace itself: the head taken when a worker frees up (3 messages' time), 5 worked,
    # the rest dropped
    assert risks[0].taken_at == pytest.approx(0.6 + 5 * 0.2 + 17 * DROPPED_S)
    assert risks[0].reason.startswith("step 'ship' is likely to miss its complete-by: taken about 0.2s past it, "
                                      "22 message(s) ahead of it")


def test_a_step_that_would_miss_only_at_its_agents_pace_is_judged_in_its_last_look():
    """Its fate is a coin toss a second ahead (which worker frees up when): a queue looked at every
    tenth of a second judges it in the last tenth of a second, when the forecast is seldom wrong."""
    steps = waiting(10, -8.55, 10.0)  # 1.45 s left: at 5 a second the 6th to 10th miss, at 15 none
    assert at_risk(steps, now=0.0, per_second=5.0, every=0.1) == []
    # looked at every 1.5 s, this is its last look
    assert [r.ahead for r in at_risk(steps, now=0.0, per_second=5.0, every=1.5)] == [5, 6, 7, 8, 9]


def test_a_step_is_judged_once_the_last_fifth_of_its_budget_has_begun():
    """Further ahead the forecast cried wolf: within seconds a queue's workers change (one
    restarting is back, one frozen thaws) and drain it twice as fast."""
    steps = waiting(100, 0.0, 10.0)  # complete-by 10; at 1 a second all but a few are doomed
    assert at_risk(steps, now=0.0, per_second=1.0) == []
    assert at_risk(steps, now=7.9, per_second=1.0) == []  # 2.1 s left: more than a fifth
    assert [r.ahead for r in at_risk(steps, now=8.1, per_second=1.0)] == list(range(6, 100))
    # looked at less often than that: judged in its last look, at its pace
    assert [r.ahead for r in at_risk(steps, now=0.0, per_second=1.0, every=11.0)][:2] == [8, 9]


def test_a_message_found_past_its_complete_by_costs_little_so_the_ones_behind_it_can_make_theirs():
    doomed = waiting(20, -9.5, 10.0)          # 0.5 s left each: at 6 a second, four make it
    fresh = waiting(10, 0.0, 10.0)            # behind them: 10 s left, 5 s of work
    risks = at_risk(doomed + fresh, now=0.0, per_second=2.0)
    assert [r.step.run_id for r in risks] == [s.run_id for s in doomed[4:]]


def test_a_step_behind_hundreds_of_doomed_messages_is_not_reached_at_once():
    """Dropping a message still costs its worker a few milliseconds: counted as free, a step
    behind 300 doomed ones was forecast to be taken at once, and was taken two seconds late."""
    doomed = waiting(400, -9.48, 10.0)        # 0.52 s left each: at 20 a second, 8 are worked in time
    behind = waiting(1, -8.5, 10.0)           # 1.5 s left, behind them all
    risks = at_risk(doomed + behind, now=0.0, per_second=20.0)
    assert risks[-1].step is behind[0] and risks[-1].ahead == 400
    assert risks[-1].taken_at == pytest.approx(0.55 + 392 * DROPPED_S)  # 2.5 s: 1 s past its complete-by
    assert behind[0] not in [r.step for r in at_risk(doomed[:100] + behind, now=0.0, per_second=20.0)]


def test_a_step_already_past_its_complete_by_is_the_sweeps_not_a_warning():
    assert at_risk(waiting(5, -20.0, 10.0), now=0.0, per_second=1.0, every=1.0) == []


def test_a_queue_that_does_not_drain_makes_its_steps_at_risk_in_the_last_fifth_of_their_budget():
    steps = waiting(3, 0.0, 10.0, every=3.0)  # complete-by 10, 13 and 16
    assert at_risk(steps, now=7.9, per_second=0.0) == []
    assert [r.step.run_id for r in at_risk(steps, now=8.1, per_second=0.0)] == ["run-0"]
    assert [r.step.run_id for r in at_risk(steps, now=11.5, per_second=0.0)] == ["run-1"]
    assert at_risk(steps, now=11.5, per_second=0.0)[0].taken_at is None


def test_a_queue_gone_quiet_is_judged_as_if_its_workers_came_back_now_at_their_former_pace():
    """A stall is mostly short (PostgreSQL refusing connections for a few seconds, one worker of
    three frozen): steps told at risk in their last fifth for it were then taken in time. A step is
    at risk if it would miss even were its workers back now, at the pace they kept before."""
    steps = waiting(40, 0.0, 5.0)  # all due at 5.0: their last fifth from 4.0
    assert len(at_risk(steps, now=4.25, per_second=0.0)) == 40  # the workers' pace unknown
    quiet = at_risk(steps, now=4.25, per_second=0.0, former=10.0)
    # three times 10 a second in the 0.75 s left: 23 of them would make it
    assert [r.ahead for r in quiet] == list(range(23, 40))
    assert all(r.taken_at is None for r in quiet)  # told as "its agent completed nothing lately"
    # in their last look, at the former pace itself: none would make it, the head's a worker's wait away
    assert len(at_risk(steps[:3], now=4.95, per_second=0.0, every=0.1, former=10.0)) == 3


def test_the_steps_counted_as_waiting_are_the_last_dispatched_head_first(sas, pump):
    runs = [sas.submit("three", {}, business_key=f"fifo-{i}").id for i in range(5)]
    pump.run(["sas.scheduler"])
    dispatched = [s.run_id for s in sorted((sas.store.get_steps(r)[0] for r in runs),
                                           key=lambda s: (s.complete_by - s.timeout, s.id))]
    with sas.store.begin() as tx:
        assert tx.sweep.busy_agents() == ["svc"]
        # two of five messages taken by workers: the last three wait, the oldest of them at the head
        assert [s.run_id for s in tx.sweep.queued_steps("svc", 3, 100)] == dispatched[2:]
        assert [s.run_id for s in tx.sweep.queued_steps("svc", 3, 2)] == dispatched[2:4]
        assert [s.run_id for s in tx.sweep.queued_steps("svc", 9, 100)] == dispatched


def test_steps_dispatched_while_a_look_read_the_depths_do_not_push_the_queues_head_out(sas, pump):
    """A look reads the queues' depths, then which steps are running: a batch dispatched in
    between (the agents' next steps, retries) is not in the depths read before it, and counted as
    the last dispatched it pushed out the steps at the queues' heads — the ones nearest their
    complete-by. Two agents' queues, whichever is read first."""
    depot = sas.agent("depot")
    depot.action(lambda payload: {}, name="work")
    timeout = sas.workflows["three"].steps[0].timeout
    sas.workflow("elsewhere", [Step("go", "depot.work", timeout=timeout)])
    heads = [sas.submit("elsewhere", {}, business_key=f"head-depot-{i}").id for i in range(5)]
    backlog_of(sas, pump, 5, "head")  # five waiting for each agent in the last fifth of their budget: at risk
    assert {s.state for run in heads for s in sas.store.get_steps(run)} == {"running"}
    depths = sas.supervisor.forecast.watch.depths
    read = depths.read

    def read_then_dispatch(queue):
        depth = read(queue)
        if queue == "sas.agent.svc" and not getattr(read_then_dispatch, "done", False):
            read_then_dispatch.done = True
            pass_time(sas, sas.store.now(), "a moment after the depths were read")
            for i in range(5):  # five more for each agent, after svc's depth was read (depot's before or after)
                sas.submit("three", {}, business_key=f"batch-{i}")
                sas.submit("elsewhere", {}, business_key=f"batch-depot-{i}")
            pump.run(["sas.scheduler"])
        return depth

    depths.read = read_then_dispatch
    alerts = look(sas)
    assert read_then_dispatch.done
    assert sorted(a.business_key for a in alerts) == sorted(
        [f"head-{i}" for i in range(5)] + [f"head-depot-{i}" for i in range(5)])


def test_a_message_sent_now_is_taken_once_the_work_ahead_of_it_is_done():
    assert clear_at(waiting(10, 0.0, 10.0), now=0.0, per_second=4.0) == pytest.approx(2.0)  # 5 a second
    doomed = waiting(20, -9.5, 10.0)
    # two worked, the rest dropped
    assert clear_at(doomed, now=0.0, per_second=2.0) == pytest.approx(0.8 + 18 * DROPPED_S)
    assert clear_at(doomed, now=0.0, per_second=0.0) is None  # not draining


def test_an_agents_pace_is_its_busy_pace():
    assert pace([], 100.0) == 0.0
    # 41 completions over the last 10 s of a minute that began idle: 4 a second, not 41 over 60 s
    busy = [100.0 - i * 0.25 for i in range(41)]
    assert pace(busy, 100.5) == pytest.approx(4.0)
    # silent since: what it can do (a queue not draining is draining()'s to say)
    assert pace(busy, 110.0) == pytest.approx(4.0)
    assert pace([99.0], 100.0) == 1.0
    # a 7 s stall among them (the broker restarting) does not make it look slow
    stalled = [100.0 - i * 0.25 for i in range(20)] + [88.0 - i * 0.25 for i in range(30)]
    assert pace(stalled, 100.5) == pytest.approx(4.0)
    # two workers finishing at nearly the same moments: bursty gaps, the pace still their sum
    pairs = [100.0 - i * 0.5 - d for i in range(25) for d in (0.0, 0.01)]
    assert pace(pairs, 100.5) == pytest.approx(4.0, rel=0.05)
    # completions at one instant (a batch): no gap to go by but the span up to now
    assert pace([99.0, 99.0, 99.0], 100.0) == 3.0


def test_work_behind_the_steps_looked_at_still_takes_its_time():
    assert clear_at(waiting(10, 0.0, 10.0), now=0.0, per_second=4.0, behind=5) == pytest.approx(3.0)


def test_a_backlog_is_forecast_at_the_pace_its_workers_drain_it_not_at_how_often_work_came():
    """The issue's operator: an agent that completed a step every few seconds gets a burst of 30
    with 10 s each, and its workers take them at 20 a second. Before the burst its pace was how
    often work came; judged by that, nearly every step of the burst looked doomed."""
    before = [50.0 - 4 * i for i in range(10)]  # one every 4 s, until 50
    burst = waiting(30, 60.0, 10.0)  # sent at 60
    assert at_risk(burst, now=68.5, per_second=pace(before, 61.0))  # the old forecast cried wolf
    # just sent, nothing completed since: not judged yet (nor after a worker's restart)
    assert draining(before, 60.5, burst[0]) is None
    assert draining(before, 61.9, burst[0]) is None
    # two seconds in, what the workers did since the burst began is their pace: all 30 make it
    drained = [61.9 - i * 0.05 for i in range(36)]  # 20 a second since 60.1
    assert draining(drained + before, 62.0, burst[0]) == pytest.approx(20.0, rel=0.05)
    assert at_risk(burst[18:], now=68.5, per_second=draining(drained + before, 62.0, burst[0]), every=0.1) == []


def test_a_backlog_nobody_drains_is_judged_once_it_is_old_enough():
    before = [50.0 - 4 * i for i in range(10)]
    burst = waiting(30, 60.0, 10.0)
    # three completions are enough to go by, however young the backlog
    assert draining([60.3, 60.2, 60.1, *before], 60.4, burst[0]) == pytest.approx(10.0)
    # workers gone: after two seconds with nothing completed, the queue is not draining, and its
    # steps are at risk once the last fifth of their budget has begun
    assert draining(before, 62.0, burst[0]) == 0.0
    assert [r.ahead for r in at_risk(burst, now=68.5, per_second=0.0)] == list(range(30))
    # a step with a short budget is judged sooner: half its timeout
    short = waiting(5, 60.0, 2.0)
    assert draining(before, 60.9, short[0]) is None and draining(before, 61.1, short[0]) == 0.0


def test_after_its_workers_stalled_a_queue_is_judged_by_what_they_do_once_back():
    """A broker's outage (or workers frozen, restarting): the queue's workers completed nothing for
    7 s. Once back they drain the backlog at their own pace; judged at the pace of the silence, every
    step waiting looked seconds late, and they all made it."""
    burst = waiting(40, 50.0, 10.0)  # sent at 50, before the outage
    before = [53.0 - 0.05 * i for i in range(20)]  # 20 a second until 53, then 7 s of nothing
    # the workers back at 60: two completions are not a pace yet
    assert draining([60.3, 60.2, *before], 60.4, burst[0]) is None
    # nor six: they come back one by one, and the first ones' pace is not theirs
    back = [60.3 - 0.05 * i for i in range(6)]
    assert draining(back + before, 60.4, burst[0]) is None
    # ten are (workers held up by hanging calls come back together)
    back = [60.45 - 0.05 * i for i in range(10)]
    assert draining(back + before, 60.5, burst[0]) == pytest.approx(20.0, rel=0.05)
    # two seconds after the first, theirs
    back = [62.0 - 0.05 * i for i in range(40)]  # 20 a second since 60.05
    assert draining(back + before, 62.1, burst[0]) == pytest.approx(20.0, rel=0.05)
    # still silent since the outage: not draining (each waiting step at risk in the last fifth of
    # its budget), not a pace that falls the longer the silence
    assert draining(before, 60.4, burst[0]) == 0.0


def test_a_queue_that_fell_silent_is_not_draining_once_it_has_been_seen_long_enough():
    head = waiting(1, 0.0, 10.0)[0]
    before = [5.0 - 0.1 * i for i in range(20)]  # 10 a second until 5, then nothing
    assert draining(before, 9.0, head) == 0.0
    assert draining(before, 9.0, head, seen_since=7.5) is None  # seen for 1.5 s only
    assert draining(before, 9.0, head, seen_since=6.9) == 0.0


def test_workers_dropping_a_run_of_expired_messages_have_not_stalled():
    """A queue ten times deeper than it can drain: its workers reach a run of messages past their
    complete-by and drop them, completing nothing for a second or more while the queue gets
    shorter at every look. Judged a stall, the drain began anew and was too young to judge at
    every look, and a chaos run's backlogs behind such runs went untold."""
    burst = waiting(300, 50.0, 10.0)  # sent at 50
    before = [55.0 - 0.05 * i for i in range(40)]  # 20 a second until 55
    dropping = [(55.0 + 0.1 * i, 55.1 + 0.1 * i) for i in range(13)]  # 1.3 s of drops: shorter at each look
    back = [56.4, 56.35]
    assert draining(back + before, 56.45, burst[0]) is None  # without the looks: a stall
    assert draining(back + before, 56.45, burst[0], taken=dropping) == pytest.approx(20.0, rel=0.05)
    # looks further apart (a busy worker takes them late): each span the queue got shorter in counts
    assert draining(back + before, 56.45, burst[0], taken=[(55.0, 55.7), (55.7, 56.3)]) == pytest.approx(
        20.0, rel=0.05)
    assert draining(back + before, 56.45, burst[0], taken=[(55.0, 55.2), (55.8, 56.3)]) is None  # a gap


def test_after_an_outage_the_drain_begins_when_its_workers_are_first_seen_at_work():
    burst = waiting(40, 50.0, 10.0)
    before = [53.0 - 0.05 * i for i in range(20)]  # 20 a second until 53, then 7 s of nothing
    taking = [(60.0 + 0.1 * i, 60.1 + 0.1 * i) for i in range(3)]  # back at 60: shorter at each look
    back = [60.3 - 0.05 * i for i in range(6)]
    assert draining(back + before, 60.4, burst[0], taken=taking) is None  # they come back one by one
    back = [62.0 - 0.05 * i for i in range(40)]
    assert draining(back + before, 62.1, burst[0], taken=taking) == pytest.approx(20.0, rel=0.05)


def test_the_watch_notes_the_spans_in_which_its_looks_found_a_queue_getting_shorter(sas):
    watch = sas.supervisor.forecast.watch
    assert watch.note_depths({"svc": 10}, 100.0) == {"sas.agent.svc": []}
    assert watch.note_depths({"svc": 7}, 100.1) == {"sas.agent.svc": [(100.0, 100.1)]}
    assert watch.note_depths({"svc": 9}, 100.2) == {"sas.agent.svc": [(100.0, 100.1)]}  # deeper: nothing to say
    # looks more than two seconds apart may have an outage between them
    assert watch.note_depths({"svc": 5}, 102.3) == {"sas.agent.svc": [(100.0, 100.1)]}
    assert watch.note_depths({"svc": 4}, 103.3) == {"sas.agent.svc": [(100.0, 100.1), (102.3, 103.3)]}
    # empty or unread: nothing to go by after it
    assert watch.note_depths({}, 103.4) == {}
    assert watch.note_depths({"svc": 3}, 103.5) == {"sas.agent.svc": []}
    # only within the at-risk window
    window = watch.settings.at_risk_window
    assert watch.note_depths({"svc": 2}, 103.6) == {"sas.agent.svc": [(103.5, 103.6)]}
    assert watch.note_depths({"svc": 3}, 103.7 + window) == {"sas.agent.svc": []}
    assert watch.note_depths({"svc": 1}, 103.8 + window) == {"sas.agent.svc": [(103.7 + window, 103.8 + window)]}


def test_the_lookout_keeps_looking_through_a_database_outage_and_says_so_once(caplog):
    """The looks are a worker thread's own: one that fails (the database down, a bug) must not end
    them, and a database down for seconds is one warning, not ten a second."""
    calls = []

    def look() -> None:
        calls.append(len(calls))
        if len(calls) <= 5:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        if len(calls) == 6:
            raise RuntimeError("a bug")

    lookout = Lookout(look, 0.001)
    with caplog.at_level(logging.INFO, logger="sas_app.supervision.forecast.lookout"):
        lookout.start()
        lookout.start()  # the worker said it was ready twice: one thread
        assert sum(t.name == "sas-lookout" for t in threading.enumerate()) == 1
        wait_for(lambda: len(calls) >= 10, 5, "ten looks")
        lookout.stop()
        wait_for(lambda: not lookout.running, 5, "the lookout to stop")
    said = [r.getMessage().split(":")[0] for r in caplog.records]
    assert said == ["at-risk looks paused", "at-risk look failed", "at-risk looks resumed"]
