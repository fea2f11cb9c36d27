"""Parallel steps, fan-outs and joins on real worker processes: they run at once, the join starts
exactly once whoever finishes last, a branch whose worker dies is recovered, a branch that fails
for good undoes what completed, a wide fan-out keeps to its bound, and a deployment that changed
the definition (or dropped an action) treats runs in flight as they began."""

from __future__ import annotations

import itertools
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from sas_app import Step, Workflow
from sas_app.store.tables import alerts
from tests.integration.conftest import submitter
from tests.integration.graph_app import calls
from tests.support import wait_for

pytestmark = pytest.mark.integration

APP = {"SAS_APP": "tests.integration.graph_app:sas"}
QUEUE = "sas.agent.work"


def start(stack, *workers: tuple[str, int]) -> None:
    stack.worker("scheduler", "sas.scheduler,sas.supervisor", env=APP, wait=False)
    for name, concurrency in workers:
        stack.worker(name, QUEUE, concurrency, env=APP, wait=False)
    stack.beat(env=APP, wait=False)
    stack.wait_ready()


def called(home: Path, key: str, what: str = "do") -> int:
    return sum(1 for c in calls(home) if c["key"] == key and c["what"] == what)


def test_three_branches_of_one_second_run_at_once(stack, app):
    start(stack, ("agents", 3))
    view = app.submit("three_at_once", {"sleep": 1}, business_key="t-1").wait(30)
    assert view.process_state == "processed"
    branches = [view.step(name) for name in ("a", "b", "c")]
    started = min(e.at for e in view.events if e.to_state == "running" and e.position in (0, 1, 2))
    finished = max(s.completed_at for s in branches)
    assert 1.0 <= finished - started < 2.0, f"three 1 s branches took {finished - started:.2f} s"


def test_the_join_starts_exactly_once_when_the_last_two_branches_finish_together(stack, app, stack_env):
    start(stack, ("w1", 1), ("w2", 1))
    home = Path(stack_env["SAS_HOME"])
    gaps = []
    for i in range(8):
        view = app.submit("race", {"items": [0, 1], "barrier": 2}, business_key=f"race-{i}").wait(30)
        assert view.process_state == "processed"
        join = view.step("join")
        assert (join.state, join.attempt) == ("completed", 1)
        assert called(home, join.idempotency_key) == 1
        assert [e.to_state for e in view.events if e.position == join.position] == ["running", "completed"]
        pair = [view.step("pair[0]"), view.step("pair[1]")]
        assert len({s.result["pid"] for s in pair}) == 2  # on two worker processes
        gaps.append(abs(pair[0].completed_at - pair[1].completed_at))
    assert min(gaps) < 0.05, f"the branches never finished together: {gaps}"


def test_a_branch_whose_worker_is_killed_is_recovered_and_the_join_happens_once(stack, app, stack_env):
    start(stack, ("w1", 1), ("w2", 1))
    home = Path(stack_env["SAS_HOME"])
    handle = app.submit("long_branch", {"items": ["quick", "stuck"], "hang_first": "stuck"}, business_key="k-1")
    key = f"{handle.id}:each:1"
    [first] = wait_for(lambda: [c for c in calls(home) if c["key"] == key], 20, "the stuck branch to start")
    os.kill(first["pid"], signal.SIGKILL)  # the worker process running it dies

    view = handle.wait(40)
    assert view.process_state == "processed"
    stuck = view.step("each[1]")
    assert stuck.attempt == 2 and stuck.failure_count == 1
    assert called(home, key) == 2
    assert called(home, view.step("join").idempotency_key) == 1
    assert view.step("join").attempt == 1


def test_a_branch_failing_for_good_undoes_its_completed_siblings_and_the_earlier_step(stack, app, stack_env):
    start(stack, ("agents", 3))
    home = Path(stack_env["SAS_HOME"])
    handle = app.submit("undo_on_failure", {"items": ["x", "y", "bad"], "fail": ["bad"]}, business_key="u-1")
    view = handle.wait(30)

    assert view.process_state == "compensated"
    assert view.step("each[2]").state == "failed"
    undone = sorted(s.name for s in view.steps if s.compensates is not None)
    assert undone == ["undo:each[0]", "undo:each[1]", "undo:first"]
    assert view.step("undo:first").completed_at >= max(view.step(n).completed_at for n in undone)  # last
    for name in ("first", "each[0]", "each[1]"):
        assert called(home, view.step(name).idempotency_key + ":undo", "undo") == 1
    assert called(home, view.step("each[2]").idempotency_key + ":undo", "undo") == 0  # it did nothing
    assert view.step("join").state == "not_started"
    with app.store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts).where(alerts.c.run_id == handle.id)).scalar() == 1


def test_two_hundred_branches_never_more_than_ten_at_once(stack, app):
    start(stack, ("w1", 6), ("w2", 6))
    items = list(range(200))
    view = app.submit("wide", {"items": items, "sleep": 0.02}, business_key="wide-1").wait(120)

    assert view.process_state == "processed"
    assert [r["item"] for r in view.step("each").result] == items
    branches = {s.position for s in view.steps if s.branch_of is not None}
    running, most = 0, 0
    for e in view.events:  # in the order they were written
        if e.position in branches and e.kind == "transition":
            running += (e.to_state == "running") - (e.from_state == "running")
            most = max(most, running)
    assert most == 10  # the bound, and reached: twelve worker slots wait for work
    assert Counter(s.state for s in view.steps if s.branch_of is not None) == {"completed": 200}


def test_a_child_run_s_failure_compensates_the_parent_and_its_success_is_the_step_s_result(stack, app, stack_env):
    start(stack, ("agents", 2))
    home = Path(stack_env["SAS_HOME"])
    ok = app.submit("with_child", {}, business_key="child-ok").wait(30)
    assert ok.process_state == "processed"
    [kid] = app.store.children(ok.id)
    assert kid.process_state == "processed" and ok.step("spawn").result["k"]["step"] == "k"

    failing = app.submit("with_child", {"fail_steps": ["k"]}, business_key="child-fails")
    view = failing.wait(30)
    [kid] = app.store.children(failing.id)
    assert kid.process_state == "error" and kid.parent_run_id == failing.id
    assert view.process_state == "compensated"
    assert f"child run {kid.id} (kid) ended error" in view.step("spawn").error
    assert called(home, view.step("first").idempotency_key + ":undo", "undo") == 1
    assert view.step("last").state == "not_started"


def test_a_two_second_sleep_survives_every_worker_restarted_and_wakes_within_a_sweep(stack, app, stack_env):
    start(stack, ("agents", 2))
    handle = app.submit("napper", {}, business_key="nap-1")
    wait_for(lambda: handle.status().step("nap").state == "pending", 20, "the run to fall asleep")
    for name in ("scheduler", "agents", "beat"):  # nothing of the sleep lives in a process
        stack.restart(name, wait=True)
    back = app.store.now()  # every process is up again (its time may have come meanwhile)

    view = handle.wait(30)
    assert view.process_state == "processed"
    nap, b = view.step("nap"), view.step("b")
    woke = next(e.at for e in view.events if e.position == b.position and e.to_state == "running")
    interval = float(stack_env["SAS_SUPERVISOR_INTERVAL"])
    assert nap.not_before - view.step("a").completed_at == pytest.approx(2.0, abs=0.05)
    # within a sweep of its time, or of the stack's return if that came later
    due = max(nap.not_before, back)
    assert woke >= nap.not_before and woke - due <= interval + 1.0, f"woke {woke - due:.2f} s after it was due"


def test_a_signal_sent_through_the_broker_before_the_run_waits_is_kept_and_consumed(stack, app):
    start(stack, ("agents", 1))
    handle = app.submit("approval", {"sleep": 1}, business_key="early-1")  # `first` takes 1 s
    # a producer with only the broker
    app.celery.send_task("sas.signal", kwargs={"workflow": "approval", "business_key": "early-1",
                                               "event": "approval", "payload": {"approved": True}, "by": "hook"})
    view = handle.wait(30)
    assert view.process_state == "processed"
    assert view.step("approve").result == {"approved": True}
    [signal] = app.store.signals_of(handle.id)
    assert (signal.status, signal.sent_by) == ("consumed", "hook")
    assert signal.received_at < view.step("first").completed_at, "the signal came before the run waited"


def test_a_wait_that_times_out_undoes_the_run_with_every_worker_restarted_meanwhile(stack, app, stack_env):
    start(stack, ("agents", 1))
    handle = app.submit("approval", {}, business_key="late-1")
    wait_for(lambda: handle.status().step("approve").state == "pending", 20, "the run to wait")
    for name in ("scheduler", "agents", "beat"):
        stack.restart(name, wait=True)
    back = app.store.now()  # every process is up again (the wait's time may have come meanwhile)
    view = handle.wait(30)
    assert view.process_state == "compensated"
    approve = view.step("approve")
    assert "no 'approval' signal came within 2 s" in approve.error
    gave_up = next(e.at for e in view.events if e.position == approve.position and e.to_state == "failed")
    interval = float(stack_env["SAS_SUPERVISOR_INTERVAL"])
    assert gave_up >= approve.not_before and gave_up - max(approve.not_before, back) <= interval + 1.0
    assert called(Path(stack_env["SAS_HOME"]), view.step("first").idempotency_key + ":undo", "undo") == 1
    with app.store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(alerts).where(alerts.c.run_id == handle.id)).scalar() == 1


def test_escalation_rungs_happen_in_order_with_their_alerts(stack, app, stack_env):
    start(stack, ("agents", 2))
    handle = app.submit("escalating", {"overrun": {"flaky": 2}}, business_key="esc-1")
    view = handle.wait(60)
    assert view.process_state == "compensated"
    flaky = view.step("flaky")
    with app.store.engine.connect() as conn:
        raised = conn.execute(select(alerts.c.kind, alerts.c.attempt, alerts.c.at)
                              .where(alerts.c.run_id == handle.id).order_by(alerts.c.id)).all()
    assert [(kind, attempt) for kind, attempt, _ in raised] == [("escalated", 1), ("failed", 2)]
    dispatched = {e.attempt: e.at for e in view.events if e.position == flaky.position and e.to_state == "running"}
    escalated = raised[0].at
    assert dispatched[1] < escalated < dispatched[2], "the second attempt only after the escalation"
    interval = float(stack_env["SAS_SUPERVISOR_INTERVAL"])
    assert 2.0 <= dispatched[2] - escalated <= 2.0 + interval + 1.0, "it waited the extended period, then retried"
    assert called(Path(stack_env["SAS_HOME"]), view.step("first").idempotency_key + ":undo", "undo") == 1


def test_twenty_runs_over_three_keys_never_run_two_at_once_for_one_key(stack, app):
    start(stack, ("agents", 4), ("more", 4))
    handles = [app.submit("per_key", {"key": f"k{i % 3}", "sleep": 0.1}, business_key=f"pk-{i}") for i in range(20)]
    views = [h.wait(90) for h in handles]
    assert [v.process_state for v in views] == ["processed"] * 20
    spans: dict[str, list[tuple[float, float]]] = {}
    for v in views:  # from each run's history: when it started, when it ended
        started = next(e.at for e in v.events if e.position is None and e.to_state == "processing")
        ended = next(e.at for e in v.events if e.position is None and e.to_state == "processed")
        spans.setdefault(v.run.slot, []).append((started, ended))
    assert sorted(spans) == ["k0", "k1", "k2"]
    for key, key_spans in spans.items():
        key_spans.sort()
        for (_, ended), (started, _) in itertools.pairwise(key_spans):
            assert started >= ended, f"two runs of key {key} were live at once"
            # the next starts when the one before ends, not when the Supervisor re-asks (2 s here)
            assert started - ended < 1.0, f"key {key}: {started - ended:.2f} s between one run and the next"
    order = {k: [v.run.business_key for v in sorted((v for v in views if v.run.slot == k),
                                                     key=lambda v: v.run.slot_since)] for k in spans}
    assert order["k0"] == [f"pk-{i}" for i in range(0, 20, 3)], "in submission order"


def test_a_new_deployment_leaves_runs_in_flight_on_their_graph_and_fails_a_removed_action(stack, stack_env):
    # This process submits with the definitions of the deployment before: "versioned" had a step
    # "b" after "a", and a step "c" whose action ("work.gone") the workers' code no longer has.
    before = submitter(stack_env)
    work = before.agent("work")
    work.action(lambda call: {}, name="step")
    work.action(lambda call: {}, name="gone")
    before.register(Workflow("versioned", [Step("a", "work.step", timeout=10), Step("b", "work.step", timeout=10)]))
    before.register(Workflow("dropped", [Step("a", "work.step", timeout=10), Step("c", "work.gone", timeout=10)]))
    before.migrate()
    stack.worker("scheduler", "sas.scheduler,sas.supervisor", env=APP, wait=False)
    stack.beat(env=APP, wait=False)
    stack.wait_ready()
    try:
        old = before.submit("versioned", {}, business_key="v-1")  # "a" is dispatched: nobody runs it yet
        dropped = before.submit("dropped", {}, business_key="v-2")
        stack.worker("agents", QUEUE, 2, env=APP)  # the new code comes up

        view = old.wait(30)
        assert view.process_state == "processed"
        assert [s.name for s in view.steps] == ["a", "b"]  # its own graph, not the new "renamed"
        assert view.run.version == before.workflows["versioned"].run_version

        view = dropped.wait(30)
        c = view.step("c")
        assert c.state == "failed" and "'work.gone' is not in the deployed code" in c.error
        assert view.process_state == "error" and "'work.gone'" in view.run.error
        assert before.store.count_events("alert", dropped.id) == 1
    finally:
        before.store.dispose()


def test_a_thread_pool_agent_runs_many_async_steps_at_once_each_thread_on_its_own_loop(stack, app):
    """``async def`` actions on ``-P threads -c 8``: eight 1 s calls run at once in one worker
    process, and each thread keeps its event loop from one step to the next."""
    stack.worker("scheduler", "sas.scheduler,sas.supervisor", env=APP, wait=False)
    stack.worker("agents", QUEUE, 8, pool="threads", env=APP, wait=False)
    stack.beat(env=APP, wait=False)
    stack.wait_ready()
    handles = [app.submit("fetching", {"sleep": 1}, business_key=f"fetch-{i}") for i in range(16)]
    results = [h.wait(60).step("fetch").result for h in handles]

    assert len({r["pid"] for r in results}) == 1  # one worker process
    moments = sorted([(r["started"], 1) for r in results] + [(r["ended"], -1) for r in results])
    at_once = max(itertools.accumulate(step for _, step in moments))
    assert at_once >= 6, f"at most {at_once} of the 1 s calls ran at once on 8 threads: {results}"
    loops = {}
    for r in results:
        loops.setdefault(r["thread"], set()).add(r["loop"])
    assert all(len(found) == 1 for found in loops.values()), loops
    assert len(loops) < len(results)  # threads ran more than one step each, on the same loop
